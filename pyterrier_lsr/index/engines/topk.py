"""The exact top-k of the in-process engines (BMP, Seismic): the forward index that re-scores candidates with PISA's
integers, and the certified search that asks for deeper candidate lists until the top-k is provably exact.

Exactness.  BMP and Seismic rank with values narrower than PISA's integers (BMP: 8-bit documents, 5-bit queries and
16-bit sums; Seismic: float16 documents and float32 sums).  So neither returns its own scores: each engine proposes
candidates, which are re-scored with PISA's integers (``sum_t int(q_t * scale) * int(d_t * scale)``) from a forward
index kept beside the engine's files (:class:`Forward`).  In exact mode the engine also gives a bound on the exact score
of every document it did not return (from its own rounding); :func:`certified_top` asks for deeper candidate lists until
the exact k-th score reaches that bound, so the top-k's scores are PISA's, document for document up to ties.
"""
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.storage import read_json, write_array, write_json
from .native import require

__all__ = ['Forward', 'certified_top', 'certified_tops', 'bounded_rescore', 'ranked', 'TERMS_FILE', 'DOCNOS_FILE',
           'FORWARD_FILES']

TERMS_FILE = 'terms.json'
DOCNOS_FILE = 'docnos.json'
FORWARD_FILES = ('forward-indptr.npy', 'forward-ids.npy', 'forward-impacts.npy')


class Forward:
    """PISA's integer impacts by document (CSR, memory-mapped), the term list and the docnos of an engine folder."""

    def __init__(self, folder):
        sp = require('scipy.sparse', 'scipy')
        folder = Path(folder)
        self.indptr, self.ids, self.impacts = (np.load(folder / name, mmap_mode='r', allow_pickle=False)
                                               for name in FORWARD_FILES)
        self.terms = read_json(folder / TERMS_FILE, 'the engine term list', expect=list)
        self.term_ids = {t: i for i, t in enumerate(self.terms)}
        # Of pandas' str dtype once: results take their rows' docnos in one step instead of converting them per call.
        self.docnos = pd.array(read_json(folder / DOCNOS_FILE, 'the engine docnos', expect=list), dtype='str')
        # scipy's row gathers trust the offsets and term ids (an altered file would read out of bounds): checked once.
        if not (len(self.docnos) + 1 == len(self.indptr) and len(self.ids) == len(self.impacts)
                and self.indptr[0] == 0 and self.indptr[-1] == len(self.ids) and (np.diff(self.indptr) >= 0).all()
                and (not len(self.ids) or 0 <= self.ids.min() and self.ids.max() < len(self.terms))):
            raise ValueError(f'the forward index in {folder} is inconsistent; rebuild the engine')
        # One index dtype for scipy: the (small) offsets narrowed rather than the term ids widened, when they fit.
        offsets = self.indptr.astype(np.int32) if len(self.ids) < 2 ** 31 else self.indptr
        self.matrix = sp.csr_matrix((self.impacts, self.ids, offsets), shape=(len(self.docnos), len(self.terms)))

    @staticmethod
    def write(folder, docnos, terms, indptr, ids, impacts) -> None:
        folder = Path(folder)
        for name, array, dtype in zip(FORWARD_FILES, (indptr, ids, impacts), (np.int64, np.int32, np.int32)):
            write_array(folder / name, np.asarray(array, dtype=dtype))
        write_json(folder / TERMS_FILE, list(terms))
        write_json(folder / DOCNOS_FILE, list(docnos))

    def query(self, toks: dict[str, float], scale: float) -> dict[int, int]:
        """``{term id: int(w * scale)}`` of the query's terms that the index has, zeros dropped (as PISA queries)."""
        out = {}
        for term, weight in toks.items():
            q = int(weight * scale)
            if q > 0 and term in self.term_ids:
                out[self.term_ids[term]] = q
        return out

    def rescore(self, query: dict[int, int], rows: np.ndarray | None = None) -> np.ndarray:
        """PISA's exact scores (float64, exact integers) of documents ``rows`` (default: every document) for
        ``query``."""
        matrix = self.matrix if rows is None else self.matrix[np.asarray(rows, dtype=np.int64)]
        if not matrix.shape[0] or not query:
            return np.zeros(matrix.shape[0])
        dense = np.zeros(len(self.terms))  # per call: retrievers are shared between threads
        dense[list(query)] = list(query.values())
        # Sums of exact integers in float64 (below 2**53): any order gives the same.
        return matrix @ dense


def certified_tops(search: Callable[[list[int], int], list[tuple[np.ndarray, float]]],
                   rescore: Callable[[int, np.ndarray], np.ndarray], k: int, limit: int, count: int,
                   start: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """The exact top-``k`` ``(rows, scores)`` of each of ``count`` queries, best first (ties by row), from an engine's
    candidates.

    ``search(queries, depth)`` returns, for each query asked (their positions), candidate rows and a bound on the exact
    score of every row it did not return (0: none of them matches); ``rescore(query, rows)`` their exact scores.
    Queries are asked again, deeper (first ``start``, default ``k``; up to ``limit``, where ``search`` returns every
    matching row), all uncertain ones in one call, until the exact k-th score reaches that bound.  Documents whose
    exact score is 0 (not matching) are dropped, as PISA never returns them."""
    depth, pending, tops = min(limit, start or k), list(range(count)), [None] * count
    while pending:
        uncertain = []
        for query, (rows, unseen) in zip(pending, search(pending, depth)):
            rows, scores = ranked(rows, rescore(query, rows), k)
            if unseen <= 0 or depth >= limit or (len(rows) == k and scores[-1] >= unseen):
                tops[query] = rows, scores
            else:
                uncertain.append(query)
        pending, depth = uncertain, min(limit, depth * 4)
    return tops


def certified_top(search: Callable[[int], tuple[np.ndarray, float]], rescore: Callable[[np.ndarray], np.ndarray],
                  k: int, limit: int, start: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`certified_tops` of one query: ``search(depth)``, ``rescore(rows)``."""
    return certified_tops(lambda _, depth: [search(depth)], lambda _, rows: rescore(rows), k, limit, 1, start)[0]


def bounded_rescore(rescore: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, bounds: np.ndarray,
                    k: int) -> np.ndarray:
    """Exact scores of candidates ``rows`` whose exact scores are at most ``bounds`` (descending), 0 for those that
    cannot reach the top-``k`` (:func:`ranked` drops them): the ``k`` first are re-scored, then only the others whose
    bound reaches the k-th of those (deep candidate lists are mostly below it)."""
    scores = np.zeros(len(rows))
    scores[:k] = rescore(rows[:k])
    if len(rows) > k:
        reach = k + int(np.searchsorted(-bounds[k:], -scores[:k].min(), side='right'))
        scores[k:reach] = rescore(rows[k:reach])
    return scores


def ranked(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates re-scored, without the non-matching ones, best first (ties by row), at most ``k``."""
    rows = np.asarray(rows, dtype=np.int64)
    matching = scores > 0
    rows, scores = rows[matching], scores[matching]
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]
