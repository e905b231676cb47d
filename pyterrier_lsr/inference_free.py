"""Inference-free (doc-only) SPLADE: a SPLADE document encoder with a static query side.

A model folder is an ordinary HF masked-LM folder plus ``idf.json`` — the layout OpenSearch's doc-only sparse models
publish — or a sentence-transformers sparse model whose query route is a ``SparseStaticEmbedding`` (its document route
a masked-LM transformer folder), read without importing sentence-transformers.
"""
import json
from typing import Optional

from .encoders import Splade
from .loading import load_model, local_folder
from .models.splade import SpladeModel
from .query import WEIGHTS_FILE, StaticQueryEncoder, static_module_folder

__all__ = ['InferenceFreeSplade', 'load_model']  # load_model: its old home, kept for one release


class InferenceFreeSplade(Splade):
    """:class:`Splade` whose :meth:`query_encoder` is a :class:`StaticQueryEncoder` (no transformer at query time)."""
    kind = 'inference-free'

    def __init__(self, model: SpladeModel, tokenizer, query_side: StaticQueryEncoder, **kwargs):
        super().__init__(model, tokenizer, **kwargs)
        self.query_side = query_side

    def query_encoder(self, batch_size: Optional[int] = None, verbose: bool = False) -> StaticQueryEncoder:
        return self.query_side

    def save_pretrained(self, path: str):
        """HF model folder + tokenizer + ``idf.json``."""
        super().save_pretrained(path)
        self.query_side.save_pretrained(path)

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs) -> 'InferenceFreeSplade':
        """Loads an OpenSearch-style folder/hub name (HF model + ``idf.json``) or a sentence-transformers doc-only
        layout. ``kwargs`` go to :class:`Splade`."""
        from transformers import AutoTokenizer
        folder = local_folder(name_or_path)
        doc_folder = folder
        if not (folder / WEIGHTS_FILE).exists():
            found = [p.parent for p in sorted(folder.rglob('config.json'))
                     if p.parent != folder and 'model_type' in json.loads(p.read_text())]
            if not found or static_module_folder(folder) is None:
                raise FileNotFoundError(f'{name_or_path} has neither {WEIGHTS_FILE} nor a sentence-transformers '
                                        'SparseStaticEmbedding query module')
            doc_folder = found[0]
        tokenizer = AutoTokenizer.from_pretrained(str(doc_folder))
        model = SpladeModel.from_pretrained(str(doc_folder), special_token_ids=tokenizer.all_special_ids)
        query_side = StaticQueryEncoder.from_pretrained(str(folder))
        return cls(model, tokenizer, query_side, name=str(name_or_path), **kwargs)


def __getattr__(name):
    # train_inference_free moved to pyterrier_lsr.train (training sits above the wrappers); its old home still works
    # for one release.
    if name == 'train_inference_free':
        import warnings
        warnings.warn('pyterrier_lsr.inference_free.train_inference_free moved to pyterrier_lsr.train',
                      DeprecationWarning, stacklevel=2)
        from .train.inference_free import train_inference_free
        return train_inference_free
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
