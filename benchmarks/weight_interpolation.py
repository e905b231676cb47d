"""Weight interpolation between the starting model and finished domain-adaptation runs (WiSE-FT, Wortsman et al.
2022): ``w = (1 - a) w_start + a w_final`` for each ``--alphas`` value, scored on the run's held-out pseudo-queries
(the signals ``domain_adapt`` selects on) and on the test topics (reported only).

    OMP_NUM_THREADS=1 python benchmarks/weight_interpolation.py --collection path/to/cisi \\
        --runs runs/da4/cisi/base_s* --cache-dir runs/domain_adapt_cache/cisi --output benchmarks/results/wise_cisi.json

``--runs`` are ``domain_adapt`` output folders (their ``domain_adapt.json`` gives the settings, their last checkpoint
under ``train/`` the final weights); ``--cache-dir`` is the cache they were built with, so the held-out queries are
theirs.

``--soups N ...`` also averages the final weights of the first ``N`` runs (a uniform model soup, Wortsman et al.
2022: runs from the same start with other seeds, here other pseudo-queries) and scores each soup on the held-out
queries of its ``N`` runs (mean) next to the starting model's score on the same queries (the guard's comparison).
"""
import argparse
import json
import time
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True)
    p.add_argument('--runs', nargs='+', required=True)
    p.add_argument('--model', default='splade-tiny', help='the starting model of the runs')
    p.add_argument('--alphas', nargs='*', type=float, default=[0.5])
    p.add_argument('--soups', nargs='*', type=int, default=[], metavar='N', help='soups of the first N runs')
    p.add_argument('--cache-dir', required=True)
    p.add_argument('--output', required=True)
    p.add_argument('--irds-cache')
    args = p.parse_args()
    from pyterrier_lsr.core.offline import resolve_model, use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(1)
    from pyterrier.measures import nDCG

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.train import DomainConfig, experiment_evaluator, latest_checkpoint
    from pyterrier_lsr.train.domain import build_data, heldout_scores, logged_config

    collection = load_collection(args.collection)
    docs = {str(d['docno']): d['text'] for d in collection.corpus}
    start = Splade.from_pretrained(resolve_model(args.model))
    w0 = {k: v.clone() for k, v in start.model.state_dict().items()}
    test = experiment_evaluator(start.tokenizer, collection.corpus, collection.topics, collection.qrels, [nDCG @ 10])
    def load(mix):
        """Loads ``sum(c * w)`` over ``mix`` = ``[(c, state), ...]`` into ``start`` (integer buffers stay ``w0``'s)."""
        start.model.load_state_dict({k: sum(c * w[k] for c, w in mix) if w0[k].is_floating_point() else w0[k]
                                     for k in w0})

    def scores(config, data):
        return heldout_scores(start.model, start.tokenizer, data['heldout'], docs, config, data['heldout_extra'])

    rows, finals, heldouts = [], [], []
    for folder in map(Path, args.runs):
        log = json.loads((folder / 'domain_adapt.json').read_text())
        config = DomainConfig(**{**logged_config(log['config']), 'teachers': tuple(log['config']['teachers'])})
        data, _ = build_data(docs, Path(args.cache_dir), config, verbose=False)
        heldouts.append((config, data))
        final = latest_checkpoint(folder / 'train')
        w1 = Splade.from_pretrained(str(final)).model.state_dict()
        finals.append(w1)
        for alpha in args.alphas:
            load([(1 - alpha, w0), (alpha, w1)])
            row = {'run': folder.name, 'alpha': alpha, 'checkpoint': final.name, **scores(config, data),
                   **test(start.model)}
            rows.append(row)
            print(json.dumps(row), flush=True)

    def mean(per_run):
        return {k: sum(s[k] for s in per_run) / len(per_run) for k in per_run[0]}

    if any(not 1 <= n <= len(finals) for n in args.soups):
        raise SystemExit(f'--soups: there are {len(finals)} runs')
    if args.soups:
        start.model.load_state_dict(w0)
        start_scores, start_test = [scores(*h) for h in heldouts[:max(args.soups)]], test(start.model)
    for n in args.soups:
        load([(1 / n, w) for w in finals[:n]])
        row = {'soup': n, 'runs': [Path(r).name for r in args.runs[:n]], 'start': mean(start_scores[:n]),
               'start_test': start_test, **mean([scores(*h) for h in heldouts[:n]]), **test(start.model)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    Path(args.output).write_text(json.dumps({'collection': collection.name, 'alphas': args.alphas,
                                             'soups': args.soups, 'rows': rows,
                                             'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, indent=1))


if __name__ == '__main__':
    main()
