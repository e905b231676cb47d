"""Asymmetric SPLADE: documents and queries through two models of one kind and one vocabulary.

Made by ``domain_adapt(..., DomainConfig(side='query'))``, which adapts the query encoder alone: documents keep the
encoder an index was built with, so an existing index of the starting model serves the adapted queries as it is. A
model folder is the document model's folder as its own kind writes it (``lsr.kind`` set to ``asymmetric``, the
sides' kind in ``lsr.sides``) with the query model's folder in its ``query/`` subfolder.
"""
from pathlib import Path
from typing import Optional

from .encoders import Splade, SpladeEncoder
from .loading import MODEL_KINDS, load_model, local_folder, model_class, model_settings, update_settings
from .models.splade import ModelLoadError

__all__ = ['AsymmetricSplade']

QUERY_FOLDER = 'query'


class AsymmetricSplade(Splade):
    """:class:`Splade` whose :meth:`query_encoder` runs its own model (``query_model``, same tokenizer and terms);
    documents, :meth:`encode` and :meth:`doc_encoder` run ``model``. ``sides``: the wrapper class both models belong
    to (:class:`Splade`, :class:`~pyterrier_lsr.SaeSplade`...), which saves and loads each of them."""
    kind = 'asymmetric'

    def __init__(self, model, tokenizer, query_model, sides: type[Splade] = Splade, **kwargs):
        if sides is AsymmetricSplade or not issubclass(sides, Splade):
            raise ValueError(f'sides must be the Splade class both models belong to, got {sides!r}')
        super().__init__(model, tokenizer, **kwargs)
        if query_model.vocab_size != model.vocab_size:
            raise ValueError(f'the query model scores {query_model.vocab_size} terms, the document model '
                             f'{model.vocab_size}: both sides must share one vocabulary')
        self.sides = sides
        self.query_splade = sides(query_model, tokenizer, device=self.device, max_length=self.max_length,
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
        """The document model's folder as ``sides`` writes it, the query model's in ``query/``."""
        self.sides(self.model, self.tokenizer, device=self.device, name=self.name).save_pretrained(path)
        update_settings(path, kind=self.kind, sides=self.sides.kind)
        self.query_splade.save_pretrained(str(Path(path) / QUERY_FOLDER))

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs) -> 'AsymmetricSplade':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` go to :class:`Splade`."""
        folder = local_folder(name_or_path)
        if not (folder / QUERY_FOLDER / 'config.json').is_file():
            raise ModelLoadError(f'{name_or_path} has no {QUERY_FOLDER}/ model folder: not an asymmetric model')
        kind = model_settings(folder).get('sides') or 'splade'  # folders written before `sides` hold SPLADE models
        if kind not in MODEL_KINDS or kind == cls.kind:
            raise ModelLoadError(f'{name_or_path}: unknown kind of sides {kind!r}')
        sides = model_class(kind)
        docs = sides.from_pretrained(str(folder))
        queries = load_model(folder / QUERY_FOLDER)
        if type(queries) is not sides:
            raise ModelLoadError(f'{name_or_path}: the documents\' model is a {kind} model, the queries\' a '
                                 f'{queries.kind} model')
        return cls(docs.model, docs.tokenizer, queries.model, sides, name=str(name_or_path), **kwargs)
