"""int8 vs fp32 CPU encoding: document-encoding speed and retrieval effectiveness, in one run.

    IR_DATASETS_HOME=... python benchmarks/int8.py --cisi path/to/cisi

Measured (``precision='int8'`` is :mod:`pyterrier_lsr.models.int8`; the model defaults to the offline ``splade-tiny``;
``--precisions fp32 int8 bf16`` adds bf16 autocast, every pair of document and query precisions in one experiment):

* speed: docs/s of ``encode_docs`` on the first ``--speed-docs`` Vaswani documents, the precisions alternating for
  ``--rounds`` rounds in this one process at ``--threads`` threads (default 1); the best round of each is reported
  (on a shared machine slower rounds measure the neighbours), with every round and the load average before and
  after. The full-corpus indexing time of each precision is reported too.
* latency: milliseconds per ``encode_queries`` call of one query (the first ``--latency-queries`` Vaswani topics,
  timed only), median of each round, the precisions alternating, best round reported.
* effectiveness (unless ``--speed-only``): nDCG@10 on Vaswani (``--vaswani``, an ``irds:`` id) and CISI
  (``--cisi``, a folder of ``docs.jsonl``, ``topics.tsv``, ``qrels.txt``) of an index of fp32 documents searched
  with fp32 queries and of int8 documents searched with int8 queries (the two mixed pairs are reported too), PISA
  exact retrieval, with each pair's topics better / worse than fp32's and the p-value of a paired t-test.

Prints a table and writes JSON (``--output``).
"""
import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def cpu_info() -> dict:
    model, flags = platform.processor(), set()
    try:
        fields = dict(line.split(':', 1) for line in Path('/proc/cpuinfo').read_text().split('\n\n')[0].splitlines()
                      if ':' in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        model, flags = fields.get('model name', model), set(fields.get('flags', '').split())
    except OSError:  # not Linux
        pass
    return {'model': model, 'cores': os.cpu_count(),
            **{flag: flag in flags for flag in ('avx2', 'avx512f', 'avx512_vnni', 'avx_vnni', 'avx512_bf16',
                                                'amx_int8')}}


def speed(models: dict, texts: list, rounds: int) -> dict:
    times = {p: [] for p in models}
    for p, model in models.items():  # warm-up: first-call allocations and kernel selection
        model.encode_docs(texts[:64])
    for _ in range(rounds):
        for p, model in models.items():
            start = time.perf_counter()
            model.encode_docs(texts)
            times[p].append(time.perf_counter() - start)
    return {p: {'rounds_s': t, 'docs_per_s': len(texts) / min(t)} for p, t in times.items()}


def latency(models: dict, queries: list, rounds: int) -> dict:
    times = {p: [] for p in models}
    for _ in range(rounds):
        for p, model in models.items():
            calls = []
            for query in queries:
                start = time.perf_counter()
                model.encode_queries([query])
                calls.append(time.perf_counter() - start)
            times[p].append(1000 * statistics.median(calls))
    return {p: {'rounds_median_ms': t, 'median_ms': min(t)} for p, t in times.items()}


def effectiveness(name: str, collection, models: dict, workdir: Path) -> dict:
    """nDCG@10 of every pair of document and query precisions, and each precision's indexing docs/s."""
    import pyterrier as pt
    from pyterrier.measures import nDCG

    from pyterrier_lsr import LsrIndex, SpladeIndexer

    indexes, index_s = {}, {}
    for p, model in models.items():
        path = workdir / f'{name}.{p}.lsr'
        start = time.perf_counter()
        SpladeIndexer(str(path), model).index(collection.corpus)
        index_s[p] = time.perf_counter() - start
        indexes[p] = path
    runs = {f'docs {d} / queries {q}': LsrIndex(str(indexes[d]), models[q]).retriever()
            for d in models for q in models}
    # the first run (fp32 documents and queries) is the baseline of a paired t-test over the topics
    table = pt.Experiment(list(runs.values()), collection.topics, collection.qrels, [nDCG @ 10], names=list(runs),
                          baseline=0)
    ndcg = dict(zip(table['name'], table['nDCG@10']))
    # undefined (the baseline itself, or no topic differs) is null, not NaN: the result file stays valid JSON
    paired = {name: {k: None if math.isnan(v) else v for k, v in zip(('better', 'worse', 'p'), values)}
              for name, *values in zip(table['name'], table['nDCG@10 +'], table['nDCG@10 -'],
                                       table['nDCG@10 p-value'])}
    return {'docs': len(collection.corpus), 'topics': len(collection.topics), 'index_s': index_s,
            'index_docs_per_s': {p: len(collection.corpus) / s for p, s in index_s.items()}, 'ndcg@10': ndcg,
            'vs_fp32': {p: ndcg[f'docs {p} / queries {p}'] / ndcg['docs fp32 / queries fp32'] for p in models},
            'topics_vs_fp32': paired}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='splade-tiny', help='a model name or folder (default: splade-tiny)')
    parser.add_argument('--vaswani', default='irds:vaswani', help='the irds: id of the first collection')
    parser.add_argument('--cisi', default='cisi', help='the CISI folder (docs.jsonl, topics.tsv, qrels.txt)')
    parser.add_argument('--docs', type=int, default=None, help='a corpus subset per collection (default: all)')
    parser.add_argument('--speed-docs', type=int, default=1000)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--latency-queries', type=int, default=50)
    parser.add_argument('--speed-only', action='store_true', help='speed and latency, no indexes')
    parser.add_argument('--collections', nargs='+', choices=['vaswani', 'cisi'], default=['vaswani', 'cisi'])
    parser.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--workdir', default=None, help='where the indexes go (default: a temporary folder)')
    parser.add_argument('--precisions', nargs='+', choices=['fp32', 'int8', 'bf16'], default=['fp32', 'int8'],
                        help='fp32 is always measured: the others are compared with it')
    parser.add_argument('--output', default='benchmarks/results/int8.json')
    args = parser.parse_args(argv)
    precisions = ['fp32'] + [p for p in dict.fromkeys(args.precisions) if p != 'fp32']

    import torch
    torch.set_num_threads(args.threads)
    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.storage import write_json

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    models = {p: Splade.from_pretrained(args.model, device='cpu', precision=p, batch_size=args.batch_size)
              for p in precisions}
    vaswani = load_collection(args.vaswani).subset(args.docs)
    texts = [d['text'] for d in vaswani.corpus[:args.speed_docs]]
    result = {'command': ' '.join([Path(sys.executable).name] + sys.argv), 'started': started.isoformat(),
              'cpu': cpu_info(), 'torch': torch.__version__, 'quantized_engine': torch.backends.quantized.engine,
              'threads': args.threads, 'model': args.model, 'batch_size': args.batch_size,
              'loadavg_before': load_before}
    result['speed'] = speed(models, texts, args.rounds)
    result['speed']['vs_fp32'] = {p: result['speed'][p]['docs_per_s'] / result['speed']['fp32']['docs_per_s']
                                  for p in precisions}
    result['speed']['docs'] = len(texts)
    queries = list(vaswani.topics['query'][:args.latency_queries])
    result['latency'] = latency(models, queries, args.rounds)
    result['loadavg_after_speed'] = os.getloadavg()
    result['effectiveness'] = {}
    if not args.speed_only:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(args.workdir or tmp)
            collections = [('vaswani', vaswani), ('cisi', load_collection(args.cisi).subset(args.docs))]
            collections = [(name, c) for name, c in collections if name in args.collections]
            result['effectiveness'] = {name: effectiveness(name, collection, models, workdir)
                                       for name, collection in collections}
    result['loadavg_after'] = os.getloadavg()
    result['seconds'] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    write_json(args.output, result)

    s, others = result['speed'], precisions[1:]
    print(f"{result['cpu']['model']}, torch {result['torch']} ({result['quantized_engine']}), "
          f"{args.threads} thread(s), "
          f"load {load_before[0]:.1f} -> {result['loadavg_after'][0]:.1f}")
    print(f"{'':28s}" + ''.join(f'{p:>10s}' for p in precisions) + ''.join(f'{p + "/fp32":>11s}' for p in others))
    print(f"{f'docs/s (best of {args.rounds})':28s}" + ''.join(f"{s[p]['docs_per_s']:10.1f}" for p in precisions)
          + ''.join(f"{s['vs_fp32'][p]:11.2f}" for p in others))
    lat = result['latency']
    print(f"{'ms per one-query call':28s}" + ''.join(f"{lat[p]['median_ms']:10.2f}" for p in precisions))
    for name, e in result['effectiveness'].items():
        n, docs_s = e['ndcg@10'], e['index_docs_per_s']
        print(f"{name + ' nDCG@10':28s}" + ''.join(f"{n[f'docs {p} / queries {p}']:10.4f}" for p in precisions)
              + ''.join(f"{e['vs_fp32'][p]:11.4f}" for p in others))
        print(f"{name + ' index docs/s':28s}" + ''.join(f'{docs_s[p]:10.1f}' for p in precisions)
              + ''.join(f"{docs_s[p] / docs_s['fp32']:11.2f}" for p in others))
        for p in others:
            print(f"{name + ' mixed nDCG@10':28s}  {p} docs/fp32 queries {n[f'docs {p} / queries fp32']:.4f}, "
                  f"fp32 docs/{p} queries {n[f'docs fp32 / queries {p}']:.4f}")
    print(f'wrote {args.output}')


if __name__ == '__main__':
    main()
