"""The cost columns of a report: latency, vector sizes, postings per query, index and engine footprint.

Cost columns per system: ms per query of query encoding and, separately, of retrieval from encoded queries (median
and p95 over queries of each query's median over repeated passes; each query on its own), average non-zero terms per
query and per document, index size on disk (less the model copy), and postings per query: the summed document
frequencies of the query's terms, i.e. the postings an exhaustive traversal reads (dynamic pruning reads fewer but
cannot count them); with an engine, its name, size and build time.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt

from ..index import pisa_term


def posting_lengths(index_path) -> dict[str, int]:
    """Document frequency of every term of a PISA index, read from its ``inv.docs`` and ``fwd.terms`` files."""
    path = Path(index_path)
    terms = path.joinpath('fwd.terms').read_text(encoding='utf8').split('\n')[:-1]
    docs = np.fromfile(path / 'inv.docs', dtype=np.uint32)
    lengths, pos = [], 2  # header: [1, num_docs]
    while pos < len(docs):
        lengths.append(int(docs[pos]))
        pos += int(docs[pos]) + 1
    return dict(zip(terms, lengths))


def index_size_bytes(index_path) -> int:
    """Bytes of an index folder's files, less the copy of the model a pyterrier-lsr index carries (``model/``)."""
    root = Path(index_path)
    return sum(f.stat().st_size for f in root.rglob('*') if f.is_file() and f.relative_to(root).parts[0] != 'model')


@dataclass
class System:
    """A retrieval system to report on.

    ``query_side`` produces ``query_toks`` (``None`` for a text retriever such as BM25, whose query terms are then
    PISA's tokens of the query text); ``retriever`` retrieves from the index at ``index_path`` (a pyterrier-lsr index,
    or a PISA index for a text retriever).
    """

    name: str
    retriever: pt.Transformer
    index_path: str
    query_side: pt.Transformer | None = None
    stemmer: str = 'none'
    engine: str | None = None  # the LsrIndex engine ``retriever`` searches with: adds the engine columns

    def pipeline(self) -> pt.Transformer:
        return self.retriever if self.query_side is None else self.query_side >> self.retriever

    def query_terms(self, topics: pd.DataFrame) -> list[dict[str, float]]:
        if self.query_side is not None:
            return list(self.query_side(topics)['query_toks'])
        import pyterrier_pisa
        from pyterrier_pisa.stopwords import _STOPWORDS

        stops = set(_STOPWORDS['terrier'])
        return [
            {t: 1.0 for t in pyterrier_pisa.tokenize(q.lower(), self.stemmer) if t not in stops}
            for q in topics['query']
        ]

    def document_frequencies(self) -> tuple[dict[str, int], int, Callable[[str], str]]:
        """``(df, num_docs, key)``: document frequency per stored term, the number of documents, and the stored form
        of a query term (the index's own ``df.json`` for a pyterrier-lsr index, whatever its engines; PISA's
        posting lists for a text index)."""
        from ..index import LsrIndex
        from ..index.artifact import is_lsr_index

        if is_lsr_index(self.index_path):
            index = LsrIndex(self.index_path)
            return index.document_frequencies(), index.num_docs(), str
        num_docs = int(np.fromfile(Path(self.index_path) / 'inv.docs', dtype=np.uint32, count=2)[1])
        return posting_lengths(self.index_path), num_docs, pisa_term


# The columns costs() adds (in order). Latency is split: query encoding (the model's query side; NaN for a text
# retriever, whose tokenization is part of retrieval) and retrieval from precomputed query_toks, each the median and
# p95 over queries of a query's median time over the passes.
COST_COLUMNS = (
    'encode_ms_median',
    'encode_ms_p95',
    'retrieve_ms_median',
    'retrieve_ms_p95',
    'query_nnz',
    'doc_nnz',
    'postings_per_query',
    'index_mb',
)


def query_times(pipeline: pt.Transformer, topics: pd.DataFrame, passes: int = 1) -> list[float]:
    """Milliseconds of one-query calls of ``pipeline`` over ``topics``, after a warm-up call (which loads indexes):
    per query, the median of ``passes`` passes over all queries (so a stall in one pass does not count)."""
    if passes < 1:
        raise ValueError(f'passes must be >= 1, got {passes}')
    pipeline(topics.iloc[:1])
    times = np.empty((passes, len(topics)))
    for p in range(passes):
        for i in range(len(topics)):
            start = time.perf_counter()
            pipeline(topics.iloc[[i]])
            times[p, i] = (time.perf_counter() - start) * 1e3
    return np.median(times, axis=0).tolist()


def costs(system: System, topics: pd.DataFrame, passes: int = 3) -> dict[str, float]:
    """Cost columns of one system on ``topics`` (see the module docs); latencies over ``passes`` passes."""
    if system.query_side is None:
        encode, toks = [float('nan')], topics
    else:
        encode = query_times(system.query_side, topics, passes)
        toks = system.query_side(topics)
    retrieve = query_times(system.retriever, toks, passes)
    df, num_docs, key = system.document_frequencies()
    queries = list(toks['query_toks']) if system.query_side is not None else system.query_terms(topics)
    return {
        'encode_ms_median': statistics.median(encode),
        'encode_ms_p95': float(np.percentile(encode, 95)),
        'retrieve_ms_median': statistics.median(retrieve),
        'retrieve_ms_p95': float(np.percentile(retrieve, 95)),
        'query_nnz': statistics.mean(len(q) for q in queries),
        'doc_nnz': sum(df.values()) / max(1, num_docs),
        'postings_per_query': statistics.mean(sum(df.get(key(t), 0) for t in q) for q in queries),
        'index_mb': index_size_bytes(system.index_path) / 2**20,
        **(engine_footprint(system.index_path, system.engine) if system.engine else {}),
    }


def engine_footprint(index_path, engine: str) -> dict[str, object]:
    """The engine columns of a report: which engine of the :class:`~pyterrier_lsr.LsrIndex` at ``index_path``, the
    size of its files (MB; PISA's are those at the index root) and its build time (s, as recorded when built)."""
    from ..index import LsrIndex, get_engine

    meta = LsrIndex(index_path).meta
    folder = get_engine(engine).subfolder
    files = {
        name: record['bytes']
        for name, record in meta['files'].items()
        if (name.startswith(folder + '/') if folder else '/' not in name and name not in ENGINE_NEUTRAL_FILES)
    }
    return {
        'engine': engine,
        'engine_mb': sum(files.values()) / 2**20,
        'engine_build_s': meta['engines'][engine].get('build_seconds', float('nan')),
    }


ENGINE_NEUTRAL_FILES = {'df.json', 'pt_meta.json', 'lsr.json'}


def engine_costs(index, engine: str, query_toks: pd.DataFrame, num_results: int = 1000, **params):
    """One engine of an :class:`~pyterrier_lsr.LsrIndex` on a frame that already carries ``query_toks``: returns
    ``(costs, results)``, the costs being the engine columns plus ms per query (median and p99 of one-query calls,
    and the mean of one call on every query), the results those of the call on every query."""
    retriever = index.toks_retriever(num_results, engine=engine, **params)
    times = query_times(retriever, query_toks)
    start = time.perf_counter()
    results = retriever(query_toks)
    batch = (time.perf_counter() - start) * 1e3 / max(1, len(query_toks))
    return {
        **engine_footprint(index.path, engine),
        'ms_median': statistics.median(times),
        'ms_p99': float(np.percentile(times, 99)),
        'ms_batch': batch,
    }, results

