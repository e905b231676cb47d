"""PISA: exact dynamic-pruning retrieval (dot product over quantized impacts, or BM25 over quantized TFs).

Every parameter is checked here before PISA sees it: PISA's native code hangs on a negative ``threads`` and throws
``bad_alloc`` on a huge ``num_results`` (capped at the number of documents).
"""
import numpy as np
import pandas as pd
import pyterrier as pt

from ...core.checks import check_bm25, check_bool, check_choice, check_int, check_term
from ..quantization import pisa_term, quantize
from ..ranking import Hits
from .native import Timer, check_threads, result_frame

QUERY_ALGORITHMS = ('block_max_wand', 'block_max_maxscore', 'block_max_ranked_and', 'maxscore', 'wand', 'ranked_and',
                    'ranked_or')


def pisa_settings(num_results, threads=1, verbose=False, query_algorithm=None, num_docs: int | None = None) -> dict:
    """The settings every PISA retriever takes, checked: ``num_results`` an integer >= 1 (capped at ``num_docs``:
    PISA allocates room for it), ``threads`` an integer >= 1, ``verbose`` a bool, ``query_algorithm`` one of
    :data:`QUERY_ALGORITHMS` (or None)."""
    num_results = check_int('num_results', num_results, minimum=1)
    return dict(num_results=num_results if num_docs is None else min(num_results, num_docs),
                threads=check_threads(threads), verbose=check_bool('verbose', verbose),
                query_algorithm=None if query_algorithm is None else
                check_choice('query_algorithm', getattr(query_algorithm, 'value', query_algorithm), QUERY_ALGORITHMS))


class PisaEngine:
    name = 'pisa'
    subfolder = ''  # PISA's files live at the index root, so pyterrier_pisa.PisaIndex(path) opens it too
    extra = None
    scorings = {'dot', 'bm25'}

    def build(self, index, folder, **params) -> dict:
        import pyterrier_pisa
        if params:
            raise TypeError(f'PISA takes no build parameters, got {sorted(params)}')
        scale = index.scale
        stored = {}  # each term's escaped form, computed (and checked) once

        def docs():
            for docno, vector in index.vectors():
                # Impacts are already integers, so PISA's own int(w * 1) keeps them as they are.
                yield {'docno': docno, 'toks': {stored.get(t) or stored.setdefault(t, pisa_term(check_term(t))): w
                                                for t, w in quantize(vector, scale).items()}}

        pisa = pyterrier_pisa.PisaIndex(str(folder), stemmer='none')
        with Timer() as timer:
            pisa.toks_indexer(mode='overwrite', scale=1.).index(docs())
            # PISA compresses the index on first open; doing it now lets a read-only index be queried.
            self._retriever(index, folder, 10)
        if pisa.num_docs() != index.num_docs():
            raise RuntimeError(f'PISA indexed {pisa.num_docs()} documents out of {index.num_docs()}')
        return {'build_seconds': round(timer.seconds, 3)}

    def _retriever(self, index, folder, num_results: int, threads: int = 1, verbose: bool = False, k1=None, b=None,
                   query_algorithm=None):
        import pyterrier_pisa
        common = dict(pisa_settings(num_results, threads, verbose, query_algorithm, index.num_docs()),
                      toks_scale=index.scale)
        pisa = pyterrier_pisa.PisaIndex(str(folder), stemmer='none', stops='none')
        scoring = index.scoring
        if scoring['kind'] == 'bm25':
            # k1 is on the float-TF scale; PISA sees TFs multiplied by the index scale (see latent_terms docs).
            k1, b = check_bm25(scoring['k1'] if k1 is None else k1, scoring['b'] if b is None else b)
            return pisa.bm25(k1=k1 * index.scale, b=b, query_weighted=True, **common)
        if k1 is not None or b is not None:
            raise TypeError('k1 and b apply to BM25-scored indexes only')
        return pisa.quantized(**common)

    def retriever(self, index, folder, num_results: int, **params) -> pt.Transformer:
        return _PisaSearcher(self._retriever(index, folder, num_results, **params))


class _PisaSearcher(pt.Transformer):
    """pyterrier-pisa's retriever under the engine contract (:meth:`results`), with ``query_toks`` keys mapped to the
    escaped form the PISA index stores (a no-op for lowercase vocabularies)."""

    def __init__(self, retriever: pt.Transformer):
        self.retriever = retriever

    def transform(self, inp):
        return self.results(inp, list(inp['query_toks']))

    def results(self, inp, toks):
        if not self.retriever.verbose:  # its progress bar is pyterrier-pisa's own
            return result_frame(inp, self.hits(toks))
        out = self.retriever(inp.assign(query_toks=[{pisa_term(t): w for t, w in q.items()} for q in toks]))
        # pyterrier-pisa returns a new frame: deleting in place spares a copy of every column, a large share of a
        # one-query call at k = 1000 (frame copies cost more than the engine on small indexes).
        if 'query_toks' in out.columns:
            del out['query_toks']
        columns = [c for c in inp.columns if c != 'query_toks'] + ['docno', 'score', 'rank']
        return out if list(out.columns) == columns else out[columns]

    def hits(self, toks) -> Hits:
        """The results of ``toks`` as arrays (:class:`~..ranking.Hits`), through :func:`pisa_hits`; the weights go to
        PISA as pyterrier-pisa's transform sends them (times ``toks_scale``, as floats)."""
        retriever = self.retriever
        if retriever.verbose:  # its progress bar: the frame path, read back as arrays
            return Hits.of_frame(self.results(pd.DataFrame({'qid': [str(i) for i in range(len(toks))],
                                                            'query_toks': toks}), toks))
        scale = retriever.toks_scale
        return pisa_hits(retriever, [{pisa_term(t): float(w * scale) for t, w in q.items()} for q in toks])

    def __repr__(self):
        return repr(self.retriever)


def pisa_hits(retriever, queries: list) -> Hits:
    """What a pyterrier-pisa retriever's ``transform`` computes for ``queries`` (``{term: weight}`` dicts, or texts
    that PISA tokenizes, stems and stops as the index was built), as arrays, without its frame work: validating the
    frame, copying it, taking the input's rows with ``iloc`` and adding the results' columns one by one cost several
    times PISA's own search on a one-query call."""
    from pyterrier_pisa import _pisathon
    retriever.reset_retrieval_context()  # a no-op once its context is open
    shape = len(queries) * retriever.num_results
    qidxs, docnos = np.empty(shape, dtype=np.int32), np.empty(shape, dtype=object)
    ranks, scores = np.empty(shape, dtype=np.int32), np.empty(shape, dtype=np.float32)
    size = _pisathon.retrieve(retriever._ctxt, retriever.query_algorithm.value, list(enumerate(queries)),
                              k=retriever.num_results, threads=retriever.threads,
                              query_weighted=1 if retriever.query_weighted else 0,
                              pretokenised=bool(queries) and not isinstance(queries[0], str), result_qidxs=qidxs,
                              result_docnos=docnos, result_ranks=ranks, result_scores=scores)
    return Hits(qidxs[:size].astype(np.int64), docnos[:size], scores[:size])
