"""Domain adaptation that transfers: ``train.domain_adapt`` arms on several collections, one change at a time.

Each arm is a set of :class:`~pyterrier_lsr.train.DomainConfig` overrides on the library defaults; every arm of a
collection starts from the same model. Selection uses held-out pseudo-queries only; the test topics are evaluated
alongside (``--curve``: at every held-out evaluation step, otherwise only the start and the selected model) to show
whether the selection signal tracks the test metric. The test topics never choose anything.

    OMP_NUM_THREADS=1 python benchmarks/domain_adaptation.py --collections path/to/cisi \\
        --arms base: keywords:queries=keywords listwise:candidates=teacher,negatives=7 --curve

Writes ``--output`` (JSON, rewritten after every run) and one PNG per collection next to it (held-out score and test
nDCG@10 over steps, per arm); prints a table.

``--summarize a.json b.json ...`` runs nothing: it pools the runs of several outputs, averages each arm over its seeds
(arms named ``<arm>_s<seed>``; runs with a ``--curve`` re-selected on ``--select-on``) and, for those runs, shows
for every held-out signal the test score at the step that signal would have selected (with the never-worse guard)
and its rank correlation with the test over steps; it plots every run's curve into ``<--output stem>_<collection>.png``.
"""
import argparse
import json
import re
import time
from pathlib import Path

import numpy as np


def selected_step(curve: list, signal: str) -> int:
    """The step ``domain_adapt`` would return when selecting on ``signal``: the best one, or 0 when none beats the
    start."""
    best = max(curve, key=lambda row: (row[signal], -row['step']))
    return best['step'] if best[signal] > curve[0][signal] else 0


def adapted_on(run: dict, signal: str) -> tuple[float, bool]:
    """Test nDCG@10 of the model ``signal`` selects (from the run's curve), or the run's own result when its curve
    lacks the test score or the signal; the flag says whether it was re-selected."""
    if all('nDCG@10' in row and signal in row for row in run['curve']):
        return {row['step']: row['nDCG@10'] for row in run['curve']}[selected_step(run['curve'], signal)], True
    return run['adapted'], False


def summarize(paths: list, signal: str, output: Path):
    from pyterrier_lsr.train.domain import SELECT_ON as SIGNALS
    if signal not in SIGNALS:
        raise SystemExit(f'--select-on must be one of {SIGNALS}, got {signal!r}')
    runs = [r for path in paths for r in json.loads(Path(path).read_text())['runs']]
    groups = {}
    for r in runs:
        groups.setdefault((r['collection'], re.sub(r'_s\d+$', '', r['arm'])), []).append(r)
    for collection in sorted({r['collection'] for r in runs}):
        curves = [r for r in runs if r['collection'] == collection and all(signal in row for row in r['curve'])]
        plot(collection, sorted(curves, key=lambda r: r['arm']), output.with_name(f'{output.stem}_{collection}.png'),
             signal)
    print(f'Selected on {signal} (* = as run: its curve has no test scores, selected on its own select_on)')
    print('| collection | arm | seeds | zero-shot | adapted (mean) | Δ per seed | Δ mean | runs ≥ +0.02 |')
    print('|---|---|---:|---:|---:|---|---:|---:|')
    for (collection, arm), rs in sorted(groups.items()):
        adapted = [adapted_on(r, signal) for r in rs]
        deltas = [a - r['zero_shot'] for (a, _), r in zip(adapted, rs)]
        print(f"| {collection} | {arm} | {len(rs)} | {np.mean([r['zero_shot'] for r in rs]):.3f} | "
              f"{np.mean([a for a, _ in adapted]):.3f} | "
              f"{' '.join(f'{d:+.3f}' + ('' if again else '*') for d, (_, again) in zip(deltas, adapted))} | "
              f"{np.mean(deltas):+.3f} | {sum(d >= 0.02 for d in deltas)}/{len(rs)} |")
    print('\nPer signal (runs with --curve and every signal): mean test Δ at the step it selects, and its mean '
          'Spearman correlation with test nDCG@10 over the evaluated steps')
    print('| collection | arm | runs | ' + ' | '.join(SIGNALS) + ' |')
    print('|---|---|---:|' + '---|' * len(SIGNALS))
    for (collection, arm), rs in sorted(groups.items()):
        rs = [r for r in rs if all('nDCG@10' in row and all(s in row for s in SIGNALS) for row in r['curve'])]
        if not rs:
            continue
        cells = []
        for other in SIGNALS:
            deltas, rhos = [], []
            for r in rs:
                deltas.append(adapted_on(r, other)[0] - r['zero_shot'])
                ranks = [np.argsort(np.argsort([row[k] for row in r['curve']])) for k in (other, 'nDCG@10')]
                rhos.append(np.corrcoef(*ranks)[0, 1])
            cells.append(f'{np.mean(deltas):+.3f} (ρ {np.nanmean(rhos):+.2f})')
        print(f"| {collection} | {arm} | {len(rs)} | " + ' | '.join(cells) + ' |')


def parse_arm(text: str):
    name, _, overrides = text.partition(':')
    return name, dict(item.split('=', 1) for item in overrides.split(',') if item)


def plot(collection: str, runs: list, path: Path, signal: str | None = None):
    """Held-out score (``signal``, default each run's own ``select_on``) and test nDCG@10 over steps, per run."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        steps = [row['step'] for row in run['curve']]
        ax1.plot(steps, [row[signal or run['select_on']] for row in run['curve']], marker='o', label=run['arm'])
        if all('nDCG@10' in row for row in run['curve']):
            ax2.plot(steps, [row['nDCG@10'] for row in run['curve']], marker='o', label=run['arm'])
    ax1.set(title=f'{collection}: held-out pseudo-queries', xlabel='step', ylabel=signal or runs[0]['select_on'])
    ax2.set(title=f'{collection}: test topics (not used for selection)', xlabel='step', ylabel='nDCG@10')
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
        ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collections', nargs='+', default=['irds:vaswani'],
                   help='irds: ids or folders of docs.jsonl, topics.tsv and qrels.txt (e.g. path/to/cisi)')
    p.add_argument('--model', default='splade-tiny', help='a SPLADE name or folder, or any model folder of the project')
    p.add_argument('--query-side', choices=['model', 'idf'], default='model',
                   help='idf: doc-only, queries through a static table started from the corpus idf and trained')
    p.add_argument('--arms', nargs='+', default=['base:'], help='name:key=value,... (DomainConfig overrides)')
    p.add_argument('--curve', action=argparse.BooleanOptionalAction, default=True,
                   help='evaluate the test topics at every held-out evaluation (costly on large corpora)')
    p.add_argument('--runs', default='runs/domain_adapt', help='output folders of the runs')
    p.add_argument('--cache-dir', default='runs/domain_adapt_cache')
    p.add_argument('--output', default='benchmarks/results/domain_adaptation_transfer.json')
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--irds-cache')
    p.add_argument('--summarize', nargs='+', metavar='JSON', help='summarize these outputs instead of running')
    p.add_argument('--select-on', help='--summarize: the held-out signal that selects (default: the DomainConfig '
                   'default)')
    args = p.parse_args()
    if args.summarize:
        from pyterrier_lsr.train import DomainConfig
        return summarize(args.summarize, args.select_on or DomainConfig.select_on, Path(args.output))
    from pyterrier_lsr.core.offline import use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(args.threads)
    from pyterrier.measures import nDCG

    from pyterrier_lsr import IDFQueryEncoder, InferenceFreeSplade, load_model, systems
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.train import domain_adapt, experiment_evaluator
    from pyterrier_lsr.train.domain import config_from_overrides

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(output.read_text()) if output.exists() else {'runs': []}
    for spec in args.collections:
        collection = load_collection(spec)
        for arm, overrides in map(parse_arm, args.arms):
            config = config_from_overrides(overrides)
            splade = load_model(args.model)  # SPLADE by name or folder, or any saved model of the project
            query_side = None
            if args.query_side == 'idf':
                idf = IDFQueryEncoder.from_corpus(splade.tokenizer, [d['text'] for d in collection.corpus])
                splade = InferenceFreeSplade(splade.model, splade.tokenizer, idf, name=f'{args.model} + idf')
                query_side = splade.query_encoder  # the table being trained, at every evaluation
            # query-only adaptation (side=query) reads its documents from one index of the start, which also scores
            # the queries of each step
            start_index = Path(args.runs) / collection.name / f'start-{Path(args.model).name}-{args.query_side}.lsr'
            documents = None if config.side != 'query' else systems.sparse_index(start_index, splade, collection.corpus)
            test = experiment_evaluator(splade.tokenizer, collection.corpus, collection.topics, collection.qrels,
                                        [nDCG @ 10], query_side=query_side, index=documents)
            start = time.time()
            zero_shot = None if args.curve else test(splade.model)['nDCG@10']
            adapted_splade, log = domain_adapt(splade, collection.corpus, Path(args.runs) / collection.name / arm,
                                               config, cache_dir=Path(args.cache_dir) / collection.name,
                                               report=test if args.curve else None, documents=documents)
            at = {row['step']: row for row in log['curve']}
            if args.curve:
                zero_shot, adapted = at[0]['nDCG@10'], at[log['selected_step']]['nDCG@10']
            else:
                adapted = zero_shot if log['guard'] else test(
                    getattr(adapted_splade, 'query_splade', adapted_splade).model)['nDCG@10']
            run = {'collection': collection.name, 'arm': arm, 'query_side': args.query_side, 'overrides': overrides,
                   'zero_shot': zero_shot,
                   'adapted': adapted, 'select_on': config.select_on, 'heldout_start': log['start_score'],
                   'heldout_best': log['best_score'], 'selected_step': log['selected_step'], 'guard': log['guard'],
                   'decision': log['decision'], 'curve': log['curve'], 'examples': log['examples'],
                   'prep_seconds': log['prep_seconds'], 'train_seconds': log['train_seconds'],
                   'wall_seconds': round(time.time() - start), 'config': log['config'],
                   'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}
            results['runs'] = [r for r in results['runs'] if (r['collection'], r['arm']) != (collection.name, arm)]
            results['runs'].append(run)
            tmp = output.with_name(output.name + '.tmp')
            tmp.write_text(json.dumps(results, indent=1))
            tmp.replace(output)
            print(json.dumps({k: v for k, v in run.items() if k not in ('curve', 'config')}), flush=True)
            plot(collection.name, [r for r in results['runs'] if r['collection'] == collection.name],
                 output.with_name(f'{output.stem}_{collection.name}.png'))
    print('| collection | arm | held-out start | held-out best (step) | guard | zero-shot nDCG@10 | adapted | delta |')
    print('|---|---|---:|---:|---|---:|---:|---:|')
    for r in results['runs']:
        print(f"| {r['collection']} | {r['arm']} | {r['heldout_start']:.3f} | {r['heldout_best']:.3f} "
              f"({r['selected_step']}) | {'yes' if r['guard'] else 'no'} | {r['zero_shot']:.3f} | {r['adapted']:.3f} | "
              f"{r['adapted'] - r['zero_shot']:+.3f} |")


if __name__ == '__main__':
    main()
