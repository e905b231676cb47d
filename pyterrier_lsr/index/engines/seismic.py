"""Seismic (Bruch et al., SIGIR 2024 / CIKM 2024) through the ``pyseismic-lsr`` package: approximate top-k over
statically pruned, clustered posting lists with summaries, re-scored on a forward index.

How Seismic's values relate to the index ``scale``: Seismic is given PISA's integers, document values
``int(w * scale)`` (postings of impact 0 removed, as in PISA) and query values ``int(q * scale)``.  It stores document
values as float16, which holds integers exactly up to 2048 and rounds larger ones to 11 significant bits, and overflows
to infinity past 65,504: so document values are multiplied by ``value_scale``, the power of two (at most 1) that keeps
the largest one below that (recorded in the engine settings).  The scores returned are PISA's, ``sum_t
int(q_t * scale) * int(d_t * scale)`` (about ``scale**2`` times the dot product): Seismic scores its candidates with
the whole query on its own forward index, so when every impact is at most 2048 and the query's sums stay below 2**24
(see ``margin`` below) its float scores are those integers exactly and are kept; otherwise its candidates are
re-scored with PISA's integers from the engine's forward index (:mod:`.topk`).  Documents that match no query term are
never returned.  Terms are given to Seismic as integer ids (the index's term list is kept in ``terms.json``),
so no term is truncated to Seismic's fixed-width strings.

Seismic has no exact search mode; ``exact=True`` uses its brute-force scan of the same vectors (``SeismicDataset``,
loaded into memory when the retriever is made; slow, meant for checking), deepened until no document left out can
score above the k-th: a document Seismic scores ``s'`` has an exact score of at most ``s' / value_scale / (1 - d)``
with ``d = 2**-10 + (n + 2) * 2**-23`` for ``n`` query terms (float16 values, float32 sums, with a factor 2 to spare),
so the top-k equals PISA's (up to the order of equal scores; the uncertain queries of a frame are deepened together,
one batch call per round); when every impact is at most 2048 and a query's ``sum_t q_t`` times the largest impact is
below 2**24, Seismic's scores are exact and ``d = 0``.
The approximate knobs: at build time ``n_postings``
(average posting-list length kept; ``max_fraction`` times it at most per list), ``centroid_fraction``,
``summary_energy``; at query time ``query_cut`` (query terms kept, highest weights first) and ``heap_factor`` (a block
is skipped when its summary's score is below ``heap_factor`` times the k-th best score so far: lower values skip
fewer blocks, more accurate and slower).
"""
import math

import numpy as np
import pyterrier as pt

from ...core.checks import check_bool, check_float, check_int
from .native import Timer, ToksSearcher, check_depth, check_threads, engine_settings, quantized_csr, require
from .topk import Forward, certified_tops, ranked

FORMAT = 2  # 2: documents numbered by row, forward index kept, values scaled into float16's range
INDEX_NAME = 'index'  # Seismic appends '.index.seismic'
INDEX_FILE = INDEX_NAME + '.index.seismic'
MAX_SMALL_VOCABULARY = 2 ** 16 - 1  # SeismicIndex numbers terms in 16 bits; the LV classes in 32
FLOAT16_MAX = 65504.
FLOAT16_EXACT = 2048  # float16 holds every integer up to this one


def _classes(seismic, num_terms: int):
    if num_terms > MAX_SMALL_VOCABULARY:
        return seismic.SeismicDatasetLV, seismic.SeismicIndexLV
    return seismic.SeismicDataset, seismic.SeismicIndex


def _value_scale(largest: int) -> float:
    """The power of two (at most 1) that brings ``largest`` within float16's range."""
    return 2. ** -max(0, math.ceil(math.log2(largest / FLOAT16_MAX)))


def _dataset(seismic, indptr, ids, impacts, num_terms: int, value_scale: float):
    """The documents as a SeismicDataset (numbered by row; components sorted within each document)."""
    indptr, ids, impacts = np.asarray(indptr), np.asarray(ids), np.asarray(impacts)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    order = np.lexsort((ids, rows))
    dataset_class, _ = _classes(seismic, num_terms)
    dataset = dataset_class(dim=num_terms)
    dataset.add_documents_by_id([str(r) for r in range(len(indptr) - 1)], ids[order].astype(np.int64),
                                (impacts[order] * value_scale).astype(np.float32), indptr.astype(np.int64))
    return dataset


class SeismicEngine:
    name = 'seismic'
    subfolder = 'seismic'
    extra = 'engines'
    scorings = {'dot'}

    def build(self, index, folder, n_postings: int = 3500, centroid_fraction: float = 0.1,
              summary_energy: float = 0.4, max_fraction: float = 1.5, min_cluster_size: int = 2, doc_cut: int = 15,
              threads: int = 1) -> dict:
        """Seismic's own defaults (pyseismic-lsr 0.5.4) except ``threads`` (1: the machines here are shared)."""
        seismic = require('seismic', 'pyseismic-lsr')
        settings = {'n_postings': check_int('n_postings', n_postings, minimum=1),
                    'centroid_fraction': check_float('centroid_fraction', centroid_fraction, 0, 1,
                                                     exclusive_minimum=True),
                    'summary_energy': check_float('summary_energy', summary_energy, 0, 1, exclusive_minimum=True),
                    'max_fraction': check_float('max_fraction', max_fraction, 0, exclusive_minimum=True),
                    'min_cluster_size': check_int('min_cluster_size', min_cluster_size, minimum=1),
                    'doc_cut': check_int('doc_cut', doc_cut, minimum=1)}
        threads = check_threads(threads)
        with Timer() as timer:
            docnos, terms, indptr, ids, impacts = quantized_csr(index)
            value_scale = _value_scale(int(impacts.max()))
            dataset = _dataset(seismic, indptr, ids, impacts, len(terms), value_scale)
            _, index_class = _classes(seismic, len(terms))
            built = index_class.build_from_dataset(dataset, num_threads=threads, **settings)
            built.save(str(folder / INDEX_NAME))
            Forward.write(folder, docnos, terms, indptr, ids, impacts)
        return {'format': FORMAT, **settings, 'value_scale': value_scale, 'largest_impact': int(impacts.max()),
                'large_vocabulary': len(terms) > MAX_SMALL_VOCABULARY, 'build_seconds': round(timer.seconds, 3)}

    def retriever(self, index, folder, num_results: int, query_cut: int = 20, heap_factor: float = 0.7,
                  exact: bool = False, threads: int = 1, verbose: bool = False) -> pt.Transformer:
        seismic = require('seismic', 'pyseismic-lsr')
        threads = check_threads(threads)
        query_cut = check_int('query_cut', query_cut, minimum=1)
        heap_factor = check_float('heap_factor', heap_factor, 0, exclusive_minimum=True)
        exact = check_bool('exact', exact)
        check_bool('verbose', verbose)
        k = check_depth(index, num_results)
        settings = engine_settings(index, self.name, 'Seismic', FORMAT)
        value_scale, largest = settings['value_scale'], settings['largest_impact']
        forward = Forward(folder)
        if exact:
            searcher = _dataset(seismic, forward.indptr, forward.ids, forward.impacts, len(forward.terms), value_scale)
        else:
            _, index_class = _classes(seismic, len(forward.terms))
            searcher = index_class.load(str(folder / INDEX_FILE))
        string = seismic.get_seismic_string()
        scale = index.scale

        def batch(queries, depth):
            """Seismic's ``(rows, scores)`` for each query (``{term id: value}``, non-empty), best first."""
            options = {} if exact else dict(heap_factor=heap_factor,
                                            # pyseismic-lsr 0.5.4 scores wrongly with query_cut=1000 exactly
                                            # (measured), so larger cuts than any query needs are clamped.
                                            query_cut=min(query_cut, max(len(q) for q in queries)))
            results = searcher.batch_search(
                np.array([str(i) for i in range(len(queries))], dtype=string),
                [np.array([str(t) for t in q], dtype=string) for q in queries],
                [np.array(list(q.values()), dtype=np.float32) for q in queries],
                k=depth, num_threads=threads, **options)
            found = [(np.zeros(0, np.int64), np.zeros(0))] * len(queries)
            # Results come back in no fixed order (measured), each tagged with its query id.
            for result in filter(None, results):
                found[int(result[0][0])] = (np.array([int(d) for _, _, d in result], dtype=np.int64),
                                            np.array([s for _, s, _ in result], dtype=np.float64))
            return found

        def margin(query):
            if largest <= FLOAT16_EXACT and sum(query.values()) * largest < 2 ** 24:
                return 1.  # float16 values and float32 sums are all exact integers: Seismic's scores are PISA's
            return 1 / value_scale / (1 - 2 ** -10 - (len(query) + 2) * 2 ** -23)

        def search(toks_list):
            queries = [forward.query(toks, scale) for toks in toks_list]
            asked = [q for q in queries if q]
            if not asked:
                tops = []
            elif exact:
                # Every uncertain query is deepened in one batch call (one scan of the vectors each round).
                def candidates(positions, depth):
                    return [(rows, scores.min() * margin(asked[i]) if len(rows) == depth and len(rows) else 0.)
                            for i, (rows, scores) in zip(positions, batch([asked[i] for i in positions], depth))]

                tops = certified_tops(candidates, lambda i, rows: forward.rescore(asked[i], rows), k,
                                      index.num_docs(), len(asked))
            else:
                # Seismic scores its candidates with the whole query on its forward index, so where its arithmetic is
                # exact (margin 1) its scores are PISA's and re-scoring would only repeat them.
                tops = [ranked(rows, scores if margin(q) == 1 else forward.rescore(q, rows), k)
                        for q, (rows, scores) in zip(asked, batch(asked, k))]
            tops = iter(tops)
            return [next(tops) if q else (np.zeros(0, np.int64), np.zeros(0)) for q in queries]

        mode = 'exact' if exact else f'query_cut={query_cut}, heap_factor={heap_factor}'
        return ToksSearcher(search, forward.docnos, f'Seismic({mode})')
