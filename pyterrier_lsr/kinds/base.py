"""The one contract every model kind implements, and the PyTerrier transformers it hands out.

A model kind (SPLADE, inference-free, asymmetric, SAE-SPLADE, Latent Terms, SSR) is a :class:`SparseModel`: it
encodes documents and queries to sparse ``{term: weight}`` vectors (:meth:`~SparseModel.encode_docs`,
:meth:`~SparseModel.encode_queries`, floats in the model's own units: quantization happens once, in the index),
declares its settings (``kind``, ``scoring``, ``terms`` namespace) and writes/reads its folder
(:meth:`~SparseModel.save_pretrained` / :meth:`~SparseModel.from_pretrained`).  The base class gives every kind, once:

* ``query_encoder()`` / ``doc_encoder()`` (transformers adding ``query_toks`` / ``toks``) and ``scorer()`` (exact
  float dot-product re-ranking);
* the model hand-over to indexers: ``model.doc_encoder() >> SpladeIndexer(path)`` (and ``model >> indexer``) records
  the model in the index, whatever the kind; an indexer that encodes the text itself (``ssr >>
  SSRIndex(path).indexer()``) is handed the model and is then the whole pipeline (:func:`compose`);
* ``pt.Transformer`` behaviour (a frame with ``query`` and ``text`` is re-ranked, else ``query`` or ``text`` is
  encoded), a short ``repr`` and a display ``label`` for tables;
* name resolution (a local folder, an offline short name such as ``'splade-tiny'``, or a hub name) and atomic,
  guarded folder writes (:mod:`pyterrier_lsr.core.storage`): a model folder is built beside and swapped in, replaces
  only a
  model folder of ours, and saving never renames the model.

This is pyterrier_dr's ``BiEncoder`` idea for sparse vectors (sentence-transformers' ``SparseEncoder`` is the same
split: ``encode_query`` / ``encode_document``).
"""
import abc
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Optional

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from ..core import storage
from ..core.checks import check_result_frame
from ..core.encoding import as_text
from .loading import local_folder, update_settings

MODEL_ARTIFACT = 'model'
TERM_NAMESPACES = ('vocabulary', 'latent')

__all__ = ['SparseModel', 'SparseTextEncoder', 'SparseEncoder', 'SparseScorer', 'sparse_dot', 'MODEL_ARTIFACT',
           'hand_over', 'compose']


class SparseTextEncoder(pt.Transformer):
    """Adds ``out_field`` = ``{term: weight}`` encoded from ``text_field`` (subclasses implement :meth:`encode`).

    A document-side encoder that knows its model (``model``) hands it to a following indexer."""
    text_field = 'text'
    out_field = 'toks'
    model: Optional['SparseModel'] = None

    def encode(self, texts: Sequence) -> list[dict[str, float]]:
        raise NotImplementedError

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.columns(inp, includes=[self.text_field])
        texts = inp[self.text_field].tolist()
        return inp.assign(**{self.out_field: self.encode(texts) if texts else pd.Series(dtype=object)})

    def __rshift__(self, other):
        if self.out_field == 'toks':
            other = hand_over(self.model, other)
        return super().__rshift__(other)


def hand_over(model: Optional['SparseModel'], other):
    """A document encoder hands its model to a following indexer, so that the index records (and reloads) it."""
    if model is not None and callable(getattr(other, 'with_model', None)):
        return other.with_model(model)
    return other


def compose(model, other) -> pt.Transformer:
    """``model >> other`` for a model: the model is handed over (:func:`hand_over`); a transformer that encodes the
    text itself with the model it was handed (``encodes_text``: a token-level store, whose rows no frame column
    carries) is then the whole pipeline, as composing the model in front would encode every text twice."""
    other = hand_over(model, other)
    if getattr(other, 'encodes_text', False):
        return other
    return pt.Transformer.__rshift__(model, other)


class SparseEncoder(SparseTextEncoder):
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


class SparseModel(pt.Transformer, abc.ABC):
    """The contract of every model kind: two encoders to sparse vectors, settings, and a folder format.

    A kind implements :meth:`encode_docs`, :meth:`encode_queries`, :meth:`write_folder` (its files into an empty
    folder), :meth:`load_folder` (a classmethod reading a local folder) and :meth:`example` (a classmethod giving a
    small offline instance, for the conformance suite), and sets :attr:`kind` (its key in
    :data:`pyterrier_lsr.kinds.loading.MODEL_KINDS`, recorded in the folder), :attr:`scoring` and
    :attr:`terms_namespace`.

    As a transformer, a model re-ranks a frame with ``query`` and ``text`` (:meth:`scorer`), else encodes ``query``
    (:meth:`query_encoder`) or ``text`` (:meth:`doc_encoder`); ``model >> indexer`` hands the model to the indexer.

    Example::

        splade = Splade.from_pretrained("splade-tiny")          # any kind: load_model(folder) picks it
        splade.encode_queries(["radio waves"])                  # [{'radio': 1.9, 'waves': 2.1, ...}]
        index = (splade >> LsrIndex("vaswani.lsr").indexer()).index(corpus)
    """
    kind: ClassVar[str]
    #: how an index of this model scores: ``{'kind': 'dot'}``, or BM25 over term frequencies (Latent Terms)
    scoring: ClassVar[dict] = {'kind': 'dot'}
    #: ``'vocabulary'``: terms are the tokenizer's tokens; ``'latent'``: terms are latent ids ``l<id>``
    terms_namespace: ClassVar[str] = 'vocabulary'
    #: the kind's name in tables (``label``)
    display: ClassVar[str] = 'model'
    name: str | None = None

    # -- the contract ---------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def encode_docs(self, texts: Sequence, batch_size: int | None = None,
                    verbose: bool = False) -> list[dict[str, float]]:
        """Documents to ``{term: weight}`` dicts, in order; None/NaN/blank texts give ``{}``."""

    @abc.abstractmethod
    def encode_queries(self, texts: Sequence, batch_size: int | None = None,
                       verbose: bool = False) -> list[dict[str, float]]:
        """Queries to ``{term: weight}`` dicts, in order; None/NaN/blank texts give ``{}``."""

    @abc.abstractmethod
    def write_folder(self, folder: Path) -> None:
        """Writes this model's files into ``folder`` (new and empty); :meth:`save_pretrained` adds the settings."""

    @classmethod
    @abc.abstractmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'SparseModel':
        """The model saved in the local ``folder``; ``kwargs`` are the kind's runtime options (device, ...)."""

    @classmethod
    @abc.abstractmethod
    def example(cls) -> 'SparseModel':
        """A small instance of this kind built from the offline checkpoints (random where the kind trains a part),
        on the CPU: what the conformance suite runs every registered kind with."""

    def settings(self) -> dict:
        """What the folder's ``config.json`` records under ``lsr`` (read back by :func:`~pyterrier_lsr.load_model`)."""
        return {'kind': self.kind, 'terms': self.terms_namespace}

    # -- given once -----------------------------------------------------------------------------------------------
    def encode(self, texts: Sequence, batch_size: int | None = None,
               verbose: bool = False) -> list[dict[str, float]]:
        """Documents to ``{term: weight}`` dicts (:meth:`encode_docs`)."""
        return self.encode_docs(texts, batch_size=batch_size, verbose=verbose)

    def save_pretrained(self, path: str | Path, overwrite: bool = True) -> Path:
        """Writes the model folder atomically: built beside ``path`` and swapped in; an existing ``path`` is replaced
        only when it is empty or a model folder written by this package (never a user folder).  The model keeps its
        name (saving a copy, e.g. into an index, never renames it)."""
        with storage.build_folder(path, MODEL_ARTIFACT, overwrite=overwrite, what='model folder') as tmp:
            self.save_into(tmp)
        return Path(path)

    def save_into(self, folder: Path) -> None:
        """The folder's files and settings, into a folder being built (for models nested in another's folder)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.write_folder(folder)
        update_settings(folder, **self.settings())

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, name: str | None = None, **kwargs) -> 'SparseModel':
        """Loads a model folder, an offline short name (``'splade-tiny'``) or a hub name, resolved here for every
        kind; the model is named ``name`` (default: ``name_or_path``); ``kwargs``: device, batch_size, precision..."""
        model = cls.load_folder(local_folder(name_or_path), **kwargs)
        model.name = name or str(name_or_path)
        return model

    def query_encoder(self, batch_size: int | None = None, verbose: bool = False) -> SparseTextEncoder:
        """Transformer adding ``query_toks`` from ``query``."""
        return SparseEncoder(self, True, 'query', batch_size, verbose)

    def doc_encoder(self, text_field: str = 'text', batch_size: int | None = None,
                    verbose: bool = False) -> SparseTextEncoder:
        """Transformer adding ``toks`` from ``text_field`` (hands this model to a following indexer)."""
        return SparseEncoder(self, False, text_field, batch_size, verbose)

    def scorer(self, text_field: str = 'text', batch_size: int | None = None) -> SparseScorer:
        """Transformer re-ranking ``qid, query, docno, text`` by the exact dot product."""
        return SparseScorer(self.query_encoder(batch_size), self.doc_encoder(text_field, batch_size))

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        with pta.validate.any(inp) as v:
            v.result_frame(extra_columns=['query', 'text'], mode='scorer')
            v.columns(includes=['query'], mode='query_encoder')
            v.columns(includes=['text'], mode='doc_encoder')
        return getattr(self, v.mode)()(inp)

    def __rshift__(self, other):
        return compose(self, other)

    @property
    def short_name(self) -> str:
        return Path(str(self.name)).name if self.name else '<model>'

    @property
    def label(self) -> str:
        """A short, stable name for tables: ``SPLADE (splade-tiny)``."""
        return f'{self.display} ({self.short_name})'

    def __repr__(self):
        return f'{type(self).__name__}({self.short_name!r})'
