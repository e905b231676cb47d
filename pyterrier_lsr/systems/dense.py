"""The dense base of a Latent Terms system as a retriever of its own: exact (exhaustive) cosine between the dense
model's pooled, normalised embeddings of the query and of every document, the documents' embeddings computed once by
the same cached, resumable pass Latent Terms indexes from
(:func:`~pyterrier_lsr.kinds.latent_terms.cached_embeddings`)."""
from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from ..core.checks import check_docnos, check_int, check_query_frame
from ..index.ranking import docno_ranks, top_rows
from ..kinds.latent_terms import LatentTerms, cached_embeddings

__all__ = ['DenseRetriever', 'dense_retriever', 'per_text']


class DenseRetriever(pt.Transformer):
    """Retrieves the ``num_results`` documents of highest cosine with each ``query`` (none for a blank query);
    ``vectors`` are the documents' unit-norm embeddings (row ``i`` for ``docnos[i]``; all-zero rows for blank
    documents score 0) from ``dense``, a ``single``-mode :class:`~pyterrier_lsr.kinds.latent_terms.LatentTerms` (which
    embeds the queries the same way).

    Args:
        dense: the model that embedded the documents, in ``single`` mode.
        docnos: the documents' ids, one per row of ``vectors``.
        vectors: the documents' unit-norm embeddings.
        num_results: documents returned per query.

    Returns:
        As a transformer: ``qid, query`` -> ``qid, query, docno, score, rank`` (rank from 0).

    Raises:
        ValueError: ``dense`` not in ``single`` mode, as many docnos as vectors not given, or a bad
            ``num_results``.

    Example::

        dense = dense_retriever(corpus, "all-MiniLM-L6-v2", cache_dir="embeddings")   # builds this class
        pt.Experiment([dense], topics, qrels, [nDCG @ 10])
    """

    def __init__(self, dense: LatentTerms, docnos: Sequence[str], vectors: np.ndarray, num_results: int = 1000):
        if dense.mode != 'single':
            raise ValueError(f"the dense base scores one pooled vector per text: mode must be 'single', got "
                             f'{dense.mode!r}')
        if len(docnos) != len(vectors):
            raise ValueError(f'{len(docnos)} docnos for {len(vectors)} document vectors')
        self.dense, self.docnos = dense, np.asarray(check_docnos(list(docnos), 'the dense documents'), dtype=object)
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.num_results = check_int('num_results', num_results, 1)
        self._ranks = docno_ranks(self.docnos)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_query_frame(inp, ['query'])
        out = pta.DataFrameBuilder(['docno', 'score', 'rank'])
        if len(inp) and len(self.docnos):  # over no documents every query retrieves nothing
            queries = self._query_vectors(inp['query'].tolist())
            scores = queries @ self.vectors.T
            k = min(self.num_results, len(self.docnos))
            for i, row in enumerate(scores):
                if not queries[i].any():  # a blank query: every document would tie at 0, in corpus order
                    continue
                top = top_rows(row, k, self._ranks)  # ties by docno, as every retriever (index/ranking.py)
                out.extend({'_index': i, 'docno': self.docnos[top].tolist(), 'score': row[top].tolist(),
                            'rank': list(range(k))})
        return out.to_df(inp.reset_index(drop=True))

    def _query_vectors(self, queries: list) -> np.ndarray:
        """One row per query (zeros for a blank one, which embeds to no row)."""
        return per_text(*self.dense.embed(queries))

    def __repr__(self):
        return f'Dense({self.dense.dense_name})'


def per_text(vectors: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``single``-mode embeddings (:meth:`~pyterrier_lsr.kinds.latent_terms.LatentTerms.embed`) as one row per text,
    blank
    texts (which own no row) given zeros."""
    full = np.zeros((len(offsets) - 1, vectors.shape[1]), dtype=np.float32)
    full[np.diff(offsets) == 1] = vectors
    return full


def dense_retriever(corpus: Sequence[dict], dense: str = 'all-MiniLM-L6-v2', cache_dir='dense_cache',
                    num_results: int = 1000, verbose: bool = True, **latent_terms_kwargs) -> DenseRetriever:
    """:class:`DenseRetriever` over ``corpus`` (``docno, text`` dicts) with the dense model ``dense`` (offline name,
    hub name or sentence-transformers folder), its document embeddings cached in ``cache_dir`` (shared with Latent
    Terms' ``single`` mode); ``latent_terms_kwargs``: device, batch_size, max_length, precision.

    Args:
        corpus: the documents, ``{'docno', 'text'}`` dicts.
        dense: the dense model.
        cache_dir: a folder for the embeddings (one of ours: a folder of other files is refused); an interrupted
            pass resumes there, and a second call embeds nothing.
        num_results: documents returned per query.
        verbose: show the embedding pass's progress.

    Returns:
        A :class:`DenseRetriever` (exact cosine over every document).

    Raises:
        FileExistsError: ``cache_dir`` is a folder that is not an embedding cache.

    Example::

        dense = dense_retriever(corpus, "all-MiniLM-L6-v2", cache_dir="embeddings")
        dense.search("radio waves in the ionosphere")
    """
    model = LatentTerms(dense, mode='single', **latent_terms_kwargs)
    vectors = per_text(*cached_embeddings(model, [d['text'] for d in corpus], cache_dir, verbose))
    return DenseRetriever(model, [d['docno'] for d in corpus], vectors, num_results)
