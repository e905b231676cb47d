"""Before/after ratios of repeated benchmark runs: did a change slow anything down?

    python benchmarks/compare_runs.py engines --before old_*.json --after new_*.json --output ratios.json
    python benchmarks/compare_runs.py encode --before old_*.json --after new_*.json

Each side is several runs of the same script (``benchmarks/engines.py`` or ``benchmarks/encode.py``, possibly at two
commits), alternated by the caller so that the machine's load falls on both alike. Per setting (engines: the
synthetic rows' ``setting`` at each ``k``; encode: each precision and batch size), the median of each side's runs and
after / before: for engines the one-query and batch ms/query (below 1: faster after), for encode docs per CPU-second
(above 1: faster after). Only settings present on both sides are compared. Prints a table and writes JSON.
"""
import argparse
import json
import statistics
from pathlib import Path

# the figures compared, and whether a higher value is better
FIGURES = {'engines': {'ms_median': False, 'ms_batch': False}, 'encode': {'docs_per_cpu_s': True}}


def engine_rows(path, default_k):
    """``{(setting, k): row}`` of one engines.py result file; ``default_k`` for rows that do not record their ``k``
    (written before engines.py kept it)."""
    report = json.loads(Path(path).read_text())
    return {(row['setting'], row.get('k', default_k)): row for row in report['synthetic_rows']}


def encode_rows(path):
    report = json.loads(Path(path).read_text())
    return {(f"{row['impl']} {row['precision']}", row['batch_size']): row for row in report['speed']}


def compare(kind, before, after, default_k=100):
    read = (lambda path: engine_rows(path, default_k)) if kind == 'engines' else encode_rows
    sides = {'before': [read(p) for p in before], 'after': [read(p) for p in after]}
    keys = [key for key in sides['before'][0] if all(key in run for runs in sides.values() for run in runs)]
    rows = []
    for key in keys:
        row = {'setting': key[0], 'k' if kind == 'engines' else 'batch_size': key[1]}
        for figure in FIGURES[kind]:
            for side, runs in sides.items():
                row[f'{figure}_{side}'] = [run[key][figure] for run in runs]
            row[f'{figure}_after/before'] = (statistics.median(row[f'{figure}_after'])
                                             / statistics.median(row[f'{figure}_before']))
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('kind', choices=sorted(FIGURES))
    parser.add_argument('--before', nargs='+', required=True, help='result files of the runs before the change')
    parser.add_argument('--after', nargs='+', required=True, help='result files of the runs after it')
    parser.add_argument('--default-k', type=int, default=100,
                        help="engines: the k of rows that do not record it (engines.py's synthetic rows used 100)")
    parser.add_argument('--output', help='JSON file of the comparison (default: print only)')
    args = parser.parse_args()
    rows = compare(args.kind, args.before, args.after, args.default_k)
    second = 'k' if args.kind == 'engines' else 'batch_size'
    header = ['setting', second] + [f'{f} median before / after (after/before)' for f in FIGURES[args.kind]]
    print('| ' + ' | '.join(header) + ' |\n|' + '---|' * len(header))
    for row in rows:
        cells = [row['setting'], str(row[second])]
        for f in FIGURES[args.kind]:
            cells.append(f"{statistics.median(row[f + '_before']):.2f} / {statistics.median(row[f + '_after']):.2f} "
                         f"({row[f + '_after/before']:.2f})")
        print('| ' + ' | '.join(cells) + ' |')
    if args.output:
        from pyterrier_lsr.core.storage import write_json
        write_json(args.output, {'kind': args.kind, 'before': args.before, 'after': args.after,
                                 'default_k': args.default_k, 'rows': rows})


if __name__ == '__main__':
    main()
