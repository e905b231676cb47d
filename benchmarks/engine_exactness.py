"""Exact-mode BMP and Seismic against PISA on real collections: the same top-k, query by query.

    PYTHONPATH=. python benchmarks/engine_exactness.py --collections irds:vaswani path/to/cisi

Each collection is encoded once by the offline SPLADE-tiny into one LsrIndex (kept under ``--workdir`` and reused);
BMP and Seismic are rebuilt from its vectors on every run, so they are the current code's.  For every topic, the top
``--depth`` of exact BMP (``alpha = beta = 1``) and of Seismic's exact mode must equal PISA's: the same scores at every
rank, and the same documents at every score (a tie at the cut may keep other documents of that score).  Reported per
collection and engine: the number of queries, of agreeing queries, the first disagreements (if any), and ms/query.
Writes benchmarks/results/engine_exactness.json; the exit status is 1 when any query disagrees.
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path

EXACT = {'bmp': {}, 'seismic': {'exact': True}}


def top_lists(results, depth):
    """``{qid: [(docno, score), ...]}`` best first."""
    results = results.sort_values(['qid', 'rank'])
    return {qid: list(zip(g.docno, g.score))[:depth] for qid, g in results.groupby('qid', sort=False)}


def disagreement(got, expected):
    """None when ``got`` equals ``expected`` up to the order of equal scores, else a short description."""
    scores, expected_scores = [s for _, s in got], [s for _, s in expected]
    if scores != expected_scores:
        return {'scores': scores, 'pisa_scores': expected_scores}
    last = expected_scores[-1] if expected_scores else None
    by_score = sorted((s, d) for d, s in got if s != last), sorted((s, d) for d, s in expected if s != last)
    if by_score[0] == by_score[1]:
        return None
    return {'docnos': [d for d, _ in got], 'pisa_docnos': [d for d, _ in expected]}


def check(index, toks, depth):
    rows = []
    pisa = top_lists(index.toks_retriever(num_results=depth)(toks), depth)
    for engine, params in EXACT.items():
        retriever = index.toks_retriever(num_results=depth, engine=engine, **params)
        start = time.perf_counter()
        results = retriever(toks)
        seconds = time.perf_counter() - start
        got = top_lists(results, depth)
        bad = {qid: d for qid in toks.qid
               if (d := disagreement(got.get(qid, []), pisa.get(qid, []))) is not None}
        rows.append({'engine': engine, 'params': params, 'queries': int(len(toks)),
                     'agreeing': int(len(toks) - len(bad)), 'first_disagreements': dict(list(bad.items())[:5]),
                     'ms_per_query': round(1000 * seconds / len(toks), 3)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--collections', nargs='+', required=True,
                        help='irds: ids or collection folders (docs.jsonl, topics.tsv, qrels.txt)')
    parser.add_argument('--depth', type=int, default=10)
    parser.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    parser.add_argument('--workdir', default='lsr-exactness')
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'engine_exactness.json'))
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.threads)

    from pyterrier_lsr import LsrIndex, Splade, SpladeIndexer
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.names import resolve_model
    from pyterrier_lsr.core.offline import use_irds_cache
    from pyterrier_lsr.core.storage import write_json
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = Splade.from_pretrained(resolve_model(args.model), batch_size=32)
    report = {'command': 'python benchmarks/engine_exactness.py ' + ' '.join(sys.argv[1:]),
              'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'load_average': os.getloadavg(),
              'machine': platform.processor() or platform.machine(), 'depth': args.depth, 'collections': {}}
    for spec in args.collections:
        collection = load_collection(spec)
        path = workdir / f'{collection.name}.lsr'
        index = LsrIndex(path, model) if LsrIndex(path).built() else SpladeIndexer(
            path, model, overwrite=True).index(collection.corpus)
        for engine in EXACT:
            index.build_engine(engine, overwrite=True)
        toks = model.query_encoder()(collection.topics)
        rows = check(index, toks, args.depth)
        report['collections'][collection.name] = {'docs': index.num_docs(), 'engines': rows,
                                                  'bmp_settings': index.meta['engines']['bmp'],
                                                  'seismic_settings': index.meta['engines']['seismic']}
        for row in rows:
            print(collection.name, row['engine'], f"{row['agreeing']}/{row['queries']} queries agree",
                  f"{row['ms_per_query']} ms/query", flush=True)
    write_json(args.output, report)
    agree = all(r['agreeing'] == r['queries'] for c in report['collections'].values() for r in c['engines'])
    sys.exit(0 if agree else 1)


if __name__ == '__main__':
    main()
