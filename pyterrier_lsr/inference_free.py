"""Inference-free (doc-only) SPLADE: a SPLADE document encoder with a static query side.

A model folder is an ordinary HF masked-LM folder plus ``idf.json`` — the layout OpenSearch's doc-only sparse models
publish — or a sentence-transformers sparse model whose query route is a ``SparseStaticEmbedding`` (its document route
a masked-LM transformer folder), read without importing sentence-transformers.
"""
import json
from pathlib import Path
from typing import Optional

from .encoders import Splade
from .models.sae_splade import SaeSplade, is_sae_splade_folder
from .models.splade import SpladeModel
from .query import WEIGHTS_FILE, StaticQueryEncoder, _local_folder, _static_module_folder


class InferenceFreeSplade(Splade):
    """:class:`Splade` whose :meth:`query_encoder` is a :class:`StaticQueryEncoder` (no transformer at query time)."""

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
        folder = _local_folder(str(name_or_path))
        doc_folder = folder
        if not (folder / WEIGHTS_FILE).exists():
            found = [p.parent for p in sorted(folder.rglob('config.json'))
                     if p.parent != folder and 'model_type' in json.loads(p.read_text())]
            if not found or _static_module_folder(folder) is None:
                raise FileNotFoundError(f'{name_or_path} has neither {WEIGHTS_FILE} nor a sentence-transformers '
                                        'SparseStaticEmbedding query module')
            doc_folder = found[0]
        tokenizer = AutoTokenizer.from_pretrained(str(doc_folder))
        model = SpladeModel.from_pretrained(str(doc_folder), special_token_ids=tokenizer.all_special_ids)
        query_side = StaticQueryEncoder.from_pretrained(str(folder))
        return cls(model, tokenizer, query_side, name=str(name_or_path), **kwargs)


def load_model(name_or_path: str, **kwargs) -> Splade:
    """:class:`InferenceFreeSplade` for a doc-only folder (``idf.json`` or a static query module), a
    :class:`~pyterrier_lsr.SaeSplade` for an SAE-SPLADE folder, else :class:`Splade`."""
    path = Path(name_or_path)
    if is_sae_splade_folder(path):
        return SaeSplade.from_pretrained(name_or_path, **kwargs)
    if path.is_dir() and ((path / WEIGHTS_FILE).exists() or _static_module_folder(path) is not None):
        return InferenceFreeSplade.from_pretrained(name_or_path, **kwargs)
    return Splade.from_pretrained(name_or_path, **kwargs)


def train_inference_free(splade: Splade, examples, output_dir, config=None, query_weights=None,
                         learn_query_weights: bool = True, **train_kwargs) -> InferenceFreeSplade:
    """Doc-only training with the bundled loop: documents through ``splade``'s model, queries through a static table.

    ``query_weights`` (a :class:`~pyterrier_lsr.StaticQueryWeights`) defaults to ones; pass one initialised from idf
    for the usual IDF query side. With ``learn_query_weights=False`` it stays fixed. FLOPS applies to documents only
    (``lambda_q`` is forced to 0). Returns the trained model with its query side, ready to save.
    """
    from dataclasses import replace

    from .query import StaticQueryWeights
    from .train.loop import TrainConfig, train
    config = replace(config or TrainConfig(), lambda_q=0.)
    query_weights = query_weights or StaticQueryWeights(splade.tokenizer)
    query_weights.weight.requires_grad_(learn_query_weights)
    train(splade.model, splade.tokenizer, examples, output_dir, config, query_encoder=query_weights,
          extra_parameters=[query_weights.weight] if learn_query_weights else [], **train_kwargs)
    return InferenceFreeSplade(splade.model, splade.tokenizer, query_weights.to_encoder(max_length=splade.max_length),
                               device=splade.device, max_length=splade.max_length, batch_size=splade.batch_size,
                               precision=splade.precision)
