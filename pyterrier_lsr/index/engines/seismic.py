"""Seismic (Bruch et al., SIGIR 2024 / CIKM 2024) through the ``pyseismic-lsr`` package: approximate top-k over
statically pruned, clustered posting lists with summaries, re-scored on a forward index.

How Seismic's values relate to the index ``scale``: Seismic stores values as float16 and scores by the float dot
product, so it is given PISA's integers themselves: document values ``int(w * scale)`` (postings of impact 0 removed,
as in PISA) and query values ``int(q * scale)``.  Its scores are then PISA's scores, ``sum_t int(q_t * scale) *
int(d_t * scale)`` (about ``scale**2`` times the dot product), exact for every impact up to 2048 (float16 holds
integers exactly up to 2048; larger ones round to 11 significant bits).  Terms are given to Seismic as integer ids
(the index's term list is kept in ``terms.json``), so no term is truncated to Seismic's fixed-width strings.

Seismic has no exact search mode; ``exact=True`` uses its brute-force scan of the same vectors (``SeismicDataset``,
loaded into memory when the retriever is made): exact, slow, meant for checking.  The approximate knobs: at build time
``n_postings`` (average posting-list length kept; ``max_fraction`` times it at most per list), ``centroid_fraction``,
``summary_energy``; at query time ``query_cut`` (query terms kept, highest weights first) and ``heap_factor`` (a block
is skipped when its summary's score is below ``heap_factor`` times the k-th best score so far: lower values skip
fewer blocks, more accurate and slower).
"""
import numpy as np
import pyterrier as pt

from .glue import Timer, ToksSearcher, check_threads, quantized_csr, read_terms, require, write_terms

INDEX_NAME = 'index'  # Seismic appends '.index.seismic'
INDEX_FILE = INDEX_NAME + '.index.seismic'
MAX_SMALL_VOCABULARY = 2 ** 16 - 1  # SeismicIndex numbers terms in 16 bits; the LV classes in 32


def _classes(seismic, num_terms: int):
    if num_terms > MAX_SMALL_VOCABULARY:
        return seismic.SeismicDatasetLV, seismic.SeismicIndexLV
    return seismic.SeismicDataset, seismic.SeismicIndex


def _dataset(seismic, index):
    """The index's quantized vectors as a SeismicDataset (components sorted within each document)."""
    docnos, terms, indptr, ids, impacts = quantized_csr(index)
    rows = np.repeat(np.arange(len(docnos)), np.diff(indptr))
    order = np.lexsort((ids, rows))
    dataset_class, _ = _classes(seismic, len(terms))
    dataset = dataset_class(dim=len(terms))
    dataset.add_documents_by_id(docnos, ids[order].astype(np.int64), impacts[order].astype(np.float32),
                                indptr.astype(np.int64))
    return dataset, terms


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
        with Timer() as timer:
            dataset, terms = _dataset(seismic, index)
            _, index_class = _classes(seismic, len(terms))
            built = index_class.build_from_dataset(
                dataset, n_postings=n_postings, centroid_fraction=centroid_fraction, min_cluster_size=min_cluster_size,
                summary_energy=summary_energy, max_fraction=max_fraction, doc_cut=doc_cut,
                num_threads=check_threads(threads))
            built.save(str(folder / INDEX_NAME))
            write_terms(folder, terms)
        return {'n_postings': n_postings, 'centroid_fraction': centroid_fraction, 'summary_energy': summary_energy,
                'max_fraction': max_fraction, 'min_cluster_size': min_cluster_size, 'doc_cut': doc_cut,
                'large_vocabulary': len(terms) > MAX_SMALL_VOCABULARY, 'build_seconds': round(timer.seconds, 3)}

    def retriever(self, index, folder, num_results: int, query_cut: int = 20, heap_factor: float = 0.7,
                  exact: bool = False, threads: int = 1, verbose: bool = False) -> pt.Transformer:
        seismic = require('seismic', 'pyseismic-lsr')
        check_threads(threads)
        if query_cut < 1 or not heap_factor > 0:
            raise ValueError(f'query_cut must be >= 1 and heap_factor > 0, got {query_cut}, {heap_factor}')
        term_ids = read_terms(folder)
        if exact:
            searcher, _ = _dataset(seismic, index)
            options = {}
        else:
            _, index_class = _classes(seismic, len(term_ids))
            searcher = index_class.load(str(folder / INDEX_FILE))
            options = dict(heap_factor=heap_factor)
        string = seismic.get_seismic_string()

        def cut(longest):
            # pyseismic-lsr 0.5.4 scores wrongly with query_cut=1000 exactly (measured), so larger cuts than any query
            # needs are clamped to the longest query of the batch.
            return {} if exact else {'query_cut': min(query_cut, longest)}

        scale = index.scale

        def search(queries):
            kept = [{str(term_ids[t]): q for t, q in ((t, int(w * scale)) for t, w in toks.items())
                     if q > 0 and t in term_ids} for toks in queries]
            asked = [i for i, q in enumerate(kept) if q]
            found = [([], [])] * len(queries)
            if asked:
                results = searcher.batch_search(
                    np.array([str(i) for i in asked], dtype=string),
                    [np.array(list(kept[i]), dtype=string) for i in asked],
                    [np.array(list(kept[i].values()), dtype=np.float32) for i in asked],
                    k=num_results, num_threads=threads, **cut(max(len(kept[i]) for i in asked)), **options)
                # Results come back in no fixed order (measured), each tagged with its query id.
                for result in filter(None, results):
                    found[int(result[0][0])] = ([docno for _, _, docno in result], [score for _, score, _ in result])
            return found

        mode = 'exact' if exact else f'query_cut={query_cut}, heap_factor={heap_factor}'
        return ToksSearcher(search, f'Seismic({mode})')
