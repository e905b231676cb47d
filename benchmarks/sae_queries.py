"""SAE-SPLADE's query side: latents weighed by their idf (``pyterrier_lsr.sae_splade.idf_queries``), against the
plain query side and against SPLADE-tiny trained alike (issue #29, item 4).

Reads a finished ``benchmarks/methods_transfer.py --methods splade sae --then`` work folder (its models, indexes and
cache) and measures, on the SAE-SPLADE index:

* ``SAE-SPLADE + q``: the two-sided SAE-SPLADE, then the query-side stage (the work folder's, as it is);
* ``SAE-SPLADE + q, idf``: the same query model with idf latent weights (no training);
* ``SAE-SPLADE, idf + q``: idf latent weights on the two-sided model's queries, then the query-side stage (trained
  here, in ``<workdir>/sae/idf_queries``, same recipe);

and SPLADE-tiny two-sided + query side (the work folder's). Each row has its held-out first-stage nDCG@10 on the
query-side recipe's held-out pseudo-queries (what chooses between the arms; no test topic is used), then test nDCG@10,
AP and postings per query (:func:`pyterrier_lsr.report.report`).

    OMP_NUM_THREADS=1 python benchmarks/sae_queries.py --collection path/to/cisi --workdir runs/methods_cisi \\
        --cache-dir runs/cache/cisi --output benchmarks/results/sae_queries_cisi.json
"""
import argparse
import json
import time
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True, help='irds:<id> or a folder (docs.jsonl, topics, qrels)')
    p.add_argument('--workdir', required=True, help='a methods_transfer.py work folder (splade, sae, --then)')
    p.add_argument('--cache-dir', help='its cache (default: <workdir>/cache)')
    p.add_argument('--set', nargs='*', default=[], metavar='NAME=VALUE', help='query-side DomainConfig overrides')
    p.add_argument('--output', default='benchmarks/results/sae_queries.json')
    p.add_argument('--irds-cache')
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args()
    from pyterrier_lsr.offline import use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(args.threads)
    from pyterrier.measures import AP, nDCG

    from pyterrier_lsr import LsrIndex, load_model
    from pyterrier_lsr.collections import load_collection
    from pyterrier_lsr.report import System, report
    from pyterrier_lsr.sae_splade import idf_queries
    from pyterrier_lsr.systems import adapted
    from pyterrier_lsr.train.domain import DomainConfig, config_from_overrides
    from pyterrier_lsr.train.domain.driver import DomainAdaptation

    collection = load_collection(args.collection)
    work = Path(args.workdir)
    cache = Path(args.cache_dir) if args.cache_dir else work / 'cache'
    config = config_from_overrides(dict(item.split('=', 1) for item in args.set), DomainConfig())
    sae_index, splade_index = LsrIndex(work / 'sae.lsr'), LsrIndex(work / 'splade.lsr')
    df, n = sae_index.document_frequencies(), sae_index.num_docs()
    sae = load_model(work / 'sae' / 'model')
    start = time.time()
    trained = adapted(lambda: idf_queries(sae, df, n), collection.corpus, work / 'sae' / 'idf_queries', config, cache,
                      documents=sae_index)
    seconds = round(time.time() - start, 1)
    plain_q = load_model(work / 'sae' / 'queries' / 'model')
    arms = {  # name -> (model, its index)
        'SAE-SPLADE (two-sided)': (sae, sae_index),
        'SAE-SPLADE + q': (plain_q, sae_index),
        'SAE-SPLADE + q, idf': (idf_queries(plain_q, df, n), sae_index),
        'SAE-SPLADE, idf + q': (trained, sae_index),
        'SPLADE-tiny two-sided + q': (load_model(work / 'splade' / 'queries' / 'model'), splade_index),
    }
    heldout = {}
    for name, (model, index) in arms.items():
        run = DomainAdaptation(model, collection.corpus, work / 'heldout_tmp', config, cache, verbose=False,
                               documents=index)
        run.prepare()
        heldout[name] = run.evaluate(run.model)
        print(name, heldout[name], flush=True)
    systems = [System(name, index.toks_retriever(), str(index.path), model.query_encoder())
               for name, (model, index) in arms.items()]
    table = report(systems, collection.topics, collection.qrels, [nDCG @ 10, AP], work / 'sae_queries_report',
                   title=collection.name, passes=1)
    table['heldout_first_ndcg'] = [heldout[name]['heldout_first_ndcg'] for name in arms]
    columns = ['name', 'heldout_first_ndcg', 'nDCG@10', 'AP', 'postings_per_query', 'query_nnz', 'doc_nnz']
    print(table[[c for c in columns if c in table]].to_string())
    decision = json.loads((work / 'sae' / 'idf_queries' / 'domain_adapt.json').read_text())['decision']
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        'collection': collection.name, 'set': args.set, 'heldout': heldout, 'idf_stage_seconds': seconds,
        'idf_stage_decision': decision, 'table': json.loads(table.to_json(orient='records')),
        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, indent=1))


if __name__ == '__main__':
    main()
