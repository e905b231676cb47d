"""BMP (block-max pruning, Mallia et al., SIGIR 2024) through the ``bmp`` package: exact or approximate top-k over
blocks of documents.

How BMP's integers relate to the index ``scale`` (BMP stores 8-bit impacts and quantizes queries itself):

* document: BMP impact = ``max(1, round(int(w * scale) * f))`` with ``f = min(1, max_impact / M)``, where ``M`` is
  the largest PISA impact in the index (recorded as ``largest_impact``, with ``f`` as ``impact_factor``): PISA's impacts
  mapped linearly onto 0-``max_impact`` (a build parameter, default 127 of BMP's 255), keeping exactly the terms PISA
  keeps (none rounds to 0);
* query: the retriever passes PISA's query weights ``int(q * scale)`` (terms the index never saw, and weights that
  quantize to 0, dropped); BMP's searcher maps them to ``ceil(q_int * 32 / max_t q_int)`` (at most 32 levels);
* score: BMP's integer score divided by ``f * 32 / max_t q_int``, i.e. PISA's ``sum_t int(q_t * scale) *
  int(d_t * scale)`` (about ``scale**2`` times the dot product) up to BMP's 8-bit/5-bit rounding.

``alpha=1, beta=1`` (the defaults) are BMP's exact mode: the exact top-k of those quantized scores, so rankings match
PISA's except where the rounding reorders near-ties.  ``alpha < 1`` stops once the best remaining block bound is below
``1/alpha`` times the k-th score; ``beta < 1`` keeps only that fraction of the (highest-weighted) query terms.

Two flaws of bmp 0.2.8 are worked around here.  Its searcher never scores the last block it visits (the one with the
lowest upper bound above its initial threshold ``T = max_t kth_t(k) * q_t``, from each term's precomputed 10th /
100th / 1000th impact), and panics when no block is above ``T`` or the query is empty.  So the index ends with a
sentinel block (one document of reserved terms with impacts 1, 32 and 255), ``terms.json`` keeps every term's k-th
impacts, and each query asks for the sentinel terms with weights that give the sentinel block the bound ``T + 1``
exactly: it is then the lowest block above ``T``, visited last, and it is the one left out (in exact mode
``beta = 1``; with ``beta < 1`` BMP's term pruning would keep the sentinel terms, so they are not asked for, the last
block is lost as bmp 0.2.8 loses it, and a panic is answered by asking again with k > 1000, which has no ``T``).
Queries with no term in the index retrieve nothing without calling BMP.

Scores are 16-bit in BMP and wrap around past 65535: with 8-bit documents (255) and SPLADE queries of ~20 terms the
best scores of Vaswani queries already reach 36,500 on 300 documents, hence the default ``max_impact=127`` (half the
precision, twice the headroom); the retriever warns when a query's best score passes 32768.
"""
import json
import warnings

import numpy as np
import pyterrier as pt

from ...storage import write_json
from .glue import Timer, ToksSearcher, check_threads, quantized_csr, require

INDEX_FILE = 'index.bmp'
TERMS_FILE = 'terms.json'  # {term: [10th, 100th, 1000th largest BMP impact]}
# Names no document can have: terms never contain whitespace, docnos never start with it (see quantization).
SENTINEL_DOCNO = ' bmp sentinel'
# Sentinel terms and impacts: with query levels 0-32 they sum to any bound 1..65535 (see _sentinel_levels).
SENTINEL_ONE, SENTINEL_32 = 'bmp sentinel 1', 'bmp sentinel 32'
SENTINEL_255 = [f'bmp sentinel 255 {i}' for i in range(9)]
SENTINEL_DOC = {SENTINEL_ONE: 1, SENTINEL_32: 32, **{t: 255 for t in SENTINEL_255}}
MAX_QUERY_LEVEL = 32  # bmp.query.MAX_TERM_WEIGHT: the searcher maps the largest query weight to it
KTH = (10, 100, 1000)  # the depths whose k-th impacts BMP keeps per term
NEAR_OVERFLOW = 2 ** 15  # BMP scores are 16-bit (wrap at 65536); warn with half of that as headroom
MAX_TERMS = 2 ** 16 - len(SENTINEL_DOC)  # term ids are 16-bit


def _kth_impacts(ids: np.ndarray, levels: np.ndarray, num_terms: int) -> np.ndarray:
    """``[num_terms, 3]``: each term's 10th, 100th and 1000th largest impact (0 when it has fewer postings)."""
    order = np.lexsort((-levels, ids))
    counts = np.bincount(ids, minlength=num_terms)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    out = np.zeros((num_terms, len(KTH)), dtype=np.int64)
    for j, k in enumerate(KTH):
        has = counts >= k
        out[has, j] = levels[order][starts[has] + k - 1]
    return out


def _sentinel_levels(bound: int) -> dict:
    """Query levels (1-32) of the sentinel terms whose score on the sentinel document is exactly ``bound``."""
    a, rest = divmod(bound, 255)
    levels = {SENTINEL_32: rest // 32, SENTINEL_ONE: rest % 32}
    for term in SENTINEL_255:
        levels[term], a = min(a, MAX_QUERY_LEVEL), a - min(a, MAX_QUERY_LEVEL)
    return {t: level for t, level in levels.items() if level}


class BmpEngine:
    name = 'bmp'
    subfolder = 'bmp'
    extra = 'engines'
    scorings = {'dot'}

    def build(self, index, folder, block_size: int = 32, compress_range: bool = False, max_impact: int = 127) -> dict:
        """``block_size`` documents per block (1-256); ``compress_range`` compresses the per-block maxima;
        ``max_impact`` (1-255) is the BMP impact the index's largest weight maps to."""
        bmp = require('bmp', 'bmp')
        if not 1 <= block_size <= 256:
            raise ValueError(f'block_size must be in 1..256 (BMP numbers documents within a block in 8 bits), '
                             f'got {block_size}')
        if not 1 <= max_impact <= 255:
            raise ValueError(f'max_impact must be in 1..255 (BMP impacts are 8-bit), got {max_impact}')
        with Timer() as timer:
            docnos, terms, indptr, ids, impacts = quantized_csr(index)
            if len(terms) > MAX_TERMS:
                raise ValueError(f'BMP numbers terms in 16 bits: the index has {len(terms)} terms, at most '
                                 f'{MAX_TERMS} fit')
            largest = int(impacts.max())
            factor = min(1., max_impact / largest)
            levels = np.maximum(1, np.rint(impacts * factor)).astype(np.int64)
            names = np.array(terms, dtype=object)
            indexer = bmp.Indexer(str(folder / INDEX_FILE), bsize=block_size, compress_range=compress_range)
            for row, docno in enumerate(docnos):
                start, end = indptr[row], indptr[row + 1]
                indexer.add_document(docno, dict(zip(names[ids[start:end]].tolist(), levels[start:end].tolist())))
            # Empty documents fill the last block, so that the sentinel has a block of its own.
            for pad in range(-len(docnos) % block_size):
                indexer.add_document(f'{SENTINEL_DOCNO} {pad}', {})
            indexer.add_document(SENTINEL_DOCNO, SENTINEL_DOC)
            indexer.finish()
            write_json(folder / TERMS_FILE, dict(zip(terms, _kth_impacts(ids, levels, len(terms)).tolist())))
        return {'block_size': block_size, 'compress_range': compress_range, 'max_impact': max_impact,
                'largest_impact': largest, 'impact_factor': factor, 'build_seconds': round(timer.seconds, 3)}

    def retriever(self, index, folder, num_results: int, alpha: float = 1., beta: float = 1., threads: int = 1,
                  verbose: bool = False) -> pt.Transformer:
        """``alpha``/``beta`` in (0, 1]: 1 and 1 is exact (see the module notes); ``threads`` must be 1 (bmp's
        searcher runs one query at a time and holds the GIL)."""
        bmp = require('bmp', 'bmp')
        if not (0 < alpha <= 1 and 0 < beta <= 1):
            raise ValueError(f'alpha and beta must be in (0, 1], got alpha={alpha}, beta={beta}')
        if check_threads(threads) != 1:
            raise ValueError('bmp 0.2.8 searches one query at a time holding the GIL; use threads=1')
        factor = index.meta['engines'][self.name]['impact_factor']
        kth = json.loads((folder / TERMS_FILE).read_text())
        depth = sum(num_results > k for k in KTH)  # which k-th impact BMP's initial threshold uses
        searcher = bmp.Searcher(str(folder / INDEX_FILE))
        scale = index.scale
        warned = []

        def search_one(toks):
            query = {t: q for t, q in ((t, int(w * scale)) for t, w in toks.items()) if q > 0 and t in kth}
            if not query:
                return [], []
            top = max(query.values())
            # BMP's own arithmetic (f32): level = ceil(q * (32 / top)).
            level = np.float32(MAX_QUERY_LEVEL) / np.float32(top)
            if beta == 1:
                threshold = max(kth[t][depth] * int(np.ceil(np.float32(q) * level)) for t, q in query.items()) \
                    if depth < len(KTH) else 0
                # A weight of (L - 0.5) / level is mapped to L by BMP's ceil, with a margin far above f32 rounding.
                query.update({t: (sentinel - 0.5) * top / MAX_QUERY_LEVEL
                              for t, sentinel in _sentinel_levels(threshold + 1).items()})
                docnos, scores = searcher.search(query, k=num_results, alpha=alpha, beta=beta)
            else:
                try:
                    docnos, scores = searcher.search(query, k=num_results, alpha=alpha, beta=beta)
                except BaseException as e:  # pyo3's PanicException derives from BaseException
                    if type(e).__name__ != 'PanicException':
                        raise
                    docnos, scores = searcher.search(query, k=max(num_results, KTH[-1] + 1), alpha=alpha, beta=beta)
            if not warned and scores and max(scores) > NEAR_OVERFLOW:
                warned.append(True)
                warnings.warn(f'a BMP score of {max(scores):.0f} is near the 16-bit limit (65535) past which bmp 0.2.8 '
                              'wraps around; rebuild the engine with a lower max_impact', stacklevel=2)
            kept = [(d, s / (float(level) * factor)) for d, s in zip(docnos, scores) if d != SENTINEL_DOCNO]
            return [d for d, _ in kept[:num_results]], [s for _, s in kept[:num_results]]

        return ToksSearcher(lambda queries: [search_one(q) for q in queries], f'BMP(alpha={alpha}, beta={beta})')
