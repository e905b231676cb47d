"""The one contract every model kind implements.

A model kind (SPLADE, inference-free, asymmetric, SAE-SPLADE, Latent Terms, SSR) is a :class:`SparseModel`: it
encodes documents and queries to sparse ``{term: weight}`` vectors (:meth:`~SparseModel.encode_docs`,
:meth:`~SparseModel.encode_queries`, floats in the model's own units: quantization happens once, in the index),
declares its settings (``kind``, ``scoring``, ``terms`` namespace) and writes/reads its folder
(:meth:`~SparseModel.save_pretrained` / :meth:`~SparseModel.from_pretrained`).  The base class gives every kind, once:

* ``query_encoder()`` / ``doc_encoder()`` (transformers adding ``query_toks`` / ``toks``) and ``scorer()`` (exact
  float dot-product re-ranking);
* composition as any ``pt.Transformer`` (an index records the model it is given: ``LsrIndex(path, model)`` or
  ``index.indexer(model)``);
* ``pt.Transformer`` behaviour (a frame with ``query`` and ``text`` is re-ranked, else ``query`` or ``text`` is
  encoded), a short ``repr`` and a display ``label`` for tables;
* name resolution (a local folder, an offline short name such as ``'splade-tiny'``, or a hub name) and atomic,
  guarded folder writes (:mod:`pyterrier_lsr.core.storage`): a model folder is built beside and swapped in, replaces
  only a model folder of ours, and saving never renames the model.

The transformers themselves are in :mod:`pyterrier_lsr.stages.encoders`.

This is pyterrier_dr's ``BiEncoder`` idea for sparse vectors (sentence-transformers' ``SparseEncoder`` is the same
split: ``encode_query`` / ``encode_document``).
"""
import abc
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from ..core import storage
from ..core.folders import local_folder, update_settings
from ..core.quiet import quiet_transformers
from ..stages.encoders import ModelEncoder, SparseScorer, SparseTextEncoder

MODEL_ARTIFACT = 'model'
TERM_NAMESPACES = ('vocabulary', 'latent')

__all__ = ['SparseModel', 'MODEL_ARTIFACT']


class SparseModel(pt.Transformer, abc.ABC):
    """The contract of every model kind: two encoders to sparse vectors, settings, and a folder format.

    A kind implements :meth:`encode_docs`, :meth:`encode_queries`, :meth:`write_folder` (its files into an empty
    folder), :meth:`load_folder` (a classmethod reading a local folder) and :meth:`example` (a classmethod giving a
    small offline instance, for the conformance suite), and sets :attr:`kind` (its key in
    :data:`pyterrier_lsr.kinds.loading.MODEL_KINDS`, recorded in the folder), :attr:`scoring` and
    :attr:`terms_namespace`.

    As a transformer, a model re-ranks a frame with ``query`` and ``text`` (:meth:`scorer`), else encodes ``query``
    (:meth:`query_encoder`) or ``text`` (:meth:`doc_encoder`); an index records the model it is given.

    Example::

        splade = Splade.from_pretrained("splade-tiny")          # any kind: load_model(folder) picks it
        splade.encode_queries(["radio waves"])                  # [{'radio': 1.9, 'waves': 2.1, ...}]
        index = LsrIndex("vaswani.lsr", splade).index(corpus)
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
        with quiet_transformers():  # its "Writing model shards" bar: verbose=False is silent
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
        return ModelEncoder(self, True, 'query', batch_size, verbose)

    def doc_encoder(self, text_field: str = 'text', batch_size: int | None = None,
                    verbose: bool = False) -> SparseTextEncoder:
        """Transformer adding ``toks`` from ``text_field``."""
        return ModelEncoder(self, False, text_field, batch_size, verbose)

    def scorer(self, text_field: str = 'text', batch_size: int | None = None) -> SparseScorer:
        """Transformer re-ranking ``qid, query, docno, text`` by the exact dot product."""
        return SparseScorer(self.query_encoder(batch_size), self.doc_encoder(text_field, batch_size))

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        with pta.validate.any(inp) as v:
            v.result_frame(extra_columns=['query', 'text'], mode='scorer')
            v.columns(includes=['query'], mode='query_encoder')
            v.columns(includes=['text'], mode='doc_encoder')
        return getattr(self, v.mode)()(inp)

    @property
    def short_name(self) -> str:
        return Path(str(self.name)).name if self.name else '<model>'

    @property
    def label(self) -> str:
        """A short, stable name for tables: ``SPLADE (splade-tiny)``."""
        return f'{self.display} ({self.short_name})'

    def __repr__(self):
        return f'{type(self).__name__}({self.short_name!r})'
