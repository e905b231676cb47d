"""The PyTerrier transformers over sparse vectors that every model kind hands out: one side of a model as an encoder
(:class:`ModelEncoder`, made by ``query_encoder()`` / ``doc_encoder()``), the base of every text-to-vector encoder
(:class:`SparseTextEncoder`, also the inference-free query encoders') and the exact re-ranker (:class:`SparseScorer`).
"""
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from ..core.checks import check_not_text, check_result_frame
from ..core.encoding import as_text

if TYPE_CHECKING:
    from ..kinds.base import SparseModel

__all__ = ['SparseTextEncoder', 'ModelEncoder', 'SparseScorer', 'sparse_dot']


class SparseTextEncoder(pt.Transformer):
    """Adds ``out_field`` = ``{term: weight}`` encoded from ``text_field`` (subclasses implement :meth:`encode`)."""
    text_field = 'text'
    out_field = 'toks'
    model: Optional['SparseModel'] = None

    def encode(self, texts: Sequence) -> list[dict[str, float]]:
        raise NotImplementedError

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_not_text(inp, repr(self))  # the first stage of a retriever: `retriever("a query")` comes here
        pta.validate.columns(inp, includes=[self.text_field])
        texts = inp[self.text_field].tolist()
        return inp.assign(**{self.out_field: self.encode(texts) if texts else pd.Series(dtype=object)})


class ModelEncoder(SparseTextEncoder):
    """One side of a :class:`SparseModel` as a transformer (made by ``query_encoder()`` / ``doc_encoder()``)."""

    def __init__(self, model: 'SparseModel', query: bool, text_field: str, batch_size: int | None = None,
                 verbose: bool = False):
        self.model = model
        self.query = query
        self.text_field = text_field
        self.out_field = 'query_toks' if query else 'toks'
        self.batch_size = batch_size
        self.verbose = verbose

    def encode(self, texts: Sequence) -> list[dict[str, float]]:
        encode = self.model.encode_queries if self.query else self.model.encode_docs
        return encode(texts, batch_size=self.batch_size, verbose=self.verbose)

    def _key(self):
        # the model object itself (its weights may change in place), the side and what changes the vectors
        return id(self.model), self.query, self.text_field, self.batch_size

    def __eq__(self, other):
        """Encoders of one model object and side, with the same settings, are equal (``pt.Experiment(
        precompute_prefix=True)`` then encodes the queries once for every system they start)."""
        return type(other) is type(self) and other.model is self.model and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f'{self.model!r}.{"query" if self.query else "doc"}'


def sparse_dot(query: dict[str, float], doc: dict[str, float]) -> float:
    if len(doc) < len(query):
        query, doc = doc, query
    return sum(w * doc.get(t, 0.) for t, w in query.items())


class SparseScorer(pt.Transformer):
    """Re-ranks ``qid, query, docno, text`` frames by the exact (float) dot product of the sparse vectors.

    Args:
        query_encoder: adds ``query_toks`` (a model's ``query_encoder()``).
        doc_encoder: adds ``toks`` from its ``text_field`` (a model's ``doc_encoder()``).

    Example::

        pipeline = bm25 % 100 >> pt.text.get_text(dataset, "text") >> splade.scorer()   # same as SparseScorer(...)
    """

    def __init__(self, query_encoder: SparseTextEncoder, doc_encoder: SparseTextEncoder):
        self.query_encoder = query_encoder
        self.doc_encoder = doc_encoder

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query', self.doc_encoder.text_field])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        # Missing texts become '' (encoded as empty vectors) so that they can key the caches below.
        query_col = [as_text(q, i) for i, q in enumerate(inp['query'])]
        text_col = [as_text(t, i) for i, t in enumerate(inp[self.doc_encoder.text_field])]
        queries, texts = list(dict.fromkeys(query_col)), list(dict.fromkeys(text_col))
        qvecs = dict(zip(queries, self.query_encoder.encode(queries)))
        dvecs = dict(zip(texts, self.doc_encoder.encode(texts)))
        scores = [sparse_dot(qvecs[q], dvecs[d]) for q, d in zip(query_col, text_col)]
        return pt.model.add_ranks(inp.assign(score=scores))

    def __repr__(self):
        return f'{self.query_encoder!r} . {self.doc_encoder!r}'
