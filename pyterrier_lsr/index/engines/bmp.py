"""BMP (block-max pruning, Mallia et al., SIGIR 2024) through the ``bmp`` package: exact or approximate top-k over
blocks of documents.

BMP ranks with narrow integers; the scores returned are PISA's (``sum_t int(q_t * scale) * int(d_t * scale)``, about
``scale**2`` times the dot product): BMP's candidates are re-scored exactly from the engine's forward index
(:mod:`.topk`), and in exact mode (``alpha = beta = 1``) deepened until no document left out can score above the
k-th, so the top-k equals PISA's (up to the order of equal scores).

BMP's integers (bmp 0.2.8):

* document: BMP level ``l = max(1, rint(i * f))`` of PISA's impact ``i = int(w * scale)``, with
  ``f = min(1, max_impact / M)`` (``M``: the largest impact).
* query: level ``L_t = ceil(Q * q_t / max_t q_t)`` of ``q_t = int(w_t * scale)``, with ``Q`` at most 32 (BMP's
  searcher maps its largest weight to 32, so a term no document has is added at 32: the levels are kept as they are).
  Terms the index lacks and weights that quantize to 0 are dropped.  BMP sums scores in 16 bits and wraps past 65,535
  without an error, so ``Q`` is the largest for which no document can pass 65,535: a document scores at most
  ``min(Q * sum_t l_t, max_t l_t * sum_t L_t)``, and the build records, for the documents whose levels sum past
  ``65535 // 32``, the largest level among those of each level sum or more (``wrap.npy``); most queries keep
  ``Q = 32``.  A query no ``Q >= 1`` keeps below the wrap (hundreds of terms, each matched at the top levels by a
  document of thousands of terms) is scored exhaustively from the forward index.
* bound: ``q <= L * max_q / Q`` and ``i <= (l + 1/2) / f``, so a document BMP scores ``s'`` has an exact score of at
  most ``max_q / (Q f) * (s' + sum_t L_t / 2)``: that is the bound on the documents BMP did not return.

``alpha < 1`` stops once the best remaining block bound is below ``1/alpha`` times the k-th score; ``beta < 1`` keeps
only that fraction of the (highest-weighted) query terms for BMP's traversal (done here, as BMP does it); both return
BMP's candidates re-scored with the whole query (PISA's scores), without deepening.

Two flaws of bmp 0.2.8 are worked around.  Its searcher never scores the last block it visits (the one with the lowest
upper bound above its initial threshold ``T = max_t kth_t(k) * L_t``, from each term's precomputed 10th / 100th /
1000th level), and panics when no block is above ``T`` or the query is empty.  So the index ends with a sentinel block
(one document of reserved terms with levels 1, 32 and 255), the engine keeps every term's k-th levels, and each query
asks for the sentinel terms with levels that give the sentinel block the bound ``T + 1`` exactly: it is then the lowest
block above ``T``, visited last, and it is the one left out (also when the index has a single block of documents).
Queries with no term in the index retrieve nothing without calling BMP.  Documents are numbered in BMP by their row,
so results map back to docnos through the forward index.
"""
from functools import partial

import numpy as np
import pyterrier as pt

from ...core import storage
from ...core.checks import check_bool, check_float, check_int
from ..reorder import bisection_order, permute_rows
from .native import Timer, ToksSearcher, check_depth, check_threads, engine_settings, quantized_csr, require
from .topk import Forward, bounded_rescore, certified_top, ranked

# 2: documents numbered by row, forward index kept; 3: heavy documents kept aside; 4: query levels kept below the wrap
FORMAT = 4
INDEX_FILE = 'index.bmp'
KTH_FILE = 'kth.npy'  # [terms, 3]: each term's 10th, 100th and 1000th largest BMP level
WRAP_FILE = 'wrap.npy'  # [n, 2]: level sums (descending) and the largest level of any document of that sum or more
# Names no document can have: terms never contain whitespace, docnos here are row numbers.
SENTINEL_DOCNO = ' bmp sentinel'
# Sentinel terms and levels: with query levels 0-32 they sum to any bound 1..65535 (see _sentinel_levels).
SENTINEL_ONE, SENTINEL_32 = 'bmp sentinel 1', 'bmp sentinel 32'
SENTINEL_255 = [f'bmp sentinel 255 {i}' for i in range(9)]
SENTINEL_DOC = {SENTINEL_ONE: 1, SENTINEL_32: 32, **{t: 255 for t in SENTINEL_255}}
SCALE_TERM = 'bmp scale'  # in no document: asked at MAX_QUERY_LEVEL, so that BMP keeps the other levels as given
MAX_QUERY_LEVEL = 32  # bmp.query.MAX_TERM_WEIGHT: the searcher maps the largest query weight to it
MAX_SCORE = 2 ** 16 - 1  # BMP's scores are 16-bit sums
MAX_LEVEL_SUM = MAX_SCORE // MAX_QUERY_LEVEL  # documents of smaller level sums cannot wrap: 32 times it fits
KTH = (10, 100, 1000)  # the depths whose k-th levels BMP keeps per term
# Exact mode asks BMP first for 2 * START * k candidates up to WIDE, START * k beyond, and at least FIRST_DEPTH: its
# levels are coarser than PISA's impacts, so the exact top-k is rarely certain from BMP's own top-k alone (see
# certified_top; small k need relatively more candidates), and a second, deeper call costs more than a first one a
# little deeper (BMP's cost grows slowly with the depth; measured with benchmarks/engine_exactness.py).
START, WIDE, FIRST_DEPTH = 4, 1000, 128
MAX_TERMS = 2 ** 16 - len(SENTINEL_DOC)  # term ids are 16-bit
CHUNK = 2 ** 22  # postings converted at a time: the temporaries of a build stay small beside its arrays


def _kth_levels(ids: np.ndarray, levels: np.ndarray, num_terms: int) -> np.ndarray:
    """``[num_terms, 3]``: each term's 10th, 100th and 1000th largest level (0 when it has fewer postings), from a
    histogram of each term's levels (built in chunks: no sort of all the postings)."""
    counts = np.zeros(num_terms * 256, dtype=np.int64)
    for start in range(0, len(ids), CHUNK):
        end = start + CHUNK
        counts += np.bincount(ids[start:end].astype(np.int64) * 256 + levels[start:end], minlength=num_terms * 256)
    # at_least[t, l]: postings of term t with a level of l or more (falls with l; every posting's level is >= 1).
    at_least = np.cumsum(counts.reshape(num_terms, 256)[:, ::-1], axis=1)[:, ::-1]
    return np.stack([np.maximum(0, (at_least >= k).sum(axis=1) - 1) for k in KTH], axis=1)


def _first_depth(k: int) -> int:
    return max(FIRST_DEPTH, START * k, min(2 * START * k, WIDE))


def _sentinel_levels(bound: int) -> dict:
    """Query levels (1-32) of the sentinel terms whose score on the sentinel document is exactly ``bound``."""
    a, rest = divmod(bound, 255)
    levels = {SENTINEL_32: rest // 32, SENTINEL_ONE: rest % 32}
    for term in SENTINEL_255:
        levels[term], a = min(a, MAX_QUERY_LEVEL), a - min(a, MAX_QUERY_LEVEL)
    return {t: level for t, level in levels.items() if level}


def _levels(impacts, max_impact: int):
    """``(factor, levels)``: BMP's levels (uint8) of PISA's impacts (see the module notes)."""
    factor = min(1., max_impact / int(impacts.max()))
    levels = np.empty(len(impacts), dtype=np.uint8)
    for start in range(0, len(impacts), CHUNK):  # the float64 products of a chunk at a time
        levels[start:start + CHUNK] = np.maximum(1, np.rint(impacts[start:start + CHUNK] * factor))
    return factor, levels


def _wrap_frontier(indptr, levels) -> np.ndarray:
    """``[n, 2]``, n <= 255: level sums past :data:`MAX_LEVEL_SUM` (descending) and the largest level of any document
    whose levels sum to that or more, at each sum where that largest level grows (:func:`_query_levels` reads it)."""
    lengths = np.diff(indptr)
    filled = np.flatnonzero(lengths > 0)
    sums, tops = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    if len(filled):
        sums[filled] = np.add.reduceat(levels, indptr[:-1][filled], dtype=np.int64)
        tops[filled] = np.maximum.reduceat(levels, indptr[:-1][filled])
    over = np.flatnonzero(sums > MAX_LEVEL_SUM)
    order = over[np.argsort(-sums[over], kind='stable')]
    largest = np.maximum.accumulate(tops[order])
    grows = np.flatnonzero(np.diff(largest, prepend=0) > 0)
    return np.stack([sums[order][grows], largest[grows]], axis=1)


def _query_levels(weights: np.ndarray, frontier: np.ndarray):
    """``(Q, levels)``: the query's levels (int64, of ``weights``, PISA's query impacts) at the largest ``Q <= 32``
    whose BMP scores cannot wrap (see the module notes), or ``None`` when no ``Q >= 1`` is safe."""
    top = int(weights.max())
    for most in range(MAX_QUERY_LEVEL, 0, -1):
        levels = -(-weights * most // top)
        # Documents whose levels sum past MAX_SCORE // most could wrap but for their largest level: the largest one.
        at_risk = int(np.searchsorted(-frontier[:, 0], -(MAX_SCORE // most), side='left'))
        if not at_risk or int(frontier[at_risk - 1, 1]) * int(levels.sum()) <= MAX_SCORE:
            return most, levels
    return None


class BmpEngine:
    name = 'bmp'
    subfolder = 'bmp'
    extra = 'engines'
    scorings = {'dot'}

    def build(self, index, folder, block_size: int = 32, compress_range: bool = False, max_impact: int = 127,
              reorder: bool = False, verbose: bool = True) -> dict:
        """``block_size`` documents per block (1-256); ``compress_range`` compresses the per-block maxima;
        ``max_impact`` (1-255) is the largest BMP level; ``reorder`` numbers the
        documents by recursive graph bisection first (:mod:`..reorder`: tighter blocks; results map back to the
        docnos as always, through the forward index); ``verbose`` shows its progress."""
        bmp = require('bmp', 'bmp')
        block_size = check_int('block_size', block_size, 1, 256)
        compress_range = check_bool('compress_range', compress_range)
        max_impact = check_int('max_impact', max_impact, 1, 255)
        reorder = check_bool('reorder', reorder)
        verbose = check_bool('verbose', verbose)
        with Timer() as timer:
            docnos, terms, indptr, ids, impacts = quantized_csr(index)
            if reorder:
                order = bisection_order(indptr, ids, len(terms), verbose=verbose)
                docnos, indptr, ids, impacts = permute_rows(order, docnos, indptr, ids, impacts)
            if len(terms) > MAX_TERMS:
                raise ValueError(f'BMP numbers terms in 16 bits: the index has {len(terms)} terms, at most '
                                 f'{MAX_TERMS} fit')
            factor, levels = _levels(impacts, max_impact)
            largest = int(impacts.max())
            # Written before BMP is fed, which holds its whole index in memory: the impacts are not needed then.
            Forward.write(folder, docnos, terms, indptr, ids, impacts)
            del impacts
            storage.write_array(folder / KTH_FILE, _kth_levels(ids, levels, len(terms)))
            storage.write_array(folder / WRAP_FILE, _wrap_frontier(indptr, levels))
            names = np.array(terms, dtype=object)
            indexer = bmp.Indexer(str(folder / INDEX_FILE), bsize=block_size, compress_range=compress_range)
            for row in range(len(docnos)):
                start, end = indptr[row], indptr[row + 1]
                indexer.add_document(str(row), dict(zip(names[ids[start:end]].tolist(), levels[start:end].tolist())))
            # Empty documents fill the last block, so that the sentinel has a block of its own.
            pads = -len(docnos) % block_size
            for pad in range(pads):
                indexer.add_document(f'{SENTINEL_DOCNO} {pad}', {})
            indexer.add_document(SENTINEL_DOCNO, SENTINEL_DOC)
            indexer.finish()
        return {'format': FORMAT, 'block_size': block_size, 'compress_range': compress_range,
                'max_impact': max_impact, 'reorder': reorder, 'largest_impact': largest,
                'impact_factor': factor,
                'bmp_documents': len(docnos) + pads + 1, 'build_seconds': round(timer.seconds, 3)}

    def retriever(self, index, folder, num_results: int, alpha: float = 1., beta: float = 1., threads: int = 1,
                  verbose: bool = False) -> pt.Transformer:
        """``alpha``/``beta`` in (0, 1]: 1 and 1 is exact (see the module notes); ``threads`` must be 1 (bmp's
        searcher runs one query at a time and holds the GIL)."""
        bmp = require('bmp', 'bmp')
        alpha = check_float('alpha', alpha, 0, 1, exclusive_minimum=True)
        beta = check_float('beta', beta, 0, 1, exclusive_minimum=True)
        if check_threads(threads) != 1:
            raise ValueError('bmp 0.2.8 searches one query at a time holding the GIL; use threads=1')
        check_bool('verbose', verbose)
        k = check_depth(index, num_results)
        settings = engine_settings(index, self.name, 'BMP', FORMAT)
        factor = settings['impact_factor']
        # Deep enough for BMP to return every matching document, with no initial threshold (k > 1000).
        limit = max(settings['bmp_documents'], KTH[-1] + 1)
        forward = Forward(folder)
        kth = np.load(folder / KTH_FILE, allow_pickle=False)
        frontier = np.load(folder / WRAP_FILE, allow_pickle=False)
        searcher = bmp.Searcher(str(folder / INDEX_FILE))
        scale = index.scale
        exact = alpha == 1 and beta == 1
        every = np.arange(len(forward.docnos))

        def search_one(toks):
            full = query = forward.query(toks, scale)
            if beta < 1:  # BMP traverses the heaviest terms only; its candidates are re-scored with all of them
                kept = sorted(query, key=lambda t: (-query[t], t))[:int(np.ceil(len(query) * beta))]
                query = {t: query[t] for t in kept}
            if not query:
                return np.zeros(0, np.int64), np.zeros(0)
            chosen = _query_levels(np.array(list(query.values()), dtype=np.int64), frontier)
            if chosen is None:  # BMP could wrap for this query: every document scored exactly instead
                return ranked(every, forward.rescore(full), k)
            most, levels = chosen
            levels = dict(zip(query, levels.tolist()))
            named = {forward.terms[t]: float(level) for t, level in levels.items()}
            named[SCALE_TERM] = float(MAX_QUERY_LEVEL)
            slack, top = sum(levels.values()) / 2, max(query.values())

            def at_most(bmp_scores):  # the exact scores of documents BMP scores so, at most (see the module notes)
                return top / (most * factor) * (bmp_scores + slack) * (1 + 1e-9)

            last = {}  # the bounds of the candidates candidates() returned last, for rescore()

            def candidates(depth):
                column = sum(depth > d for d in KTH)  # the k-th level BMP's initial threshold uses
                threshold = max(int(kth[t, column]) * level for t, level in levels.items()) if column < len(KTH) else 0
                asked = dict(named, **{t: float(v) for t, v in _sentinel_levels(threshold + 1).items()})
                docnos, scores = searcher.search(asked, k=depth, alpha=alpha, beta=1.)
                scores = np.asarray(scores, dtype=np.float64)
                try:
                    rows, found = np.fromiter(map(int, docnos), dtype=np.int64, count=len(docnos)), scores
                except ValueError:  # the sentinel (or a padding document) is among them
                    real = np.array([not d.startswith(' ') for d in docnos], dtype=bool)
                    rows = np.fromiter((int(d) for d, keep in zip(docnos, real) if keep), dtype=np.int64)
                    found = scores[real]
                order = np.argsort(-found, kind='stable')
                rows, last['bounds'] = rows[order], at_most(found[order])
                # Left out: documents BMP scored at most the lowest score kept (when it kept `depth`), or at most T.
                lowest = max(scores.min(), threshold) if len(docnos) == depth else threshold
                return rows, at_most(lowest) if lowest else 0.

            exact_scores = partial(forward.rescore, full)
            if exact:
                rescore = lambda rows: bounded_rescore(exact_scores, rows, last['bounds'], k)  # noqa: E731
                rows, scores = certified_top(candidates, rescore, k, limit, start=_first_depth(k))
            else:  # the bounds are of the terms BMP traversed, not of the whole query when beta < 1: all re-scored
                rows = candidates(k)[0]
                rows, scores = ranked(rows, exact_scores(rows), k)
            return rows, scores

        return ToksSearcher(lambda queries: [search_one(q) for q in queries], forward.docnos,
                            f'BMP(alpha={alpha}, beta={beta})')
