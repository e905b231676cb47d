"""PISA, BMP and Seismic on the same encoded corpora: real collections and synthetic ones of up to a million documents.

    python benchmarks/engines.py --irds-cache PATH --sizes 100000 1000000

(a) Real collections (Vaswani, CISI): the documents are encoded once by the offline SPLADE-tiny into one LsrIndex with
    the three engines; every engine/setting is scored by nDCG@10 next to PISA, with its ms/query.
(b) Synthetic corpora: documents drawn from the real SPLADE-tiny document vectors of Vaswani + CISI (the "base", 12,889
    vectors), seeded (``--seed``), chunk by chunk so memory stays bounded. Document i: a base document A (uniform) keeps
    each of its terms with probability 0.8; each term of a second base document B (uniform) joins with probability 0.2
    (a term in both keeps the larger weight); every weight is multiplied by exp(N(0, 0.2^2)). Lengths stay those of
    the base (0.8 |A| + 0.2 |B| on average) and document frequencies grow with the corpus as in the base. The queries
    are the real encoded Vaswani and CISI queries. Per engine/setting: build time, engine index size, ms/query (one
    thread; median and p99 of one-query calls through the PyTerrier retriever, and the mean over one call with all
    queries), and recall@10/@100 against the exact float dot product (scipy sparse products).
(c) ``--bm25``: PISA BM25 on a synthetic text corpus of the largest size (document i = the words of base text A kept
    with probability 0.8 plus those of B with 0.2, same seed), with the real query texts: the moonshot reference.

Prints tables and writes benchmarks/results/engines.json.
"""
import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pyterrier_lsr.collections import load_collection
from pyterrier_lsr.offline import resolve_model, use_irds_cache

PISA_SETTINGS = [{'query_algorithm': a} for a in ('maxscore', 'block_max_wand', 'block_max_maxscore')]
BMP_SETTINGS = [dict(alpha=1., beta=1.), dict(alpha=0.9, beta=1.), dict(alpha=0.8, beta=1.), dict(alpha=0.7, beta=1.),
                dict(alpha=0.9, beta=0.8), dict(alpha=0.8, beta=0.6)]
SEISMIC_SETTINGS = [dict(query_cut=5, heap_factor=0.7), dict(query_cut=10, heap_factor=0.8),
                    dict(query_cut=20, heap_factor=0.9), dict(query_cut=40, heap_factor=1.0)]
KEEP_A, TAKE_B, NOISE = 0.8, 0.2, 0.2


def settings(real: bool):
    """(engine, params) pairs measured; Seismic's brute-force exact mode only on the real (small) collections."""
    out = [('pisa', p) for p in PISA_SETTINGS] + [('bmp', p) for p in BMP_SETTINGS]
    return out + ([('seismic', {'exact': True})] if real else []) + [('seismic', p) for p in SEISMIC_SETTINGS]


def label(engine, params):
    return engine + ('(' + ', '.join(f'{k}={v}' for k, v in params.items()) + ')' if params else '')


def real_index(name, collection, model, workdir):
    from pyterrier_lsr import LsrIndex, SpladeIndexer
    path = workdir / f'{name}.lsr'
    if LsrIndex(path).built():
        return LsrIndex(path, model)
    return SpladeIndexer(path, model, engines=('pisa', 'bmp', 'seismic'), overwrite=True).index(collection.corpus)


def run_real(args, model, collections, workdir):
    import pyterrier as pt
    from pyterrier.measures import nDCG
    from pyterrier_lsr.report import engine_costs
    rows = []
    for name, collection in collections.items():
        index = real_index(name, collection, model, workdir)
        topics = collection.topics
        toks = model.query_encoder()(topics)
        for engine, params in settings(real=True):
            costs, results = engine_costs(index, engine, toks, num_results=1000, **params)
            ndcg = pt.Experiment([pt.Transformer.from_df(results)], topics, collection.qrels, [nDCG @ 10])
            rows.append({'collection': name, 'setting': label(engine, params), **costs,
                         'nDCG@10': float(ndcg['nDCG@10'].iloc[0])})
            print(rows[-1], flush=True)
    return rows


def base_vectors(collections, workdir, model):
    """The base: every real document vector of the collections, as CSR over one term list."""
    terms, indptr, ids, weights, index = {}, [np.zeros(1, np.int64)], [], [], None
    for name, collection in collections.items():
        index = real_index(name, collection, model, workdir)
        _, local_terms, local_indptr, local_ids, local_weights = index.vectors().to_csr()
        mapping = np.array([terms.setdefault(t, len(terms)) for t in local_terms], dtype=np.int64)
        indptr.append(local_indptr[1:] + indptr[-1][-1])
        ids.append(mapping[local_ids])
        weights.append(local_weights)
    return list(terms), np.concatenate(indptr), np.concatenate(ids), np.concatenate(weights)


def gather(indptr, rows):
    """Positions of the postings of ``rows`` (concatenated) and each posting's index into ``rows``."""
    lengths = indptr[rows + 1] - indptr[rows]
    owner = np.repeat(np.arange(len(rows)), lengths)
    starts = np.repeat(indptr[rows] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(lengths.sum()), owner


def synthetic_chunks(base, num_docs, seed, chunk=50_000):
    """Yields ``(first_row, indptr, ids, weights)`` CSR chunks of the synthetic corpus (see the module docs)."""
    terms, indptr, ids, weights = base
    rng = np.random.default_rng(seed)
    num_terms = len(terms)
    for first in range(0, num_docs, chunk):
        n = min(chunk, num_docs - first)
        a, b = rng.integers(0, len(indptr) - 1, n), rng.integers(0, len(indptr) - 1, n)
        pos_a, own_a = gather(indptr, a)
        pos_b, own_b = gather(indptr, b)
        keep_a, keep_b = rng.random(len(pos_a)) < KEEP_A, rng.random(len(pos_b)) < TAKE_B
        rows = np.concatenate([own_a[keep_a], own_b[keep_b]])
        cols = np.concatenate([ids[pos_a[keep_a]], ids[pos_b[keep_b]]])
        vals = np.concatenate([weights[pos_a[keep_a]], weights[pos_b[keep_b]]])
        key = rows.astype(np.int64) * num_terms + cols
        order = np.lexsort((-vals, key))  # per (row, term): the largest weight first
        key, vals = key[order], vals[order]
        first_of = np.concatenate([[True], key[1:] != key[:-1]])
        key, vals = key[first_of], vals[first_of]
        vals = (vals * np.exp(rng.normal(0, NOISE, len(vals)))).astype(np.float32)
        rows, cols = key // num_terms, key % num_terms
        out_indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        yield first, out_indptr, cols, vals


def synthetic_docs(base, num_docs, seed):
    names = np.array(base[0], dtype=object)
    for first, indptr, cols, vals in synthetic_chunks(base, num_docs, seed):
        for i in range(len(indptr) - 1):
            a, b = indptr[i], indptr[i + 1]
            yield {'docno': f's{first + i}', 'toks': dict(zip(names[cols[a:b]].tolist(), vals[a:b].tolist()))}


def exact_top(index, queries, depth=100, chunk=100_000):
    """Exact float dot-product top-``depth`` docnos per query (scipy), chunk by chunk over the documents."""
    from scipy.sparse import csr_matrix
    docnos, terms, indptr, ids, weights = index.vectors().to_csr()
    term_ids = {t: i for i, t in enumerate(terms)}
    q_rows, q_cols, q_vals = [], [], []
    for row, toks in enumerate(queries):
        for t, w in toks.items():
            if t in term_ids:
                q_rows.append(row)
                q_cols.append(term_ids[t])
                q_vals.append(w)
    q = csr_matrix((q_vals, (q_rows, q_cols)), shape=(len(queries), len(terms)), dtype=np.float32)
    best_scores = np.full((len(queries), 0), -1., dtype=np.float32)
    best_ids = np.zeros((len(queries), 0), dtype=np.int64)
    for start in range(0, len(docnos), chunk):
        stop = min(start + chunk, len(docnos))
        d = csr_matrix((weights[indptr[start]:indptr[stop]], ids[indptr[start]:indptr[stop]],
                        indptr[start:stop + 1] - indptr[start]), shape=(stop - start, len(terms)))
        scores = (q @ d.T).toarray()
        best_scores = np.concatenate([best_scores, scores], axis=1)
        best_ids = np.concatenate([best_ids, np.broadcast_to(np.arange(start, stop), scores.shape)], axis=1)
        top = np.argsort(-best_scores, axis=1, kind='stable')[:, :depth]
        best_scores = np.take_along_axis(best_scores, top, 1)
        best_ids = np.take_along_axis(best_ids, top, 1)
    return [[docnos[i] for i, s in zip(ids_row, s_row) if s > 0] for ids_row, s_row in zip(best_ids, best_scores)]


def recall(results, qids, exact, k):
    got = {qid: list(g.sort_values('rank').docno[:k]) for qid, g in results.groupby('qid')}
    values = [len(set(got.get(qid, [])) & set(truth[:k])) / len(truth[:k]) for qid, truth in zip(qids, exact) if truth]
    return float(np.mean(values))


def run_synthetic(args, model, collections, workdir, base, queries):
    from pyterrier_lsr import LsrIndex
    from pyterrier_lsr.report import engine_costs
    rows = []
    for size in args.sizes:
        path = workdir / f'synthetic-{size}.lsr'
        index = LsrIndex(path, scale=args.scale)
        if not index.built():
            start = time.perf_counter()
            LsrIndex(path, scale=args.scale, engines=('pisa',), overwrite=True, batch_size=10_000).index(
                synthetic_docs(base, size, args.seed))
            print(f'{size}: vectors + PISA in {time.perf_counter() - start:.0f} s', flush=True)
        index = LsrIndex(path)
        for engine in ('bmp', 'seismic'):
            if engine not in index.meta['engines']:
                index.build_engine(engine)
                print(f'{size}: {engine} built: {index.meta["engines"][engine]}', flush=True)
        exact = exact_top(index, list(queries['query_toks']))
        gc.collect()
        num_postings = sum(s['num_postings'] for s in index.vectors().manifest['shards'])
        for engine, params in settings(real=False):
            costs, results = engine_costs(index, engine, queries, num_results=100, **params)
            rows.append({'docs': size, 'postings_per_doc': num_postings / size, 'setting': label(engine, params),
                         **costs, 'R@10': recall(results, queries.qid, exact, 10),
                         'R@100': recall(results, queries.qid, exact, 100)})
            print(rows[-1], flush=True)
    return rows


def run_bm25(args, collections, workdir, queries):
    """PISA BM25 on a synthetic text corpus of the largest size (the moonshot reference)."""
    import pyterrier_pisa

    from pyterrier_lsr.report import query_times
    texts = [d['text'].split() for c in collections.values() for d in c.corpus]
    size = max(args.sizes)
    path = workdir / f'synthetic-text-{size}.pisa'
    index = pyterrier_pisa.PisaIndex(str(path), text_field='text', threads=1)
    start = time.perf_counter()
    if not index.built():
        rng = np.random.default_rng(args.seed)

        def docs():
            for i in range(size):
                a, b = texts[rng.integers(len(texts))], texts[rng.integers(len(texts))]
                words = [w for w in a if rng.random() < KEEP_A] + [w for w in b if rng.random() < TAKE_B]
                yield {'docno': f't{i}', 'text': ' '.join(words)}
        index.index(docs())
    build = time.perf_counter() - start
    rows = []
    for algorithm in ('maxscore', 'block_max_wand'):
        retriever = index.bm25(num_results=100, threads=1, query_algorithm=algorithm)
        times = query_times(retriever, queries)
        start = time.perf_counter()
        retriever(queries[['qid', 'query']])
        batch = (time.perf_counter() - start) * 1e3 / len(queries)
        rows.append({'docs': size, 'setting': f'pisa BM25 text ({algorithm})', 'engine_build_s': build,
                     'engine_mb': sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) / 2 ** 20,
                     'ms_median': float(np.median(times)), 'ms_p99': float(np.percentile(times, 99)),
                     'ms_batch': batch})
        print(rows[-1], flush=True)
    return rows


def markdown(rows, columns):
    lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
    for row in rows:
        lines.append('| ' + ' | '.join(f'{row.get(c, ""):.3f}' if isinstance(row.get(c), float) else str(row.get(c, ''))
                                       for c in columns) + ' |')
    return '\n'.join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--collections', nargs='+', default=['irds:vaswani'],
                        help='irds: ids or folders of docs.jsonl, topics.tsv and qrels.txt (e.g. path/to/cisi)')
    parser.add_argument('--sizes', nargs='*', type=int, default=[100_000, 1_000_000])
    parser.add_argument('--scale', type=float, default=100.)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--skip-real', action='store_true')
    parser.add_argument('--bm25', action='store_true')
    parser.add_argument('--workdir', default='/tmp/lsr-engines')
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'engines.json'))
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    from pyterrier_lsr import Splade
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = Splade.from_pretrained(resolve_model(args.model), batch_size=32)
    collections = {c.name: c for c in map(load_collection, args.collections)}
    output = Path(args.output)
    report = json.loads(output.read_text()) if output.exists() else {}
    report.update({'command': 'python benchmarks/engines.py ' + ' '.join(sys.argv[1:]),
                   'machine': platform.processor() or platform.machine(), 'date': time.strftime('%Y-%m-%d %H:%M UTC'),
                   'synthetic': {'keep_a': KEEP_A, 'take_b': TAKE_B, 'noise_sigma': NOISE, 'seed': args.seed}})
    if not args.skip_real:
        report['real'] = run_real(args, model, collections, workdir)
        print(markdown(report['real'], ['collection', 'setting', 'nDCG@10', 'ms_median', 'ms_p99', 'ms_batch',
                                        'engine_mb', 'engine_build_s']))
    queries = pd.concat([model.query_encoder()(c.topics.assign(qid=c.name + '-' + c.topics.qid.astype(str)))
                         for c in collections.values()], ignore_index=True)
    if args.sizes:
        base = base_vectors(collections, workdir, model)
        rows = run_synthetic(args, model, collections, workdir, base, queries)
        report['synthetic_rows'] = [r for r in report.get('synthetic_rows', []) if r['docs'] not in args.sizes] + rows
        print(markdown(rows, ['docs', 'setting', 'R@10', 'R@100', 'ms_median', 'ms_p99', 'ms_batch', 'engine_mb',
                              'engine_build_s']))
    if args.bm25:
        report['bm25'] = run_bm25(args, collections, workdir, queries)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix('.json.tmp')
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(output)


if __name__ == '__main__':
    main()
