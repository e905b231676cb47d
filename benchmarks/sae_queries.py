"""SAE-SPLADE's query side: latents weighed by their idf (``pyterrier_lsr.kinds.sae_splade.idf_weighted_queries``),
against the plain query side and against SPLADE-tiny trained alike.

Builds (or reuses, from an earlier run in the same ``--workdir``) SPLADE-tiny and SAE-SPLADE (stage 1
``systems.SAE_SPLADE``), each trained two-sided with the same recipe, data and budget (``DomainConfig.two_sided()``),
indexed, then given the query-side stage (``DomainConfig()``, documents from its index), and measures on the SAE-SPLADE
index:

* ``SAE-SPLADE + q``: the two-sided SAE-SPLADE, then the query-side stage;
* ``SAE-SPLADE + q, idf``: the same query model with idf latent weights (no training);
* ``SAE-SPLADE, idf + q``: idf latent weights on the two-sided model's queries, then the query-side stage
  (``<workdir>/sae/idf_queries``);

and SPLADE-tiny two-sided + query side on its own index. Each row has its held-out first-stage nDCG@10 on the
query-side recipe's held-out pseudo-queries (what chooses between the arms; no test topic is used), then test nDCG@10,
AP and postings per query (:func:`pyterrier_lsr.report.report`). ``--query-stages none`` stops before the query-side
stages: SPLADE-tiny and SAE-SPLADE two-sided, and SAE-SPLADE two-sided with idf queries, judged on the two-sided
recipe's held-out pseudo-queries. ``--sae-latents`` sets stage 1's width (a smaller SAE for a small
corpus); ``--without-splade`` builds and measures the SAE-SPLADE arms only (SPLADE-tiny's figures are then those
recorded from a run with it: the build is seeded). ``--sae-k`` sets stage 1's latents per token state,
``--sae-seed`` its seed; ``--sae-extra-collection`` adds another collection's token states to stage 1's sample
(``--sae-train-vectors`` of them, drawn from the union), the corpus alone still training stage 2 and filling the
index.

    OMP_NUM_THREADS=1 python benchmarks/sae_queries.py --collection path/to/cisi --workdir runs/sae_cisi \\
        --cache-dir runs/cache/cisi --output benchmarks/results/sae_queries_cisi.json
"""
import argparse
import json
import time
from dataclasses import replace
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True, help='irds:<id> or a folder (docs.jsonl, topics, qrels)')
    p.add_argument('--workdir', required=True, help='models and indexes (reused by a second run)')
    p.add_argument('--cache-dir', help='its cache (default: <workdir>/cache)')
    p.add_argument('--set', nargs='*', default=[], metavar='NAME=VALUE', help='query-side DomainConfig overrides')
    p.add_argument('--sae-epochs', type=int, default=None,
                   help='epochs of the stage-1 SAE (default: systems.SAE_SPLADE\'s)')
    p.add_argument('--sae-latents', type=int, default=None,
                   help='latents of the stage-1 SAE (default: systems.SAE_SPLADE\'s)')
    p.add_argument('--sae-k', type=int, default=None,
                   help='latents per token state of the stage-1 SAE (TopK k; default: systems.SAE_SPLADE\'s)')
    p.add_argument('--sae-seed', type=int, default=None,
                   help='seed of the stage-1 SAE: its initialisation and sample (default: SAEConfig\'s)')
    p.add_argument('--sae-extra-collection', nargs='+', default=[], metavar='COLLECTION',
                   help='collections (irds:<id> or folders) whose token states join the corpus\'s in stage 1\'s '
                        'sample only (sae_splade\'s stage1_extra)')
    p.add_argument('--sae-train-vectors', type=int, default=None,
                   help='token states in stage 1\'s seeded sample (sae_splade\'s max_train_vectors; default: '
                        'systems.SAE_SPLADE_STATES)')
    p.add_argument('--without-splade', action='store_true',
                   help='neither build nor measure SPLADE-tiny (the SAE-SPLADE arms only)')
    p.add_argument('--build', choices=['splade', 'sae'],
                   help='only build (or reuse) this method\'s models and index, then stop: the two builds can run in '
                        'two processes before the measuring run')
    p.add_argument('--query-stages', choices=['all', 'sae', 'none'], default='all',
                   help='which models get the query-side stage: all, SAE-SPLADE\'s only, or none (the two-sided '
                        'models, and SAE-SPLADE\'s with idf queries, no training)')
    p.add_argument('--output', default='benchmarks/results/sae_queries.json')
    p.add_argument('--irds-cache')
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args()
    if args.without_splade and args.build == 'splade':
        p.error('--without-splade contradicts --build splade')
    from pyterrier_lsr.core.offline import use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(args.threads)
    from pyterrier.measures import AP, nDCG

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.names import resolve_model
    from pyterrier_lsr.core.storage import write_json
    from pyterrier_lsr.kinds.sae_splade import idf_weighted_queries
    from pyterrier_lsr.report import System, report
    from pyterrier_lsr.systems import SAE_SPLADE, SAE_SPLADE_STATES, adapted, sae_splade, sparse_index
    from pyterrier_lsr.train.domain import DomainConfig, config_from_overrides
    from pyterrier_lsr.train.domain.driver import DomainAdaptation

    collection = load_collection(args.collection)
    work = Path(args.workdir)
    cache = Path(args.cache_dir) if args.cache_dir else work / 'cache'
    config = config_from_overrides(dict(item.split('=', 1) for item in args.set), DomainConfig())
    corpus, two_sided, base = collection.corpus, DomainConfig.two_sided(seed=config.seed), resolve_model('splade-tiny')
    seconds = {}

    def timed(name, build):
        start = time.time()
        result = build()
        seconds[name] = round(time.time() - start, 1)
        print(f'{name}: {seconds[name]} s', flush=True)
        return result

    if args.build != 'sae' and not args.without_splade:
        splade = timed('splade', lambda: adapted(lambda: Splade.from_pretrained(base), corpus, work / 'splade',
                                                 two_sided, cache))
        splade_index = timed('splade.lsr', lambda: sparse_index(work / 'splade.lsr', splade, corpus))
        if args.query_stages == 'all':
            splade_q = timed('splade + q', lambda: adapted(lambda: splade, corpus, work / 'splade' / 'queries',
                                                           config, cache, documents=splade_index))
    if args.build == 'splade':
        return
    given = {'epochs': args.sae_epochs, 'n_latents': args.sae_latents, 'k': args.sae_k, 'seed': args.sae_seed}
    stage1 = {**SAE_SPLADE, **{name: value for name, value in given.items() if value is not None}}
    extra = [doc for name in args.sae_extra_collection for doc in load_collection(name).corpus]
    states = SAE_SPLADE_STATES if args.sae_train_vectors is None else args.sae_train_vectors
    sae = timed('sae', lambda: sae_splade(corpus, work / 'sae', two_sided, base, stage1, states,
                                          cache_dir=cache, stage1_extra=extra))
    sae_index = timed('sae.lsr', lambda: sparse_index(work / 'sae.lsr', sae, corpus))
    df, n = sae_index.document_frequencies(), sae_index.num_docs()
    if args.query_stages != 'none':
        sae_q = timed('sae + q', lambda: adapted(lambda: sae, corpus, work / 'sae' / 'queries', config, cache,
                                                 documents=sae_index))
        sae_idf_q = timed('sae, idf + q', lambda: adapted(lambda: idf_weighted_queries(sae, df, n), corpus,
                                                          work / 'sae' / 'idf_queries', config, cache,
                                                          documents=sae_index))
    if args.build == 'sae':
        return
    arms = {} if args.without_splade else {'SPLADE-tiny two-sided': (splade, splade_index)}  # name -> (model, index)
    arms.update({
        'SAE-SPLADE two-sided': (sae, sae_index),
        'SAE-SPLADE two-sided, idf': (idf_weighted_queries(sae, df, n), sae_index),
    })
    if args.query_stages == 'all' and not args.without_splade:
        arms['SPLADE-tiny two-sided + q'] = (splade_q, splade_index)
    if args.query_stages != 'none':
        arms.update({
            'SAE-SPLADE + q': (sae_q, sae_index),
            'SAE-SPLADE + q, idf': (idf_weighted_queries(sae_q, df, n), sae_index),
            'SAE-SPLADE, idf + q': (sae_idf_q, sae_index),
        })
    # the held-out pseudo-queries of the last stage run (the two-sided recipe's data, read as a query-side config)
    judge = replace(two_sided, side='query') if args.query_stages == 'none' else config
    heldout = {}
    for name, (model, index) in arms.items():
        run = DomainAdaptation(model, collection.corpus, work / 'heldout_tmp', judge, cache, verbose=False,
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
    decisions = {str(log.parent.relative_to(work)): json.loads(log.read_text())['decision']
                 for log in sorted(work.glob('**/domain_adapt.json'))}
    write_json(args.output, {
        'collection': collection.name, 'set': args.set, 'query_stages': args.query_stages, 'stage1': stage1,
        'stage1_extra': args.sae_extra_collection, 'stage1_train_vectors': states,
        # latents that some document of the index uses (the rest died in stage 1 or never fire on this corpus)
        'latents_in_index': sum(1 for count in df.values() if count > 0),
        'heldout': heldout, 'seconds': seconds,
        'decisions': decisions, 'table': json.loads(table.to_json(orient='records')),
        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})


if __name__ == '__main__':
    main()
