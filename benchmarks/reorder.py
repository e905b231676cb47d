"""BMP on documents reordered by recursive graph bisection against BMP in the given order and PISA's exact algorithms,
on the same encoded real collections.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/reorder.py --irds-cache PATH --collections irds:vaswani \
        path/to/cisi --workdir path/to/work

Each collection is encoded once by the offline SPLADE-tiny into an LsrIndex (kept in ``--workdir``) with BMP built
twice, into two indexes sharing the vectors (``reorder=False`` and ``reorder=True``). Measured in one process,
interleaved (plain, reordered, PISA, repeated ``--rounds`` times; the median round kept): ms/query of one-query calls
of exact BMP and of PISA's exact algorithms, the build time of each BMP, and whether both BMPs return PISA's scores.
For the 1M-document synthetic corpus, see ``benchmarks/engines.py --bmp-reorder``. Prints a table and writes
benchmarks/results/reorder.json.
"""
import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pyterrier_lsr.core.collection import load_collection
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import use_irds_cache
from pyterrier_lsr.core.storage import write_json

PISA_ALGORITHMS = ('maxscore', 'block_max_wand', 'block_max_maxscore')


def indexes(name, collection, model, workdir):
    """``(plain, reordered)``: the collection's index with BMP in the given order, and a copy reordered."""
    from pyterrier_lsr import LsrIndex, SpladeIndexer
    plain = LsrIndex(workdir / f'{name}.lsr', model)
    if not plain.built():
        SpladeIndexer(plain.path, model, engines=('pisa', 'bmp'), overwrite=True).index(collection.corpus)
    reordered = LsrIndex(workdir / f'{name}.reordered.lsr', model)
    if not reordered.built():
        reordered.index({'docno': d, 'toks': v} for d, v in plain.vectors())
    if not reordered.meta['engines'].get('bmp', {}).get('reorder'):
        reordered.build_engine('bmp', overwrite=True, reorder=True)
    return plain, reordered


def ms_per_query(retriever, frames):
    start = time.perf_counter()
    for frame in frames:
        retriever(frame)
    return (time.perf_counter() - start) * 1e3 / len(frames)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--collections', nargs='+', default=['irds:vaswani'],
                        help='irds: ids or folders of docs.jsonl, topics.tsv and qrels.txt (e.g. path/to/cisi)')
    parser.add_argument('--depths', nargs='+', type=int, default=[10, 1000])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--workdir', default='lsr-reorder-work')
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'reorder.json'))
    args = parser.parse_args()
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(1)
    from pyterrier_lsr import Splade
    model = Splade.from_pretrained(resolve_model(args.model), batch_size=32)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for spec in args.collections:
        collection = load_collection(spec)
        plain, reordered = indexes(collection.name, collection, model, workdir)
        queries = model.query_encoder()(collection.topics)
        frames = [queries.iloc[[i]] for i in range(len(queries))]
        for k in args.depths:
            systems = {'BMP exact': plain.toks_retriever(k, engine='bmp'),
                       'BMP exact, reordered': reordered.toks_retriever(k, engine='bmp'),
                       **{f'PISA {a}': plain.toks_retriever(k, query_algorithm=a) for a in PISA_ALGORITHMS}}
            results = {label: retriever(queries) for label, retriever in systems.items()}  # also the warm-up
            pisa = results['PISA maxscore'].score.to_numpy(np.float64)
            same = {label: bool(np.array_equal(got.score.to_numpy(np.float64), pisa)) for label, got in results.items()}
            times = {label: [] for label in systems}
            for _ in range(args.rounds):
                for label, retriever in systems.items():
                    times[label].append(ms_per_query(retriever, frames))
            for label, values in times.items():
                engine = reordered if 'reordered' in label else plain
                rows.append({'collection': collection.name, 'system': label, 'k': k,
                             'ms_per_query': statistics.median(values), 'rounds_ms': values,
                             'scores_equal_pisa': same[label], 'load': os.getloadavg()[0],
                             'bmp_build_s': engine.meta['engines']['bmp']['build_seconds'] if 'BMP' in label
                             else None})
    for row in rows:
        reference = min(r['ms_per_query'] for r in rows if r['collection'] == row['collection'] and
                        r['k'] == row['k'] and r['system'].startswith('PISA'))
        row['speedup_vs_best_pisa'] = reference / row['ms_per_query']
        print(f"{row['collection']:>10} k={row['k']:<5} {row['system']:<24} {row['ms_per_query']:8.2f} ms "
              f"{row['speedup_vs_best_pisa']:5.2f}x best PISA  scores equal PISA: {row['scores_equal_pisa']}")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, {'command': 'python benchmarks/reorder.py ' + ' '.join(sys.argv[1:]),
                        'machine': platform.processor() or platform.machine(),
                        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'rows': rows})


if __name__ == '__main__':
    main()
