"""Token-state extraction shared by Latent Terms, SAE-SPLADE and the multi-vector models (pure torch).

:class:`DenseFeatures` turns an HF encoder's hidden states into the L2-normalised vectors an SAE reads: one
mean-pooled vector per text (``single``) or one per token (``multi``); :class:`LatentTermsModel` pools a TopK SAE's
activations of those vectors into per-text term frequencies.
"""
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..core import storage
from ..core.checks import check_int
from ..core.model_files import load_hf_model, load_tokenizer
from .sae import SparseAutoencoder

MODES = ('single', 'multi')
POOLINGS = ('mean', 'cls')


class DenseFeatures(nn.Module):
    """The SAE's inputs from an HF encoder: one mean-pooled vector per text (``single``) or one per token
    (``multi``), L2-normalised so the SAE sees directions, not norms.

    Positions holding ``skip_ids`` (e.g. ``[CLS]``/``[SEP]``) give no vector and take no part in the mean.
    ``pooling``: how ``single`` pools, ``'mean'`` or ``'cls'`` (the first position's vector; the model declares
    which in a sentence-transformers folder, see :func:`load_dense`).
    ``frozen=False`` keeps the encoder trainable (SAE-SPLADE fine-tunes it; Latent Terms never does).
    Returns ``(vectors, owner)``: ``n x dim`` vectors, grouped by text in batch order, and each one's text index.
    """

    def __init__(self, dense: nn.Module, mode: str = 'single', skip_ids: Sequence[int] = (), frozen: bool = True,
                 pooling: str = 'mean'):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
        if pooling not in POOLINGS:
            raise ValueError(f'pooling must be one of {POOLINGS}, got {pooling!r}')
        self.pooling = pooling
        self.dense = dense.requires_grad_(False) if frozen else dense
        self.mode = mode
        self.register_buffer('skip_ids', torch.tensor(sorted(set(skip_ids)), dtype=torch.long), persistent=False)

    @property
    def dim(self) -> int:
        return self.dense.config.hidden_size

    def token_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The positions that give vectors: non-padding, not in ``skip_ids``."""
        mask = attention_mask.bool()
        return mask & ~torch.isin(input_ids, self.skip_ids) if len(self.skip_ids) else mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pooled: bool = False):
        """``(vectors, owner)``; with ``pooled`` also the texts' ``single``-mode vectors from the same pass (what a
        ``single``-mode sibling computes), as ``(vectors, owner, pooled)``."""
        hidden = self.dense(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
        mask = self.token_mask(input_ids, attention_mask)
        if self.mode == 'multi':
            owner = torch.arange(len(mask), device=mask.device)[:, None].expand_as(mask)[mask]
            vectors = nn.functional.normalize(hidden[mask], dim=-1)
        else:
            vectors, owner = self._pool(hidden, mask), torch.arange(len(mask), device=mask.device)
        if not pooled:
            return vectors, owner
        return vectors, owner, vectors if self.mode == 'single' else self._pool(hidden, mask)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == 'cls':
            return nn.functional.normalize(hidden[:, 0], dim=-1)
        weights = mask[..., None].float()
        return nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1).clamp(min=1), dim=-1)


class LatentTermsModel(nn.Module):
    """``(input_ids, attention_mask)`` -> ``batch x n_latents`` term frequencies, for :func:`encode_texts`."""

    def __init__(self, features: DenseFeatures, sae: SparseAutoencoder, sqrt_tf: bool = False):
        super().__init__()
        self.features = features
        self.sae = sae
        self.sqrt_tf = sqrt_tf

    def pool(self, vectors: torch.Tensor, owner: torch.Tensor, n_texts: int) -> torch.Tensor:
        """Sums each text's latent activations (its term frequencies)."""
        vectors, n_latents = vectors.float(), self.sae.n_latents
        if self.sae.config.batch_topk:  # a threshold at inference: any number of latents per vector
            tf = vectors.new_zeros(n_texts, n_latents).index_add_(0, owner, self.sae.encode(vectors))
        else:  # the k activations per vector added as such: no dense vectors x latents copy
            indices, values = self.sae.encode_topk(vectors)
            tf = vectors.new_zeros(n_texts * n_latents).index_add_(
                0, (owner[:, None] * n_latents + indices).flatten(), values.flatten()).view(n_texts, n_latents)
        return tf.sqrt() if self.sqrt_tf else tf

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        vectors, owner = self.features(input_ids, attention_mask)
        return self.pool(vectors, owner, len(input_ids))


def st_pooling(folder) -> str:
    """The pooling a sentence-transformers folder declares (its ``Pooling`` module's config): ``'mean'`` or
    ``'cls'``; ``'mean'`` for a plain HF folder.  Other poolings (max, last token...) are refused, naming the file."""
    folder = Path(folder)
    modules = folder / 'modules.json'
    if not modules.is_file():
        return 'mean'
    pooling = [m for m in json.loads(modules.read_text()) if str(m.get('type', '')).endswith('.Pooling')]
    config = folder / pooling[0].get('path', '') / 'config.json' if pooling else None
    if config is None or not config.is_file():
        return 'mean'
    settings = json.loads(config.read_text())
    modes = [k[len('pooling_mode_'):] for k, v in settings.items() if k.startswith('pooling_mode_') and v is True]
    known = {'mean_tokens': 'mean', 'cls_token': 'cls'}
    if len(modes) != 1 or modes[0] not in known:
        raise ValueError(f'{config}: pooling {modes} is not supported; supported: one of {sorted(known)}')
    return known[modes[0]]


def st_max_length(folder) -> int | None:
    """The truncation length a sentence-transformers folder declares (``max_seq_length`` in
    ``sentence_bert_config.json``: 256 for all-MiniLM-L6-v2, 384 for all-mpnet-base-v2), ``None`` where it declares
    none (a plain HF folder)."""
    config = Path(folder) / 'sentence_bert_config.json'
    if not config.is_file():
        return None
    value = storage.read_json(config, 'the sentence-transformers settings').get('max_seq_length')
    return None if value is None else check_int(f'max_seq_length in {config}', value, 3)


def load_dense(folder):
    """The HF encoder in a local ``folder`` and its tokenizer (names are resolved to folders by the caller, see
    :mod:`pyterrier_lsr.core.names`).  A sentence-transformers folder's pooling: :func:`st_pooling`."""
    from transformers import AutoModel
    return load_hf_model(AutoModel, folder, 'the dense model')[0], load_tokenizer(folder)
