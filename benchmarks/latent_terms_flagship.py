"""Latent Terms as the flagship: one pt.Experiment per collection with BM25, each dense base (exact cosine),
RRF(BM25, dense), Latent Terms over each base and RRF(BM25, Latent Terms), plus cost columns.

    python benchmarks/latent_terms_flagship.py --collection PATH/cisi --workdir runs/flagship
    python benchmarks/latent_terms_flagship.py --collection irds:vaswani --irds-cache PATH --workdir runs/flagship

Latent Terms' SAE size and k (``--candidates``, ``n_latents:k``) and its BM25 k1/b (``--bm25-params``) are chosen
per base on held-out pseudo-queries (``--pseudo-queries`` sentence and keyword queries drawn from a seeded sample of
documents; reciprocal rank of the source document at 10), never on the test topics.  Everything built (BM25
index, embeddings, SAEs and indexes) stays under ``--workdir/<collection>`` with its build time; a later run (or one
after an interruption: the embedding pass resumes) reuses it and only re-scores.  Build time counts what the system
needs from the raw corpus: embedding pass, SAE training and indexing (Latent Terms), embedding pass (dense).
Writes the table as JSON to ``--output`` (default ``benchmarks/results/latent_terms_flagship_<collection>.json``).
"""
import argparse
import random
import time
from pathlib import Path

DEFAULT_BASES = ['all-MiniLM-L6-v2', 'all-mpnet-base-v2']


def parse_args():
    from pyterrier_lsr.train.sae import LATENT_TERMS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--collection', required=True, help='irds:<id> or a folder (docs.jsonl, topics.tsv, '
                        'qrels.txt)')
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    parser.add_argument('--workdir', default='runs/latent_terms_flagship')
    parser.add_argument('--bases', nargs='+', default=DEFAULT_BASES)
    parser.add_argument('--candidates', nargs='+', default=['4096:16', '16384:16'],
                        help='SAE n_latents:k[:train] for every base (train: how many token vectors train the SAE, a '
                             'seeded sample, or "all"; default --max-train); BASE=n_latents:k[,n_latents:k...] '
                             'replaces the list for one base (e.g. a shorter grid for a slow one)')
    parser.add_argument('--bm25-params', nargs='+', default=['0.9:0.4', '1.5:0.75'], help="Latent Terms' k1:b")
    parser.add_argument('--epochs', type=int, default=LATENT_TERMS['sae']['epochs'])
    parser.add_argument('--max-train', type=int, default=LATENT_TERMS['max_train_vectors'],
                        help='SAE training vectors: all of them up to this many, above it a seeded sample '
                             '(100000 with 3 epochs reproduces the earlier sampled recipe)')
    parser.add_argument('--pseudo-queries', type=int, default=200)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--max-length', type=int, help="texts' truncation (default: what each base's folder declares; "
                        '256 for every base reproduces the earliest runs)')
    parser.add_argument('--output')
    return parser.parse_args()


class Timings:
    """Build times in ``<workdir>/times.json``, recorded when a part is built, so a resumed run reports them."""

    def __init__(self, path: Path):
        from pyterrier_lsr.core.storage import read_json
        self.path = path
        self.times = read_json(path, 'the build times') if path.is_file() else {}

    def run(self, name, build, done: bool):
        start = time.perf_counter()
        result = build()
        if not done or name not in self.times:
            from pyterrier_lsr.core.storage import write_json
            self.times[name] = round(time.perf_counter() - start, 1)
            write_json(self.path, self.times)
        return result

    def __getitem__(self, name):
        return self.times.get(name, float('nan'))


def recorded_args(args) -> dict:
    """The arguments as the result file records them: no path of the machine that ran it (a collection folder and the
    work folder by their names, the ir_datasets cache as given or not, the output file by its name)."""
    spec = args.collection if args.collection.startswith('irds:') else Path(args.collection).name
    return {**vars(args), 'collection': spec, 'irds_cache': bool(args.irds_cache),
            'workdir': Path(args.workdir).name, 'output': args.output and Path(args.output).name}


def base_candidates(entries, base):
    """The SAE settings to try for ``base``: its ``BASE=...`` entry if there is one, else the plain entries."""
    own = [e.split('=', 1)[1].split(',') for e in entries if '=' in e and e.split('=', 1)[0] == base]
    return own[0] if own else [e for e in entries if '=' not in e]


def sae_setting(setting: str, default_train: int):
    """``(n_latents, k, max_train_vectors, path tag)`` of a candidate ``n_latents:k[:train]`` (``train``: a number of
    token vectors or ``all``, default ``default_train``)."""
    n_latents, k, *train = setting.split(':')
    train = train[0] if train else str(default_train)
    return int(n_latents), int(k), None if train == 'all' else int(train), f'.t{train}'


def pseudo_queries(corpus, n, seed):
    """``n`` held-out pseudo-queries (sentence and keyword queries alternately) from a seeded sample of documents,
    with their source documents as qrels."""
    import pandas as pd

    from pyterrier_lsr.train.domain.queries import document_frequencies, make_queries
    docs = {d['docno']: d['text'] for d in corpus if d['text'].strip()}
    rng = random.Random(seed)
    sample = rng.sample(sorted(docs), min(n, len(docs)))
    queries = make_queries(docs, sample, 'mixed', 1, rng, document_frequencies(docs.values()))
    topics = pd.DataFrame({'qid': [q['qid'] for q in queries], 'query': [q['query'] for q in queries]})
    qrels = pd.DataFrame({'qid': topics['qid'], 'docno': [q['pos'] for q in queries], 'label': 1})
    return topics, qrels


def main():
    args = parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import numpy as np
    import pandas as pd
    import pyterrier as pt
    import pyterrier_alpha as pta
    import torch
    from pyterrier.measures import AP, RR, R, nDCG

    from pyterrier_lsr import LsrIndex
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.quiet import quiet_native
    from pyterrier_lsr.core.storage import write_json
    from pyterrier_lsr.index.bm25 import BM25, bm25_index
    from pyterrier_lsr.kinds.latent_terms import LatentTerms, cache_key, cached_embeddings
    from pyterrier_lsr.report.costs import System, costs, query_times
    from pyterrier_lsr.systems import dense_retriever
    from pyterrier_lsr.train import build_latent_terms

    torch.set_num_threads(args.threads)
    collection = load_collection(args.collection)
    corpus, topics, qrels = collection.corpus, collection.topics, collection.qrels
    workdir = Path(args.workdir) / collection.name
    workdir.mkdir(parents=True, exist_ok=True)
    timings = Timings(workdir / 'times.json')
    cache = workdir / 'embeddings'
    texts = [d['text'] for d in corpus]
    print(f'{collection.name}: {len(corpus)} documents, {len(topics)} topics', flush=True)

    bm25_path = workdir / 'bm25.pisa'
    bm25_built = (bm25_path / 'pt_meta.json').exists()
    index = timings.run('bm25', lambda: bm25_index(bm25_path, corpus), bm25_built)
    bm25 = BM25(index, num_results=1000)
    pq_topics, pq_qrels = pseudo_queries(corpus, args.pseudo_queries, args.seed)
    selection, rows = [], []  # held-out scores of every candidate; the final systems' cost columns

    def cost_row(name, system=None, build=float('nan'), index_mb=float('nan'), postings=float('nan'),
                 pipeline=None):
        """Build seconds, index MB, ms per query (one query at a time, end to end) and postings per query."""
        row = {'name': name, 'build_s': build}
        if system is not None:
            c = costs(system, topics, passes=1)
            row.update(index_mb=c['index_mb'], postings_per_query=c['postings_per_query'],
                       ms_per_query=c['retrieve_ms_median'] + (0 if np.isnan(c['encode_ms_median'])
                                                               else c['encode_ms_median']))
        else:
            row.update(index_mb=index_mb, postings_per_query=postings,
                       ms_per_query=float(np.median(query_times(pipeline, topics))))
        return row

    systems = [bm25]
    with quiet_native(False):
        rows.append(cost_row('BM25', System('BM25', bm25, str(bm25_path)), timings['bm25']))
    for base in args.bases:
        short = Path(base).name
        lengths = {} if args.max_length is None else {'max_length': args.max_length}
        multi = LatentTerms(base, mode='multi', batch_size=args.batch_size, **lengths)
        single_files = [cache / f'{cache_key(multi, texts, m)}.offsets.npy' for m in ('multi', 'single')]
        # one pass embeds the tokens (Latent Terms) and the pooled vectors (dense): its time counts for both
        timings.run(f'embed:{short}', lambda: cached_embeddings(multi, texts, cache),
                    all(f.exists() for f in single_files))
        dense = dense_retriever(corpus, base, cache, batch_size=args.batch_size, **lengths)
        dense_mb = sum(f.stat().st_size for f in cache.glob(f'{cache_key(multi, texts, "single")}.*'))
        rrf_dense = pta.RRFusion(bm25, dense, num_results=1000)
        rows.append(cost_row(f'dense {short}', build=timings[f'embed:{short}'], index_mb=dense_mb / 2**20,
                             postings=len(corpus), pipeline=dense))

        candidates = {}
        for setting in base_candidates(args.candidates, base):
            n_latents, k, max_train, train_tag = sae_setting(setting, args.max_train)
            path = workdir / f'lt.{short}.{n_latents}.{k}.e{args.epochs}.len{multi.max_length}{train_tag}'
            built = LsrIndex(path).built()

            def build():
                if built:
                    return LsrIndex(path)
                with quiet_native(False):
                    return build_latent_terms(corpus, path, base, mode='multi', sqrt_tf=True, cache_dir=cache,
                                              sae={'n_latents': n_latents, 'k': k, 'epochs': args.epochs},
                                              max_train_vectors=max_train, batch_size=args.batch_size,
                                              **lengths)[1]
            lt_index = timings.run(f'lt:{path.name}', build, built)
            for params in args.bm25_params:
                k1, b = map(float, params.split(':'))
                candidates[(setting, k1, b)] = (lt_index, path, lt_index.retriever(k1=k1, b=b))
        held = pt.Experiment([r for _, _, r in candidates.values()], pq_topics, pq_qrels, [RR @ 10, nDCG @ 10],
                             names=[f'{s} k1={k1} b={b}' for s, k1, b in candidates])
        held.insert(0, 'base', short)
        selection += held.to_dict('records')
        print(held.to_string(index=False), flush=True)
        best = list(candidates)[int(np.argmax(held['RR@10'].to_numpy()))]
        lt_index, path, lt = candidates[best]
        lt_name = f'Latent Terms {short} ({best[0]}, k1={best[1]}, b={best[2]})'
        rrf_lt = pta.RRFusion(bm25, lt, num_results=1000)
        systems += [dense, rrf_dense, lt, rrf_lt]
        lt_build = timings[f'embed:{short}'] + timings[f'lt:{path.name}']
        model = lt_index.model()
        with quiet_native(False):
            lt_row = cost_row(lt_name, System(lt_name, lt_index.toks_retriever(k1=best[1], b=best[2]), str(path),
                                              query_side=model.query_encoder()), lt_build)
            rows.append(cost_row(f'RRF(BM25, dense {short})', build=timings['bm25'] + timings[f'embed:{short}'],
                                 index_mb=rows[0]['index_mb'] + dense_mb / 2**20,
                                 postings=rows[0]['postings_per_query'] + len(corpus), pipeline=rrf_dense))
            rows.append(lt_row)
            rows.append(cost_row(f'RRF(BM25, {lt_name})', build=timings['bm25'] + lt_build,
                                 index_mb=rows[0]['index_mb'] + lt_row['index_mb'],
                                 postings=rows[0]['postings_per_query'] + lt_row['postings_per_query'],
                                 pipeline=rrf_lt))

    # rows and systems are both in the order BM25, then per base: dense, RRF(BM25, dense), Latent Terms, RRF(BM25, LT)
    res = pt.Experiment(systems, topics, qrels, [nDCG @ 10, AP(rel=1), R(rel=1) @ 100],
                        names=[r['name'] for r in rows])
    table = res.merge(pd.DataFrame(rows), on='name')
    with pd.option_context('display.width', 250, 'display.max_columns', 20, 'display.max_colwidth', 60):
        print(table.round(3).to_string(index=False))
    output = Path(args.output or f'benchmarks/results/latent_terms_flagship_{collection.name}.json')
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, {'collection': collection.name, 'documents': len(corpus), 'topics': len(topics),
                        'args': recorded_args(args), 'times': timings.times, 'heldout': selection,
                        'table': table.to_dict('records')})


if __name__ == '__main__':
    main()
