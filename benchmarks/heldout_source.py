"""A teacher-independent held-out yardstick for finished ``train.domain_adapt`` runs (query side).

The selection signals a run logs (``heldout_*``) judge the student against its own teacher: the ``*_ndcg`` ones
against the teacher's order, and even ``heldout_first_mrr`` ranks a sub-corpus made of that teacher's held-out pools,
so runs with different teachers do not compare on them. This script scores each run's *selected* model and its
starting model on the run's held-out pseudo-queries (which depend only on the corpus and the seed, not on the
teacher) by the reciprocal rank of each query's source document when it retrieves from the **whole corpus** through
the run's start index (PISA, top ``--depth``). 60 queries are few, so ``--extra`` more held-out pseudo-queries (mixed
styles, as the run's) come from documents that build_data gave neither to a training query nor to a held-out one, drawn
with the run's seed: the same for every teacher of a seed; ``all`` scores both sets together. No test topic is
read.

    OMP_NUM_THREADS=1 python benchmarks/heldout_source.py --collection path/to/cisi \\
        --runs path/to/runs/cisi/qside_s0 path/to/runs/cisi/bdl_s0 --cache-dir path/to/cache/cisi \\
        --output benchmarks/results/domain_teacher_latent_heldout_cisi.json
"""
import argparse
import json
import math
import random
import time
from pathlib import Path


def source_mrr(retriever, heldout: list[dict], depth: int) -> dict[str, float]:
    """Mean reciprocal rank (0 beyond ``depth``) and success@10 of each held-out query's source document."""
    import pandas as pd
    frame = pd.DataFrame({'qid': [str(i) for i in range(len(heldout))], 'query': [h['query'] for h in heldout]})
    res = retriever(frame)
    rr, hit10 = [], []
    for i, h in enumerate(heldout):
        ranked = res[res['qid'] == str(i)].sort_values('rank')['docno'].tolist()[:depth]
        rank = ranked.index(h['pos']) + 1 if h['pos'] in ranked else None
        rr.append(0. if rank is None else 1. / rank)
        hit10.append(rank is not None and rank <= 10)
    return {'source_mrr': sum(rr) / len(rr), 'source_success10': sum(hit10) / len(hit10)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True, help='irds: id or folder (e.g. path/to/cisi)')
    p.add_argument('--runs', nargs='+', required=True, help="run folders of benchmarks/domain_adaptation.py "
                   '(each holding domain_adapt.json and model/; the start index is the one beside them)')
    p.add_argument('--cache-dir', required=True, help="the runs' --cache-dir/<collection> (their cached data)")
    p.add_argument('--model', default='splade-tiny', help='the starting model of the runs')
    p.add_argument('--depth', type=int, default=1000)
    p.add_argument('--extra', type=int, default=500, help='more held-out pseudo-queries from unused documents')
    p.add_argument('--irds-cache')
    p.add_argument('--output', required=True)
    args = p.parse_args()
    from pyterrier_lsr.core.offline import use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(1)
    from pyterrier_lsr import LsrIndex, load_model
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.encoding import is_blank
    from pyterrier_lsr.core.storage import read_json, write_json
    from pyterrier_lsr.train import DomainConfig
    from pyterrier_lsr.train.domain.cache import build_data
    from pyterrier_lsr.train.domain.config import logged_config
    from pyterrier_lsr.train.domain.queries import document_frequencies, make_queries

    collection = load_collection(args.collection)
    docs = {str(d['docno']): d['text'] for d in collection.corpus if not is_blank(d.get('text'))}
    start = load_model(args.model)
    df = document_frequencies(docs.values())
    output = Path(args.output)
    results = read_json(output, 'the yardstick results') if output.exists() else {'runs': []}
    for folder in map(Path, args.runs):
        log = read_json(folder / 'domain_adapt.json', 'the run log')
        config = DomainConfig(**logged_config(log['config']))
        data, hit = build_data(docs, Path(args.cache_dir), config, verbose=False)
        if not hit:
            raise SystemExit(f'{folder}: its held-out data is not in --cache-dir {args.cache_dir}')
        # the documents build_data gave to held-out and training queries (its seeded shuffle), whatever the teacher:
        # the examples it kept depend on the teacher (those with too few candidates are dropped), so they cannot say
        order = list(docs)
        random.Random(config.seed).shuffle(order)
        unused = sorted(order[config.heldout + math.ceil(config.steps * config.batch_size / config.per_doc):])
        assert not {e['pos'] for e in data['examples']} & set(unused)
        rng = random.Random(config.seed + 3)
        extra = make_queries(docs, rng.sample(unused, min(args.extra, len(unused))), 'mixed', 1, rng, df)
        sets = {'heldout': data['heldout'], 'extra': extra, 'all': data['heldout'] + extra}
        index = LsrIndex(folder.parent / f'start-{Path(args.model).name}-model.lsr')
        begin = time.time()
        row = {'collection': collection.name, 'arm': folder.name, 'seed': config.seed,
               'teachers': list(config.teachers), 'selected_step': log['selected_step'], 'guard': log['guard'],
               'queries': {k: len(v) for k, v in sets.items()}}
        for name, model in (('start', start), ('selected', load_model(str(folder / 'model')))):
            retriever = index.retriever(num_results=args.depth, query_encoder=model.query_encoder())
            for kind, queries in sets.items():
                row.update({f'{kind}_{name}_{k}': v for k, v in source_mrr(retriever, queries, args.depth).items()})
        row['seconds'] = round(time.time() - begin, 1)
        print(json.dumps(row), flush=True)
        results['runs'] = [r for r in results['runs'] if (r['collection'], r['arm']) != (row['collection'], row['arm'])]
        results['runs'].append(row)
        write_json(output, results)
    print('| collection | arm | teachers | queries | source MRR start → selected | success@10 start → selected |')
    print('|---|---|---|---|---|---|')
    for r in results['runs']:
        for kind, n in r['queries'].items():
            print(f"| {r['collection']} | {r['arm']} | {'+'.join(r['teachers'])} | {kind} ({n}) | "
                  f"{r[f'{kind}_start_source_mrr']:.4f} → {r[f'{kind}_selected_source_mrr']:.4f} | "
                  f"{r[f'{kind}_start_source_success10']:.3f} → {r[f'{kind}_selected_source_success10']:.3f} |")


if __name__ == '__main__':
    main()
