"""The plot of ``benchmarks/scale.py``: build cost, memory and query cost against corpus size (log-log)."""
import os
from pathlib import Path


def plot(records: dict, path: Path, precision: str):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    sizes = sorted({int(n.split('-')[-1]) for n in records if n.startswith('index-')})
    fig, axes = plt.subplots(1, 4, figsize=(21, 4.8))

    def bmp(n):  # the block size chosen at n once measured, else the first one built
        chosen = records.get(f'measure-{n}', {}).get('engines', {}).get('bmp', {}).get('block_size')
        built = sorted(k for k in records if k.startswith('bmp-') and k.endswith(f'-{n}'))
        return f'bmp-{chosen}-{n}' if chosen else (built[0] if built else None)

    builds = {f'encode ({precision})': lambda n: f'encode-{precision}-{n}', 'vectors + PISA': lambda n: f'index-{n}',
              'BMP (reordered)': bmp, 'Seismic': lambda n: f'seismic-{n}', 'BM25 (PISA)': lambda n: f'bm25-{n}'}
    for label, name in builds.items():
        points = [(n, records[name(n)]) for n in sizes if records.get(name(n))]
        if points:
            # the build alone: BMP's and Seismic's stages also tune on the queries
            seconds = [r.get('encode_cpu_s') or r.get('build_cpu_s') or r['cpu_s'] for _, r in points]
            axes[0].plot([n for n, _ in points], seconds, 'o-', label=label)
            axes[1].plot([n for n, _ in points], [r['peak_rss_mib'] for _, r in points], 'o-', label=label)
    measured = [(n, records[f'measure-{n}']) for n in sizes if f'measure-{n}' in records]
    for engine in ('pisa', 'bmp', 'seismic', 'bm25'):
        rows = [(n, r['engines'][engine]) for n, r in measured if engine in r['engines']]
        if rows:
            sizes_of = [n for n, _ in rows]
            line, = axes[2].plot(sizes_of, [r['cpu_ms_one_median'] for _, r in rows], 'o-',
                                 label=engine if engine != 'bm25' else 'BM25 (PISA)')
            axes[2].plot(sizes_of, [r['cpu_ms_batch'] for _, r in rows], 's--', color=line.get_color())
    sides = sorted({n.split('-', 1)[1].rsplit('-', 1)[0] for n in records if n.startswith('sparse-')})
    for side in sides:  # each size's fastest engine one a call among those at R@10 >= 0.99, query encoding included
        points = []
        for n in sizes:
            engines = records.get(f'sparse-{side}-{n}', {}).get('engines', {})
            kept = [r for r in engines.values() if r['recall@10'] >= 0.99]
            if kept:
                points.append((n, min(r['cpu_ms_one_median'] for r in kept)))
        if points:
            axes[3].plot(*zip(*points), 'o-', label=side)
    bm25 = [(n, records[f'sparse-{sides[0]}-{n}']['bm25']['cpu_ms_one_median']) for n in sizes
            if sides and f'sparse-{sides[0]}-{n}' in records]
    if bm25:
        axes[3].plot(*zip(*bm25), 'k^--', label="BM25 (pyterrier-pisa's retriever)")
        axes[3].plot([n for n, _ in bm25], [ms / 2 for _, ms in bm25], 'k:', label='half of BM25 (the target)')
    titles = ('build CPU seconds', 'peak RSS during the stage (MiB)', 'CPU ms/query: one a call (-), batched (--)',
              'query sides (fastest engine): CPU ms one a call')
    for ax, title in zip(axes, titles):
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xlabel('documents')
        ax.set_title(title)
        ax.grid(True, which='both', alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle('packages corpus, SPLADE-tiny; torch threads and load average of each stage in scale.json')
    fig.tight_layout()
    tmp = path.with_name(path.stem + '.tmp' + path.suffix)
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
