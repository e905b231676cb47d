"""What the in-process engines (BMP, Seismic) share: importing an optional package, checking the parameters native code
sees, reading the stored vectors as quantized arrays, the forward index that re-scores candidates exactly, and a
retriever that searches one query at a time.

Exactness.  BMP and Seismic rank with values narrower than PISA's integers (BMP: 8-bit documents, 5-bit queries and
16-bit sums; Seismic: float16 documents and float32 sums).  So neither returns its own scores: each engine proposes
candidates, which are re-scored with PISA's integers (``sum_t int(q_t * scale) * int(d_t * scale)``) from a forward
index kept beside the engine's files (:class:`Forward`).  In exact mode the engine also gives a bound on the exact score
of every document it did not return (from its own rounding); :func:`certified_top` asks for deeper candidate lists until
the exact k-th score reaches that bound, so the top-k's scores are PISA's, document for document up to ties.
"""
import importlib
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt

from ...core.checks import check_int, check_term
from ...core.storage import read_json, write_array, write_json

__all__ = ['require', 'check_threads', 'check_depth', 'engine_settings', 'quantized_csr', 'Forward',
           'certified_top', 'certified_tops', 'bounded_rescore', 'ranked', 'ToksSearcher', 'Timer']

TERMS_FILE = 'terms.json'
DOCNOS_FILE = 'docnos.json'
FORWARD_FILES = ('forward-indptr.npy', 'forward-ids.npy', 'forward-impacts.npy')


def require(module: str, package: str, extra: str = 'engines'):
    """Imports ``module`` or raises an ImportError that names the pip extra installing it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'this engine needs the {package} package: pip install "pyterrier-lsr[{extra}]" '
                          f'(or pip install {package})') from e


def check_threads(threads) -> int:
    return check_int('threads', threads, minimum=1)


def check_depth(index, num_results) -> int:
    """``num_results`` checked (an integer >= 1) and capped at the number of documents: every engine allocates room
    for it before searching (a huge value aborts the process)."""
    return min(check_int('num_results', num_results, minimum=1), index.num_docs())


def engine_settings(index, engine: str, label: str, fmt: int) -> dict:
    """The settings ``engine`` recorded in the index, refused when an older version of its files was written."""
    settings = index.meta['engines'][engine]
    if settings.get('format') != fmt:
        raise ValueError(f'the {label} engine of {index.path} was built by an older pyterrier-lsr; rebuild it: '
                         f"LsrIndex(path).build_engine({engine!r}, overwrite=True)")
    return settings


def quantized_csr(index) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The index's vectors as ``(docnos, terms, indptr, term_ids, impacts)`` with PISA's impacts ``int(w * scale)``
    (int32: the index's scale keeps them in 32 bits); postings whose impact is 0 are removed, so every engine stores
    exactly the terms PISA stores.  Terms are checked again (:func:`~pyterrier_lsr.core.checks.check_term`): native code
    must never see a NUL."""
    scale = index.scale

    def impacts_of(weights):
        scaled = weights * scale
        if len(scaled) and not scaled.max() < 2 ** 31:  # NaN too: the vectors were altered after the index was built
            raise ValueError(f'the vectors of {index.path} hold a weight above {2 ** 31 / scale:g}; rebuild the index')
        return scaled.astype(np.int32)

    docnos, terms, indptr, ids, impacts = index.vectors().to_csr(impacts_of)
    for term in terms:
        check_term(term, 'stored vectors')
    keep = impacts > 0
    if not keep.all():
        # Rows shrink by the number of dropped postings before each row end.
        dropped = np.concatenate([[0], np.cumsum(~keep)])
        indptr = indptr - dropped[indptr]
        ids, impacts = ids[keep], impacts[keep]
    return docnos, terms, indptr, ids, impacts


class Forward:
    """PISA's integer impacts by document (CSR, memory-mapped), the term list and the docnos of an engine folder."""

    def __init__(self, folder):
        import scipy.sparse as sp
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


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


class ToksSearcher(pt.Transformer):
    """Runs ``search(list of query_toks) -> [(rows, scores), ...]`` (numpy arrays, best first; rows of ``docnos``)
    over a frame's non-empty queries and returns ``qid, docno, score, rank`` (docnos of pandas' ``str`` dtype and ranks
    from 0, as PISA) with the input's other columns but ``query_toks``; an empty ``query_toks`` retrieves no rows."""

    def __init__(self, search: Callable[[list[dict[str, float]]], list[tuple[np.ndarray, np.ndarray]]],
                 docnos: pd.api.extensions.ExtensionArray, name: str):
        self.searcher = search
        self.docnos = docnos  # of pandas' str dtype (Forward.docnos)
        self.name = name

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        return self.results(inp, list(inp['query_toks']))

    def results(self, inp: pd.DataFrame, toks: list[dict[str, float]]) -> pd.DataFrame:
        """:meth:`transform` with the frame's ``query_toks`` given as ``toks`` (checked by the caller), so that the
        frame itself is never copied to hold them."""
        asked = [row for row, query in enumerate(toks) if query]
        found = self.searcher([toks[row] for row in asked]) if asked else []
        counts = np.array([len(rows) for rows, _ in found], dtype=np.int64)
        rows = np.repeat(np.asarray(asked, dtype=np.int64), counts)
        # Built column by column: taking whole rows of the input (query_toks' dicts included) and assigning into that
        # copy cost several times the engine's own call at k = 1000 (measured on Seismic).
        out = {c: inp[c].array.take(rows) for c in inp.columns if c != 'query_toks'}
        out['docno'] = self.docnos.take(np.concatenate([np.zeros(0, np.int64)] + [hits for hits, _ in found]))
        out['score'] = np.concatenate([np.zeros(0)] + [scores for _, scores in found]).astype(np.float64)
        out['rank'] = np.concatenate([np.zeros(0, np.int64)] + [np.arange(n) for n in counts])
        return pd.DataFrame(out, copy=False)

    def __repr__(self):
        return self.name
