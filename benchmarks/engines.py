"""PISA, BMP and Seismic on the same encoded corpora: real collections and synthetic ones of up to a million documents.

    PYTHONPATH=. python benchmarks/engines.py --irds-cache PATH --collections irds:vaswani path/to/cisi \
        --sizes 1000000 --bm25 --workdir path/to/work

(a) Real collections (Vaswani, CISI): the documents are encoded once by the offline SPLADE-tiny into one LsrIndex with
    the three engines; every engine/setting is scored by nDCG@10 next to PISA, with its ms/query.
(b) Synthetic corpora: documents drawn from the real SPLADE-tiny document vectors of Vaswani + CISI (the "base", 12,889
    vectors), seeded (``--seed``), chunk by chunk so memory stays bounded. Document i: a base document A (uniform) keeps
    each of its terms with probability 0.8; each term of a second base document B (uniform) joins with probability 0.2
    (a term in both keeps the larger weight); every weight is multiplied by exp(N(0, 0.2^2)). Lengths stay those of
    the base (0.8 |A| + 0.2 |B| on average) and document frequencies grow with the corpus as in the base. The queries
    are the real encoded Vaswani and CISI queries. Per engine/setting and depth k (``--depths``): ms/query (one
    thread; median and p99 of one-query calls through the PyTerrier retriever, and the mean over one call with all
    queries), the engine's own share of it (the native search calls: PISA's ``retrieve``, BMP's and Seismic's
    searches; the rest is our wrapper: validation, re-scoring, result frames), and recall@10/@k against the exact
    float dot product (scipy sparse products).
(c) ``--bm25``: PISA BM25 on a synthetic text corpus of each size (document i = the words of base text A kept with
    probability 0.8 plus those of B with 0.2, same seed), with the real query texts: the reference to beat.

Resumable: every index is kept under ``--workdir`` (the vectors + PISA, each further engine, the BM25 text index) and
every measured row in ``rows-<size>-<engine>.json`` there; a rerun skips what is built and measured
(``--remeasure ENGINE`` measures an engine again; runs measuring different ``--engines`` may share the folder).
Each build runs in a child process whose peak RSS is recorded (``builds.json``).
Prints tables and writes benchmarks/results/engines.json.
"""
import argparse
import gc
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pyterrier_lsr.core.collection import load_collection
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import use_irds_cache
from pyterrier_lsr.core.storage import read_json, write_json

PISA_SETTINGS = [{'query_algorithm': a} for a in ('maxscore', 'block_max_wand', 'block_max_maxscore')]
BMP_SETTINGS = [dict(alpha=1., beta=1.), dict(alpha=0.9, beta=1.), dict(alpha=0.8, beta=1.), dict(alpha=0.7, beta=1.),
                dict(alpha=0.9, beta=0.8), dict(alpha=0.8, beta=0.6)]
SEISMIC_SETTINGS = [dict(query_cut=5, heap_factor=0.7), dict(query_cut=10, heap_factor=0.8),
                    dict(query_cut=20, heap_factor=0.9), dict(query_cut=40, heap_factor=1.0),
                    # more accurate: at 1M documents the four above stay below R@10 0.99
                    dict(query_cut=30, heap_factor=0.7), dict(query_cut=50, heap_factor=0.5),
                    # the rest of the grid query_cut 10 / 20 / 30 x heap_factor 0.8 / 0.9 / 1.0
                    *(dict(query_cut=c, heap_factor=h) for c, h in ((10, 0.9), (10, 1.0), (20, 0.8), (20, 1.0),
                                                                    (30, 0.8), (30, 0.9), (30, 1.0)))]
BM25_ALGORITHMS = ('maxscore', 'block_max_wand', 'block_max_maxscore')
SETTINGS = {'pisa': PISA_SETTINGS, 'bmp': BMP_SETTINGS, 'seismic': SEISMIC_SETTINGS}
# Synthetic runs: the vectors (+ PISA) and Seismic first, so that a run cut short still has an LSR engine to compare.
SYNTHETIC_ORDER = ('pisa', 'seismic', 'bm25', 'bmp')
KEEP_A, TAKE_B, NOISE = 0.8, 0.2, 0.2
GIB = 2 ** 30


def settings(real: bool):
    """(engine, params) pairs measured; Seismic's brute-force exact mode only on the real (small) collections."""
    out = [('pisa', p) for p in PISA_SETTINGS] + [('bmp', p) for p in BMP_SETTINGS]
    return out + ([('seismic', {'exact': True})] if real else []) + [('seismic', p) for p in SEISMIC_SETTINGS]


def label(engine, params):
    return engine + ('(' + ', '.join(f'{k}={v}' for k, v in params.items()) + ')' if params else '')


class EngineClock:
    """Seconds spent inside the engines' native search calls since the last :meth:`reset`.

    The engine packages' classes are wrapped once (:meth:`install`, after every build of this process): PISA's
    ``_pisathon.retrieve``, ``bmp.Searcher.search`` and Seismic's ``batch_search``/``search`` add their time here; the
    rest of a retriever call is ours."""

    def __init__(self):
        self.seconds = 0.

    def reset(self):
        self.seconds = 0.

    def timed(self, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return call

    def install(self):
        import bmp
        import pyterrier_pisa
        import seismic
        pyterrier_pisa._pisathon = _Timed(pyterrier_pisa._pisathon, self, {'retrieve'})
        bmp.Searcher = _TimedClass(bmp.Searcher, self, {'search'})
        for name in ('SeismicIndex', 'SeismicIndexLV', 'SeismicDataset', 'SeismicDatasetLV'):
            setattr(seismic, name, _TimedClass(getattr(seismic, name), self, {'search', 'batch_search'}))


class _Timed:
    """``target`` with the methods ``names`` timed by ``clock``; everything else passed through."""

    def __init__(self, target, clock, names):
        self._target, self._clock, self._names = target, clock, names

    def __getattr__(self, name):
        value = getattr(self._target, name)
        return self._clock.timed(value) if name in self._names else value


class _TimedClass(_Timed):
    """A class whose instances (made by calling it or by its ``load``) are :class:`_Timed`."""

    def __call__(self, *args, **kwargs):
        return _Timed(self._target(*args, **kwargs), self._clock, self._names)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if name == 'load':
            return lambda *args, **kwargs: _Timed(value(*args, **kwargs), self._clock, self._names)
        return value


CLOCK = EngineClock()


def timed_calls(retriever, frame, passes=1):
    """Per query (one-query calls, after a warm-up call): total ms and the engine's ms; then one call on the whole
    frame: ``(results, total ms, engine ms)``."""
    retriever(frame.iloc[:1])
    total, engine = np.zeros(len(frame)), np.zeros(len(frame))
    for _ in range(passes):
        for i in range(len(frame)):
            CLOCK.reset()
            start = time.perf_counter()
            retriever(frame.iloc[[i]])
            total[i] += (time.perf_counter() - start) * 1e3 / passes
            engine[i] += CLOCK.seconds * 1e3 / passes
    CLOCK.reset()
    start = time.perf_counter()
    results = retriever(frame)
    return total, engine, (results, (time.perf_counter() - start) * 1e3, CLOCK.seconds * 1e3)


def latency(retriever, frame):
    """``(costs, results)``: ms/query of one-query calls (median, p99) and of one call on all queries, each with the
    engine's own share (native calls over the whole time)."""
    total, engine, (results, batch, batch_engine) = timed_calls(retriever, frame)
    n = max(1, len(frame))
    return {'ms_median': float(np.median(total)), 'ms_p99': float(np.percentile(total, 99)),
            'engine_ms_median': float(np.median(engine)), 'wrapper_share': float(1 - engine.sum() / total.sum()),
            'ms_batch': batch / n, 'engine_ms_batch': batch_engine / n,
            'wrapper_share_batch': float(1 - batch_engine / batch)}, results


def engine_mb(index, engine):
    from pyterrier_lsr.report.costs import engine_footprint
    return engine_footprint(index.path, engine)['engine_mb']


# -- builds, each in a child process (peak RSS) -------------------------------------------------------------------

def build_child(args, step, size):
    """Runs ``--build-step step`` in a child process; returns its wall seconds and peak RSS (GiB)."""
    command = [sys.executable, __file__, '--build-step', step, '--sizes', str(size), '--workdir', args.workdir,
               '--seed', str(args.seed), '--scale', str(args.scale), '--collections', *args.collections]
    if args.bmp_reorder:
        command.append('--bmp-reorder')
    if args.irds_cache:
        command += ['--irds-cache', args.irds_cache]
    start = time.perf_counter()
    child = subprocess.Popen(command)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f'building {step} for {size} documents failed (exit status {status})')
    return {'seconds': round(time.perf_counter() - start, 1), 'peak_rss_gib': round(usage.ru_maxrss * 1024 / GIB, 3)}


def ensure_built(args, workdir, size, step, built, key=None):
    """Builds ``step`` for ``size`` documents unless ``built()``; the record of its build (``builds.json``, under
    ``key``, default the step)."""
    file, key = workdir / 'builds.json', f'{size}/{key or step}'
    if not built():
        print(f'{size}: building {step}', flush=True)
        record = build_child(args, step, size)
        # Read again after the build: runs measuring other engines may have recorded theirs meanwhile.
        records = read_json(file, 'build records') if file.exists() else {}
        write_json(file, dict(records, **{key: record}))
        print(f'{size}: {step} built: {record}', flush=True)
    return (read_json(file, 'build records') if file.exists() else {}).get(key, {})


def build_step(args):
    """The child's work: one build (``args.build_step``) for ``args.sizes[0]`` documents."""
    from pyterrier_lsr import LsrIndex
    workdir, size = Path(args.workdir), args.sizes[0]
    collections = {c.name: c for c in map(load_collection, args.collections)}
    if args.build_step == 'bm25':
        build_bm25(args, collections, workdir, size)
    elif args.build_step == 'vectors':
        base = base_vectors(collections, workdir, None)
        LsrIndex(synthetic_path(workdir, size), scale=args.scale, engines=('pisa',), overwrite=True,
                 batch_size=10_000, verbose=False).index(synthetic_docs(base, size, args.seed))
    elif args.build_step == 'bmp':
        LsrIndex(synthetic_path(workdir, size)).build_engine('bmp', overwrite=True, reorder=args.bmp_reorder,
                                                             verbose=True)
    else:
        LsrIndex(synthetic_path(workdir, size)).build_engine(args.build_step)


def synthetic_path(workdir, size):
    return workdir / f'synthetic-{size}.lsr'


def text_path(workdir, size):
    return workdir / f'synthetic-text-{size}.pisa'


def real_index(name, collection, model, workdir):
    from pyterrier_lsr import LsrIndex, SpladeIndexer
    path = workdir / f'{name}.lsr'
    if LsrIndex(path).built():
        return LsrIndex(path, model)
    return SpladeIndexer(path, model, engines=('pisa', 'bmp', 'seismic'), overwrite=True).index(collection.corpus)


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


def chunked_top(indptr, ids, values, num_terms, score, depth, chunk=100_000):
    """``(rows, scores)`` [queries, depth] of the best documents by ``score(documents CSR chunk) -> [queries, chunk]``,
    chunk by chunk over the documents (ties by row)."""
    from scipy.sparse import csr_matrix
    best_scores, best_ids = None, None
    for start in range(0, len(indptr) - 1, chunk):
        stop = min(start + chunk, len(indptr) - 1)
        d = csr_matrix((values[indptr[start]:indptr[stop]], ids[indptr[start]:indptr[stop]],
                        indptr[start:stop + 1] - indptr[start]), shape=(stop - start, num_terms))
        scores = np.asarray(score(d), dtype=np.float64)
        chunk_ids = np.broadcast_to(np.arange(start, stop), scores.shape)
        if best_scores is not None:
            scores, chunk_ids = np.concatenate([best_scores, scores], axis=1), np.concatenate([best_ids, chunk_ids], 1)
        top = np.argsort(-scores, axis=1, kind='stable')[:, :depth]
        best_scores, best_ids = np.take_along_axis(scores, top, 1), np.take_along_axis(chunk_ids, top, 1)
    return best_ids, best_scores


def exact_top(index, queries, depth=100):
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
    best_ids, best_scores = chunked_top(indptr, ids, weights, len(terms), lambda d: (q @ d.T).toarray(), depth)
    return [[docnos[i] for i, s in zip(ids_row, s_row) if s > 0] for ids_row, s_row in zip(best_ids, best_scores)]


def exact_integer_top(index, queries, k=10, keep=64):
    """Per query, the rows of the index's own exact ranking at depth ``k`` with ties: every document whose integer
    score (PISA's, ``sum_t int(q_t * scale) * int(d_t * scale)``) reaches the k-th (a set), and how many documents
    match at all (at most ``k``). Engines rank those integers, so this is the reference their own approximation is
    measured against; the float ranking adds the index's quantization on top (:func:`exact_top`)."""
    from pyterrier_lsr.index.engines.native import quantized_csr
    docnos, terms, indptr, ids, impacts = quantized_csr(index)
    term_ids = {t: i for i, t in enumerate(terms)}
    q = np.zeros((len(terms), len(queries)))
    for col, toks in enumerate(queries):
        for t, w in toks.items():
            if t in term_ids and int(w * index.scale) > 0:
                q[term_ids[t], col] = int(w * index.scale)
    # Exact: integer sums below 2**53.
    best_ids, best_scores = chunked_top(indptr, ids, impacts.astype(np.float64), len(terms), lambda d: (d @ q).T,
                                        keep)
    out = []
    for ids_row, s_row in zip(best_ids, best_scores):
        matching = int((s_row > 0).sum())
        kth = s_row[min(k, matching) - 1] if matching else 1.
        if matching >= keep and s_row[-1] >= kth:
            raise ValueError(f'more than {keep} documents tie at the {k}-th score: raise keep')
        out.append(({docnos[i] for i, s in zip(ids_row, s_row) if s >= kth and s > 0}, min(k, matching)))
    return out


def tied_recall(results, qids, exact, k=10):
    """Recall@k against :func:`exact_integer_top`: a returned document counts when its exact score reaches the k-th."""
    got = {qid: list(g.sort_values('rank').docno[:k]) for qid, g in results.groupby('qid')}
    return float(np.mean([len(set(got.get(qid, [])) & truth) / n for qid, (truth, n) in zip(qids, exact) if n]))


def recall(results, qids, exact, k):
    got = {qid: list(g.sort_values('rank').docno[:k]) for qid, g in results.groupby('qid')}
    values = [len(set(got.get(qid, [])) & set(truth[:k])) / len(truth[:k]) for qid, truth in zip(qids, exact) if truth]
    return float(np.mean(values))


class Rows:
    """The measured rows of one size and engine, kept in ``rows-<size>-<engine>.json`` under the work folder as they
    are measured (one file per engine: runs measuring different engines may share the folder)."""

    def __init__(self, workdir, size, engine, remeasure):
        self.file = workdir / f'rows-{size}-{engine}.json'
        kept = self.file.exists() and engine not in remeasure
        self.rows = read_json(self.file, 'measured rows', expect=list) if kept else []

    def has(self, setting, k):
        return any(r['setting'] == setting and r['k'] == k for r in self.rows)

    def add(self, row):
        self.rows.append(row)
        write_json(self.file, self.rows)
        print(row, flush=True)


def run_real(args, model, collections, workdir):
    import pyterrier as pt
    from pyterrier.measures import nDCG
    rows = []
    for name, collection in collections.items():
        index = real_index(name, collection, model, workdir)
        topics = collection.topics
        toks = model.query_encoder()(topics)
        for engine, params in settings(real=True):
            costs, results = latency(index.toks_retriever(1000, engine=engine, **params), toks)
            ndcg = pt.Experiment([pt.Transformer.from_df(results)], topics, collection.qrels, [nDCG @ 10])
            rows.append({'collection': name, 'setting': label(engine, params), 'engine': engine, 'k': 1000, **costs,
                         'engine_mb': engine_mb(index, engine), 'nDCG@10': float(ndcg['nDCG@10'].iloc[0])})
            print(rows[-1], flush=True)
    return rows


def run_synthetic(args, workdir, queries, size, engines):
    from pyterrier_lsr import LsrIndex
    path = synthetic_path(workdir, size)
    exact, num_postings, out = None, None, []
    for engine in engines:
        reorder = engine == 'bmp' and args.bmp_reorder
        name = 'bmp-reordered' if reorder else engine  # its rows, build record and labels
        rows = Rows(workdir, size, name, args.remeasure)
        out.append(rows)
        if engine == 'bm25':
            build = ensure_built(args, workdir, size, 'bm25', lambda: is_built_text(text_path(workdir, size)))
            measure_bm25(args, workdir, size, queries, rows, build)
            continue
        if engine != 'pisa':  # BMP and Seismic are built from the vectors (+ PISA), which a run without pisa lacks
            ensure_built(args, workdir, size, 'vectors', lambda: LsrIndex(path).built())
        step = 'vectors' if engine == 'pisa' else engine

        def built():
            index = LsrIndex(path)
            return index.built() and engine in index.meta['engines'] and (
                engine != 'bmp' or index.meta['engines']['bmp'].get('reorder', False) == reorder)

        build = ensure_built(args, workdir, size, step, built, key=name if reorder else step)
        index = LsrIndex(path)
        todo = [(p, k) for p in SETTINGS[engine] for k in args.depths if not rows.has(label(name, p), k)]
        if not todo:
            continue
        if exact is None:
            exact = exact_top(index, list(queries['query_toks']), depth=max(args.depths))
            exact_int = exact_integer_top(index, list(queries['query_toks']))
            num_postings = sum(s['num_postings'] for s in index.vectors().manifest['shards'])
            gc.collect()
        for params, k in todo:
            costs, results = latency(index.toks_retriever(k, engine=engine, **params), queries)
            rows.add({'docs': size, 'postings_per_doc': num_postings / size, 'setting': label(name, params),
                      'engine': engine, 'k': k, **costs, 'R@10': recall(results, queries.qid, exact, 10),
                      f'R@{k}': recall(results, queries.qid, exact, k),
                      'R@10 vs exact integers': tied_recall(results, queries.qid, exact_int),
                      'engine_mb': engine_mb(index, engine),
                      'build_s': build.get('seconds'), 'build_peak_rss_gib': build.get('peak_rss_gib'),
                      'load': os.getloadavg()[0]})
    return [row for rows in out for row in rows.rows]


def is_built_text(path):
    import pyterrier_pisa
    return pyterrier_pisa.PisaIndex(str(path)).built()


def build_bm25(args, collections, workdir, size):
    """PISA BM25 on a synthetic text corpus of ``size`` documents (see the module docs)."""
    import pyterrier_pisa
    texts = [d['text'].split() for c in collections.values() for d in c.corpus]
    rng = np.random.default_rng(args.seed)

    def docs():
        for i in range(size):
            a, b = texts[rng.integers(len(texts))], texts[rng.integers(len(texts))]
            words = [w for w in a if rng.random() < KEEP_A] + [w for w in b if rng.random() < TAKE_B]
            yield {'docno': f't{i}', 'text': ' '.join(words)}
    pyterrier_pisa.PisaIndex(str(text_path(workdir, size)), text_field='text', threads=1).index(docs())


def measure_bm25(args, workdir, size, queries, rows, build):
    import pyterrier_pisa
    path = text_path(workdir, size)
    index = pyterrier_pisa.PisaIndex(str(path), text_field='text', threads=1)
    for algorithm in BM25_ALGORITHMS:
        for k in args.depths:
            setting = f'pisa BM25 text ({algorithm})'
            if rows.has(setting, k):
                continue
            costs, _ = latency(index.bm25(num_results=k, threads=1, query_algorithm=algorithm),
                               queries[['qid', 'query']])
            rows.add({'docs': size, 'setting': setting, 'engine': 'bm25', 'k': k, **costs,
                      'engine_mb': sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) / 2 ** 20,
                      'build_s': build.get('seconds'), 'build_peak_rss_gib': build.get('peak_rss_gib'),
                      'load': os.getloadavg()[0]})


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
    parser.add_argument('--depths', nargs='+', type=int, default=[10, 1000], help='the k of each measured retriever')
    parser.add_argument('--engines', nargs='+', default=['pisa', 'seismic', 'bmp'], choices=SYNTHETIC_ORDER,
                        help='the engines measured on the synthetic corpora (bm25: as --bm25)')
    parser.add_argument('--scale', type=float, default=100.)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--skip-real', action='store_true')
    parser.add_argument('--bm25', action='store_true')
    parser.add_argument('--remeasure', nargs='*', default=[],
                        help='engines (or bm25) whose kept rows are measured again')
    parser.add_argument('--workdir', default='lsr-engines-work', help='where the indexes and measured rows are kept')
    parser.add_argument('--irds-cache')
    parser.add_argument('--bmp-reorder', action='store_true',
                        help='build BMP on documents reordered by recursive graph bisection (rows "bmp-reordered")')
    parser.add_argument('--build-step', choices=['vectors', 'bmp', 'seismic', 'bm25'], help=argparse.SUPPRESS)
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'engines.json'))
    args = parser.parse_args()
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    if args.build_step:
        return build_step(args)
    import torch
    torch.set_num_threads(1)
    from pyterrier_lsr import Splade
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = Splade.from_pretrained(resolve_model(args.model), batch_size=32)
    collections = {c.name: c for c in map(load_collection, args.collections)}
    for name, collection in collections.items():
        real_index(name, collection, model, workdir)
    CLOCK.install()  # after every build of this process: native builders must see the engines' own classes
    output = Path(args.output)
    report = read_json(output, 'the benchmark results') if output.exists() else {}
    report.update({'command': 'python benchmarks/engines.py ' + ' '.join(sys.argv[1:]),
                   'machine': platform.processor() or platform.machine(), 'date': time.strftime('%Y-%m-%d %H:%M UTC'),
                   'synthetic': {'keep_a': KEEP_A, 'take_b': TAKE_B, 'noise_sigma': NOISE, 'seed': args.seed}})
    if not args.skip_real:
        report['real'] = run_real(args, model, collections, workdir)
        print(markdown(report['real'], ['collection', 'setting', 'nDCG@10', 'ms_median', 'ms_p99', 'ms_batch',
                                        'wrapper_share', 'engine_mb']))
    queries = pd.concat([model.query_encoder()(c.topics.assign(qid=c.name + '-' + c.topics.qid.astype(str)))
                         for c in collections.values()], ignore_index=True)
    engines = [e for e in SYNTHETIC_ORDER if e in args.engines or (e == 'bm25' and args.bm25)]
    rows = []
    for size in args.sizes:
        rows += run_synthetic(args, workdir, queries, size, engines)
    report['synthetic_rows'] = [r for r in report.get('synthetic_rows', []) if r['docs'] not in args.sizes] + rows
    report['builds'] = read_json(workdir / 'builds.json', 'build records') if (workdir / 'builds.json').exists() else {}
    print(markdown(rows, ['docs', 'setting', 'k', 'R@10', 'R@10 vs exact integers', 'ms_median', 'ms_p99', 'ms_batch',
                          'wrapper_share', 'build_peak_rss_gib', 'engine_mb', 'build_s']))
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json(output, report)


if __name__ == '__main__':
    main()
