"""The boundary with the native engine packages (BMP, Seismic): importing an optional package, checking the
parameters native code sees, reading the stored vectors as the quantized arrays they build from, and a retriever that
runs a native search over a frame's ``query_toks``."""
import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyterrier as pt

from ...core.checks import check_int, check_term
from ...core.extras import import_extra
from ..ranking import Hits

__all__ = ['require', 'check_threads', 'check_depth', 'engine_settings', 'quantized_csr', 'result_frame', 'hit_ranks',
           'str_array', 'STR', 'ToksSearcher', 'Timer']


def require(module: str, package: str, extra: str = 'engines'):
    """Imports ``module`` or raises an ImportError (:class:`~...core.extras.MissingExtra`) that names the pip extra
    installing ``package``."""
    return import_extra(extra, module, needed_for=f'this engine ({package})')


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


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


# per input layout (its columns): the input's columns kept, their names, the output's columns, all unique
_LAYOUTS: dict[tuple, tuple[list[int], list, pd.Index, bool]] = {}
# pandas' default string dtype (``'str'``) as an object: converting to it by name costs more than the conversion
STR = pd.Series([], dtype='str').dtype
_STR_ARRAY = STR.construct_array_type()


def str_array(values: np.ndarray):
    """A numpy array of ``str`` (missing values as None or NaN) as a pandas array of the default string dtype: through
    Arrow directly when that is the dtype's storage, a third of what ``pd.array(values, dtype='str')`` costs on the
    dozen docnos of a one-query call."""
    if getattr(STR, 'storage', None) == 'pyarrow':
        import pyarrow as pa
        try:
            return _STR_ARRAY(pa.array(values, type=pa.large_string(), from_pandas=True), dtype=STR)
        except (TypeError, ValueError, pa.ArrowException):  # not all strings: pandas converts them, or says why
            pass
    return pd.array(values, dtype=STR)


def _taken(array, rows: np.ndarray):
    """``array`` (a column of the input) at ``rows``: a string column through numpy and :func:`str_array`, at half
    the cost of its own ``take`` on a one-query call."""
    if isinstance(array, _STR_ARRAY) and array.dtype == STR:
        return str_array(np.asarray(array, dtype=object)[rows])
    return array.take(rows)


def result_frame(inp: pd.DataFrame, hits: Hits, ranks: np.ndarray | None = None) -> pd.DataFrame:
    """Each hit's query row of ``inp`` (its columns but ``query_toks``) beside the hit's ``docno, score, rank``
    (``ranks``: default, each hit's place among its query's hits, as the engine returned them).

    On a one-query call, building a frame from a dict cost several times an engine's search (pandas sanitizes every
    column and builds the column index each time): the arrays go in as they are and the column index of each input
    layout is kept; the frame is the one ``pd.DataFrame(dict(...), copy=False)`` gives."""
    layout = _LAYOUTS.get(tuple(inp.columns))
    if layout is None:
        if len(_LAYOUTS) > 64:  # input layouts seen by this process; a few in practice
            _LAYOUTS.clear()
        names = [c for c in inp.columns if c != 'query_toks']
        columns = pd.Index([*names, 'docno', 'score', 'rank'])
        layout = _LAYOUTS[tuple(inp.columns)] = ([i for i, c in enumerate(inp.columns) if c != 'query_toks'], names,
                                                  columns, columns.is_unique and inp.columns.is_unique)
    positions, names, columns, unique = layout
    rows, docnos = hits.queries, hits.docnos
    column = getattr(inp, '_get_column_array', None)  # pandas' own accessor: a Series per column costs 20 us each
    if column is None or not unique:
        arrays = [_taken(inp[c].array, rows) for c in names]
    else:
        arrays = [_taken(column(i), rows) for i in positions]
    arrays += [str_array(docnos) if isinstance(docnos, np.ndarray) else docnos, hits.scores,
               hit_ranks(rows) if ranks is None else ranks]
    from_arrays = getattr(pd.DataFrame, '_from_arrays', None)
    if from_arrays is None or not unique:
        return pd.DataFrame(dict(zip(columns, arrays)), copy=False)
    return from_arrays(arrays, columns=columns, index=pd.RangeIndex(len(rows)), verify_integrity=False)


def hit_ranks(queries: np.ndarray) -> np.ndarray:
    """The rank of each hit within its query (hits of a query together, best first), from 0."""
    if not len(queries):
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], queries[1:] != queries[:-1]]))
    return np.arange(len(queries)) - np.repeat(starts, np.diff(np.append(starts, len(queries))))


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
        return result_frame(inp, self.hits(toks))

    def hits(self, toks: list[dict[str, float]]) -> Hits:
        """The results of the (checked) queries ``toks`` as arrays (:class:`~..ranking.Hits`)."""
        asked = [row for row, query in enumerate(toks) if query]
        found = self.searcher([toks[row] for row in asked]) if asked else []
        counts = np.array([len(rows) for rows, _ in found], dtype=np.int64)
        return Hits(np.repeat(np.asarray(asked, dtype=np.int64), counts),
                    self.docnos.take(np.concatenate([np.zeros(0, np.int64)] + [rows for rows, _ in found])),
                    np.concatenate([np.zeros(0)] + [scores for _, scores in found]).astype(np.float64))

    def __repr__(self):
        return self.name
