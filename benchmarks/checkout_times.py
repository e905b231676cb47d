"""Per-query CPU times of one engine's retrievers with the code of a given checkout: before / after comparisons of
the code on one machine, robust to the load of a shared machine (CPU time of this process, not wall time).

Two steps. ``queries`` encodes the topics of the collections once (this checkout's code) into a JSON file of
``query_toks``; ``time`` then runs in one process per checkout and index (``--code``: the checkout whose
``pyterrier_lsr`` is imported; each checkout reads the engine files its own code built), and appends one JSON line per
setting and depth to ``--output``: the median and mean CPU ms of one-query calls (after a warm-up call), the CPU ms
per query of one call on all queries, and the top-10 of that call (so that two checkouts' results can be compared).
Alternate the checkouts' runs and compare medians of runs (``compare_runs.py`` reads the engines benchmark's files,
this script's lines are read by ``--summary``)::

    PYTHONPATH=. python benchmarks/checkout_times.py queries --collections irds:vaswani path/to/cisi --output q.json
    python benchmarks/checkout_times.py time --code path/to/checkout --index path/to/index.lsr --queries q.json \\
        --engine bmp --depths 10 100 --settings '[{}, {"alpha": 0.9}]' --label before --output runs.jsonl
    python benchmarks/checkout_times.py summary runs.jsonl --before before --after after
"""
import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict


def encode_queries(args):
    import pandas as pd

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.offline import resolve_model, use_irds_cache
    from pyterrier_lsr.core.storage import write_json
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    model = Splade.from_pretrained(resolve_model(args.model), batch_size=32)
    collections = [load_collection(c) for c in args.collections]
    frame = pd.concat([model.query_encoder()(c.topics) for c in collections], ignore_index=True)
    write_json(args.output, [dict(toks) for toks in frame['query_toks']], indent=None)
    print(f'{len(frame)} queries written to {args.output}')


def cpu_ms(call):
    start = time.process_time()
    out = call()
    return (time.process_time() - start) * 1e3, out


def time_checkout(args):
    sys.path.insert(0, args.code)
    import numpy as np
    import pandas as pd

    from pyterrier_lsr import LsrIndex
    with open(args.queries) as f:
        queries = json.load(f)
    frame = pd.DataFrame({'qid': [str(i) for i in range(len(queries))], 'query_toks': queries})
    index = LsrIndex(args.index)
    with open(args.output, 'a') as out:
        for k in args.depths:
            for params in json.loads(args.settings):
                retriever = index.toks_retriever(k, engine=args.engine, **params)
                retriever(frame.iloc[:1])
                one = [cpu_ms(lambda: retriever(frame.iloc[[i]]))[0] for i in range(len(frame))]
                batch, results = cpu_ms(lambda: retriever(frame))
                top = results.sort_values(['qid', 'rank']).groupby('qid').head(10)
                row = {'label': args.label, 'k': k, 'params': params, 'cpu_ms_median': float(np.median(one)),
                       'cpu_ms_mean': float(np.mean(one)), 'cpu_ms_batch': batch / len(frame),
                       'load': os.getloadavg()[0], 'date': time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
                       'top10': top[['qid', 'docno', 'score']].values.tolist()}
                out.write(json.dumps(row) + '\n')
                print(f"{args.label} k={k} {params}: median {row['cpu_ms_median']:.2f}, mean {row['cpu_ms_mean']:.2f}, "
                      f"batch {row['cpu_ms_batch']:.2f} CPU ms/query (load {row['load']:.2f})", flush=True)


def summary(args):
    from pyterrier_lsr.core.storage import write_json
    runs = defaultdict(list)
    for path in args.runs:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                runs[json.dumps(row['params'], sort_keys=True), row['k'], row['label']].append(row)
    keys = sorted({(params, k) for params, k, _ in runs}, key=lambda key: (key[1], key[0]))
    print('| setting | k | runs | median: before / after (ratio) | mean | batch | same top-10 |')
    print('|---|---:|---|---|---|---|---|')
    report = []
    for params, k in keys:
        before, after = runs[params, k, args.before], runs[params, k, args.after]
        if not before or not after:
            continue
        row = {'params': json.loads(params), 'k': k, 'runs': [len(before), len(after)]}
        cells = []
        for figure in ('cpu_ms_median', 'cpu_ms_mean', 'cpu_ms_batch'):
            b, a = (statistics.median(r[figure] for r in side) for side in (before, after))
            row[figure] = {'before': b, 'after': a, 'after/before': a / b}
            cells.append(f'{b:.2f} / {a:.2f} ({a / b:.2f})')
        # None for runs kept without their top-10 (result files of the repository)
        row['same_top10'] = (all(r['top10'] == before[0]['top10'] for r in before + after)
                             if all('top10' in r for r in before + after) else None)
        report.append(row)
        print(f"| {params} | {k} | {len(before)} / {len(after)} | {' | '.join(cells)} | {row['same_top10']} |")
    if args.output:
        write_json(args.output, report)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest='step', required=True)
    q = steps.add_parser('queries', help='encode the topics into a query_toks file')
    q.add_argument('--collections', nargs='+', default=['irds:vaswani'])
    q.add_argument('--model', default='splade-tiny')
    q.add_argument('--irds-cache')
    q.add_argument('--output', required=True)
    t = steps.add_parser('time', help="time one checkout's retrievers on one index")
    t.add_argument('--code', required=True, help='the checkout whose pyterrier_lsr is timed')
    t.add_argument('--index', required=True)
    t.add_argument('--queries', required=True)
    t.add_argument('--engine', default='bmp')
    t.add_argument('--depths', nargs='+', type=int, default=[10])
    t.add_argument('--settings', default='[{}]', help='a JSON list of retriever parameters')
    t.add_argument('--label', required=True)
    t.add_argument('--output', required=True, help='JSON lines, appended')
    s = steps.add_parser('summary', help='after / before medians of the runs')
    s.add_argument('runs', nargs='+')
    s.add_argument('--before', default='before')
    s.add_argument('--after', default='after')
    s.add_argument('--output')
    args = parser.parse_args()
    {'queries': encode_queries, 'time': time_checkout, 'summary': summary}[args.step](args)


if __name__ == '__main__':
    main()
