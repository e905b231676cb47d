"""Asymmetric SPLADE: documents and queries through two SPLADE models of one vocabulary.

Made by ``domain_adapt(..., DomainConfig(side='query'))``, which adapts the query encoder alone: documents keep the
encoder an index was built with, so an existing index of the starting model serves the adapted queries as it is. A
model folder is the document model's ordinary HF folder with the query model's in its ``query/`` subfolder.
"""
from pathlib import Path
from typing import Optional

from .encoders import Splade, SpladeEncoder
from .loading import local_folder
from .models.splade import ModelLoadError, SpladeModel

__all__ = ['AsymmetricSplade']

QUERY_FOLDER = 'query'


class AsymmetricSplade(Splade):
    """:class:`Splade` whose :meth:`query_encoder` runs its own model (``query_model``, same tokenizer and terms);
    documents, :meth:`encode` and :meth:`doc_encoder` run ``model``."""
    kind = 'asymmetric'

    def __init__(self, model: SpladeModel, tokenizer, query_model: SpladeModel, **kwargs):
        super().__init__(model, tokenizer, **kwargs)
        if query_model.vocab_size != model.vocab_size:
            raise ValueError(f'the query model scores {query_model.vocab_size} terms, the document model '
                             f'{model.vocab_size}: both sides must share one vocabulary')
        self.query_splade = Splade(query_model, tokenizer, device=self.device, max_length=self.max_length,
                                 batch_size=self.batch_size, precision=self.precision, name=self.name)

    @property
    def name(self) -> Optional[str]:
        return self._name

    @name.setter
    def name(self, value: Optional[str]):
        # one name for both sides: pipelines built from query_encoder() are named after the whole model
        self._name = value
        if 'query_splade' in vars(self):
            self.query_splade.name = value

    def query_encoder(self, batch_size: Optional[int] = None, verbose: bool = False) -> SpladeEncoder:
        return self.query_splade.query_encoder(batch_size, verbose)

    def save_pretrained(self, path: str):
        """The document model's HF folder, the query model's in ``query/``."""
        super().save_pretrained(path)
        self.query_splade.save_pretrained(str(Path(path) / QUERY_FOLDER))

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs) -> 'AsymmetricSplade':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` go to :class:`Splade`."""
        folder = local_folder(name_or_path)
        if not (folder / QUERY_FOLDER / 'config.json').is_file():
            raise ModelLoadError(f'{name_or_path} has no {QUERY_FOLDER}/ model folder: not an asymmetric model')
        docs = Splade.from_pretrained(str(folder))
        queries = Splade.from_pretrained(str(folder / QUERY_FOLDER))
        return cls(docs.model, docs.tokenizer, queries.model, name=str(name_or_path), **kwargs)
