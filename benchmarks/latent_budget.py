"""Latent Terms' SAE budget on small corpora: the floor of SAE updates and the number of latents, chosen on held-out
pseudo-queries of subsamples of several sizes (never on the topics), then the topics at those sizes.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/latent_budget.py --collection irds:vaswani \
        --data runs/latent_budget --sizes 50
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/latent_budget.py --collection irds:vaswani \
        --data runs/latent_budget_500 --sizes 500     # side by side; the same for --collection path/to/cisi
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/latent_budget.py --collection irds:vaswani \
        --data runs/latent_budget_5000 --sizes 5000   # likewise: a folder per collection and size
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/latent_budget.py --collection path/to/cisi \
        --data runs/latent_budget --sizes 50 --merge runs/latent_budget_500 runs/latent_budget_5000 ...  # once all
                                                                                      # are done: the result file

A subsample of ``size`` documents holds the relevant documents of seeded topics up to half of it, the rest drawn at
random (so a few topics can be scored at every size); a size at or above the collection's is the whole collection.
Each candidate is the recipe of ``train.sae.LATENT_TERMS`` (k = 16, three epochs, BM25 k1 0.9 / b 0.4 over
square-rooted latent frequencies) with a floor of ``--floors`` updates and a number of latents set by a rule of
``--latent-rules``: ``fixed`` (the recipe's 16,384), ``n`` (at most the number of token vectors, the power of two
below it) or ``n/8``.  Every floor of one rule is a prefix of one training run (a floor only adds reshuffled passes
after the same ones), so a run trains to the largest floor and scores snapshots.  Held-out pseudo-queries: 200 per
subsample (sentence and keyword queries alternately, several per document on a small subsample), scored by the
reciprocal rank of their source document at 10.

Token embeddings (MiniLM, the recipe's base) are cached per subsample under ``--data`` (outside the repository), so
a rerun only trains and scores. Each collection's rows go to ``<data>/<collection>.json`` (one run per collection
and folder at a time: runs of one collection side by side take a folder each, joined by ``--merge``); every run then
rewrites ``--output`` from all collections there, with the command, date, machine and load of each run and the
choice: the held-out pseudo-queries' mean RR@10 over every collection and size scored for every candidate, and among
the candidates within ``--tolerance`` of the best, the one with the fewest updates (then latents). Set before the
runs: pseudo-queries are drawn from the corpus's own text, so the longer an SAE fits that corpus the better they
tend to score (`git show df4b050:benchmarks/claims/latent-terms.md`, "Every token vector"); only a gain above the
tolerance buys more updates.
"""
import argparse
import copy
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

RULES = ('fixed', 'n', 'n/8')


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True, help='irds:<id> or a folder (docs.jsonl, topics.tsv, qrels.txt)')
    p.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    p.add_argument('--data', default='runs/latent_budget', help='embedding cache, indexes and per-collection rows')
    p.add_argument('--sizes', nargs='+', type=int, default=[50, 500, 5000])
    p.add_argument('--floors', nargs='+', type=int, default=[0, 100, 300], help='SAE update floors to try')
    p.add_argument('--latent-rules', nargs='+', choices=RULES, default=list(RULES))
    p.add_argument('--pseudo-queries', type=int, default=200)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    p.add_argument('--merge', nargs='*', default=[], metavar='DATA',
                   help="other --data folders (runs of other sizes side by side) whose rows join --output's")
    p.add_argument('--tolerance', type=float, default=0.01, help='held-out RR@10 that does not buy more updates')
    p.add_argument('--output', default='benchmarks/results/latent_budget.json')
    return p.parse_args()


def cpu_info() -> dict:
    fields = {}
    try:
        first = Path('/proc/cpuinfo').read_text().split('\n\n')[0]
        fields = {k.strip(): v.strip() for k, v in (line.split(':', 1) for line in first.splitlines() if ':' in line)}
    except OSError:  # not Linux
        pass
    flags = set(fields.get('flags', '').split())
    return {'model': fields.get('model name', platform.processor()), 'cores': os.cpu_count(),
            'flags': sorted(flags & {'avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_int8'})}


def portable(command) -> str:
    """``command`` (a list or a string) with every absolute path cut to ``path/to/<its last part>``: no path of the
    machine that ran it goes into the result file."""
    words = command.split(' ') if isinstance(command, str) else command
    return ' '.join(f'path/to/{Path(w).name}' if w.startswith('/') else w for w in words)


def subsample(corpus, qrels, size: int, seed: int):
    """``size`` documents in collection order: the relevant documents of seeded topics up to half, the rest at
    random (the whole corpus when ``size`` reaches it)."""
    if size >= len(corpus):
        return list(corpus)
    rng = random.Random(seed)
    relevant = qrels[qrels['label'] > 0].groupby('qid')['docno'].apply(list).to_dict()
    chosen = set()
    for qid in rng.sample(sorted(relevant), len(relevant)):
        new = set(relevant[qid]) - chosen
        if len(chosen) + len(new) <= size // 2:
            chosen |= new
    others = sorted(d['docno'] for d in corpus if d['docno'] not in chosen)
    chosen |= set(rng.sample(others, size - len(chosen)))
    return [d for d in corpus if d['docno'] in chosen]


def pseudo_queries(docs, n: int, seed: int):
    """About ``n`` held-out pseudo-queries from the documents (several per document when there are fewer than
    ``n``), with their source documents as qrels."""
    import pandas as pd

    from pyterrier_lsr.train.domain.queries import document_frequencies, make_queries
    texts = {d['docno']: d['text'] for d in docs if d['text'].strip()}
    rng = random.Random(seed)
    sample = rng.sample(sorted(texts), min(n, len(texts)))
    per_doc = math.ceil(n / len(sample))
    queries = make_queries(texts, sample, 'mixed', per_doc, rng, document_frequencies(texts.values()))
    topics = pd.DataFrame({'qid': [q['qid'] for q in queries], 'query': [q['query'] for q in queries]})
    return topics, pd.DataFrame({'qid': topics['qid'], 'docno': [q['pos'] for q in queries], 'label': 1})


def n_latents(rule: str, n_vectors: int, recipe: int) -> int:
    if rule == 'fixed':
        return recipe
    cap = n_vectors if rule == 'n' else n_vectors // 8
    return min(recipe, 2 ** max(int(math.log2(max(cap, 1))), 4))


def snapshots(vectors, config, steps):
    """Trains ``config`` (its ``min_updates`` the largest of ``steps``) as :func:`train_sae` does and returns
    ``{step: model}`` after each of ``steps`` updates, and the training log."""
    import torch

    from pyterrier_lsr.models.sae import SparseAutoencoder, _batches, _data_mean, train_sae
    model = SparseAutoencoder(config)
    with torch.no_grad():
        model.b_dec.copy_(_data_mean(vectors, None))
    taken = {}
    stream = _batches(vectors, config, torch.Generator().manual_seed(config.seed))

    def batches():
        for done, batch in enumerate(stream):
            if done in steps:  # the generator resumes after the previous batch's update
                taken[done] = copy.deepcopy(model).eval()
            yield batch
    model, log = train_sae(batches(), config, model=model, log_every=1, verbose=False)
    taken[log[-1]['step']] = model
    return taken, log


def main():
    args = parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import pyterrier as pt
    import torch
    from pyterrier.measures import RR, nDCG

    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.quiet import quiet_native
    from pyterrier_lsr.core.storage import read_json, write_json
    from pyterrier_lsr.index import SpladeIndexer
    from pyterrier_lsr.kinds.latent_terms import LatentTerms, cached_embeddings
    from pyterrier_lsr.models.sae import SAEConfig
    from pyterrier_lsr.train.sae import LATENT_TERMS

    torch.set_num_threads(args.threads)
    run = {'command': portable(['python'] + sys.argv), 'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
           'machine': cpu_info(), 'torch_threads': args.threads, 'load_start': os.getloadavg()}
    collection = load_collection(args.collection)
    data = Path(args.data)
    rows_file = data / f'{collection.name}.json'
    saved = read_json(rows_file, 'the rows') if rows_file.is_file() else {'runs': [], 'rows': []}
    done = {(r['size'], r['rule'], r['steps']) for r in saved['rows']}
    recipe = LATENT_TERMS['sae']
    lt = LatentTerms('all-MiniLM-L6-v2', mode='multi', sqrt_tf=LATENT_TERMS['sqrt_tf'], k1=LATENT_TERMS['k1'],
                     b=LATENT_TERMS['b'])
    retrieval = dict(k1=LATENT_TERMS['k1'], b=LATENT_TERMS['b'], num_results=100)
    cache = data / 'embeddings'

    def embedded(texts):
        return cached_embeddings(lt, list(texts), cache, verbose=True)

    def with_toks(frame, vectors, offsets):
        return frame.assign(query_toks=list(lt.encode_vectors(vectors, offsets)))

    for size in args.sizes:
        docs = subsample(collection.corpus, collection.qrels, size, args.seed)
        docnos = {d['docno'] for d in docs}
        qrels = collection.qrels[collection.qrels['docno'].isin(docnos) & (collection.qrels['label'] > 0)]
        topics = collection.topics[collection.topics['qid'].isin(set(qrels['qid']))]
        pq_topics, pq_qrels = pseudo_queries(docs, args.pseudo_queries, args.seed)
        vectors, offsets = embedded(d['text'] for d in docs)
        queries = {'held-out': (pq_topics, pq_qrels, embedded(pq_topics['query'])),
                   'topics': (topics, qrels, embedded(topics['query']))}
        per_epoch = math.ceil(min(len(vectors), LATENT_TERMS['max_train_vectors']) / recipe.get('batch_size', 1024))
        steps = sorted({max(f, recipe['epochs'] * per_epoch) for f in args.floors})
        by_latents = {}
        for rule in args.latent_rules:
            by_latents.setdefault(n_latents(rule, len(vectors), recipe['n_latents']), []).append(rule)
        for latents, rules in by_latents.items():
            if all((len(docs), rule, s) in done for rule in rules for s in steps):
                continue
            print(f'{collection.name} {len(docs)} docs, {len(vectors)} vectors: {latents} latents ({rules}), '
                  f'steps {steps}', flush=True)
            config = SAEConfig(d_in=lt.features.dim, **{**recipe, 'n_latents': latents, 'min_updates': steps[-1]})
            start = time.perf_counter()
            models, log = snapshots(vectors, config, set(steps))
            train_s = time.perf_counter() - start
            for step in steps:
                lt.set_sae(models[step])
                path = data / 'indexes' / f'{collection.name}.lsr'
                with quiet_native(False):
                    index = SpladeIndexer(path, lt, overwrite=True, verbose=False).index(
                        [{'docno': d['docno'], 'toks': t} for d, t in zip(docs, lt.encode_vectors(vectors, offsets))])
                row = {'size': len(docs), 'vectors': len(vectors), 'n_latents': latents, 'steps': step,
                       'floors': [f for f in args.floors if max(f, recipe['epochs'] * per_epoch) == step],
                       'epochs_steps': recipe['epochs'] * per_epoch, 'train_s_all_steps': round(train_s, 1),
                       'load': os.getloadavg()[0]}
                logged = [e for e in log if e['step'] <= step][-1]
                row.update(fve=logged['fve'], dead=logged['dead'])
                for name, (frame, judged, (q_vectors, q_offsets)) in queries.items():
                    if len(frame) == 0:
                        continue
                    res = pt.Experiment([index.toks_retriever(**retrieval)], with_toks(frame, q_vectors, q_offsets),
                                        judged, [RR @ 10, nDCG @ 10])
                    row[f'{name} RR@10'], row[f'{name} nDCG@10'] = res['RR@10'][0], res['nDCG@10'][0]
                    row[f'{name} queries'] = len(frame)
                print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, rules, flush=True)
                keys = {(len(docs), rule, step) for rule in rules}
                saved['rows'] = [r for r in saved['rows'] if (r['size'], r['rule'], r['steps']) not in keys]
                saved['rows'] += [{'rule': rule, **row} for rule in rules]
                write_json(rows_file, saved)
    saved['runs'].append({**run, 'load_end': os.getloadavg()})
    write_json(rows_file, saved)
    write_json(Path(args.output), summary([data, *map(Path, args.merge)], args.tolerance))


def summary(folders, tolerance: float) -> dict:
    """Every collection's rows and the choice among the candidates (latent rule, floor) scored at the most (collection,
    size) cells: their mean held-out RR@10 over those cells; within ``tolerance`` of the best, the smallest floor,
    then the fewest latents.  Candidates scored at fewer cells (a floor tried at the small sizes only) are listed
    with their cells' scores."""
    import numpy as np

    from pyterrier_lsr.core.storage import read_json
    collections = {}
    for folder in folders:
        for f in sorted(folder.glob('*.json')):
            saved = read_json(f, 'the rows')
            if 'rows' not in saved:  # an --output written into the folder
                continue
            merged = collections.setdefault(f.stem, {'runs': [], 'rows': []})
            merged['runs'] += [{**r, 'command': portable(r['command'])} for r in saved['runs']]
            merged['rows'] += saved['rows']
    scores = {}
    for name, saved in collections.items():
        for row in saved['rows']:
            for floor in row['floors']:
                scores.setdefault((row['rule'], floor), {})[f'{name}/{row["size"]}'] = row['held-out RR@10']
    most = max(map(len, scores.values()), default=0)
    common = set.intersection(*(set(s) for s in scores.values() if len(s) == most)) if scores else set()
    table = sorted(({'rule': rule, 'floor': floor, 'held-out RR@10 mean': float(np.mean([s[c] for c in common]))}
                    for (rule, floor), s in scores.items() if len(s) == most), key=lambda r: -r['held-out RR@10 mean'])
    eligible = [r for r in table if r['held-out RR@10 mean'] >= table[0]['held-out RR@10 mean'] - tolerance]
    choice = min(eligible, key=lambda r: (r['floor'], -RULES.index(r['rule'])), default=None)
    partial = [{'rule': rule, 'floor': floor, 'held-out RR@10': s} for (rule, floor), s in scores.items()
               if len(s) < most]
    return {'choice': choice, 'tolerance': tolerance, 'cells': sorted(common), 'candidates': table,
            'scored_at_fewer_cells': partial, 'collections': collections}


if __name__ == '__main__':
    main()
