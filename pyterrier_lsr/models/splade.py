"""SPLADE model: any HF masked LM whose MLM logits are max-pooled into one weight per vocabulary term."""
import math
from collections.abc import Iterable

import torch
from torch import nn

from ..core.model_files import ModelLoadError, load_hf_model
from .pooling import log_saturation, max_pooled_logits

# Our settings travel inside the HF config.json under this key, so a saved folder reloads exactly.
CONFIG_KEY = 'lsr'
DEFAULT_SETTINGS = {'kind': 'splade', 'pooling': 'max', 'head_scale': 1.0}
# Model kinds whose folder is an MLM checkpoint read by SpladeModel (other kinds have their own loaders).
# A doc-only model's document side is the same masked LM; its folder says 'inference-free' (see loading.py).
KINDS = ('splade', 'inference-free', 'asymmetric')
# sentence-transformers' SpladePooling options: max (SPLADE v2 and later) or sum (the first SPLADE) over the tokens;
# relu, or log1p_relu (a second log1p, OpenSearch's models) before it
POOLINGS = ('max', 'sum')
ACTIVATIONS = ('relu', 'log1p_relu')


def check_settings(settings: dict, where: str = 'config.json') -> dict:
    """Raises :class:`ModelLoadError` naming the key unless ``settings`` (our ``lsr`` block) are valid for SPLADE."""
    if settings.get('kind') not in KINDS:
        raise ModelLoadError(f'{where}: {CONFIG_KEY}.kind must be one of {list(KINDS)} for a SPLADE model, '
                             f'got {settings.get("kind")!r}')
    if settings.get('pooling') not in POOLINGS:
        raise ModelLoadError(f'{where}: {CONFIG_KEY}.pooling must be one of {list(POOLINGS)}, '
                             f'got {settings.get("pooling")!r}')
    if settings.get('activation', 'relu') not in ACTIVATIONS:
        raise ModelLoadError(f'{where}: {CONFIG_KEY}.activation must be one of {list(ACTIVATIONS)}, '
                             f'got {settings.get("activation")!r}')
    scale = settings.get('head_scale')
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ModelLoadError(f'{where}: {CONFIG_KEY}.head_scale must be a finite number > 0, got {scale!r}')
    return settings


def _head_layout(mlm: nn.Module) -> tuple[str, str] | None:
    """Which known MLM-head layout ``mlm`` has, and the name of the module holding its transform (the head up to,
    not including, its vocabulary projection): BERT, RoBERTa/XLM-R, DistilBERT or ModernBERT; None for others.
    A name, not a module reference, so that copies and state dicts of the model are unaffected."""
    decoder = mlm.get_output_embeddings()
    for name, module in mlm.named_modules():
        if getattr(module, 'decoder', None) is decoder and isinstance(getattr(module, 'transform', None), nn.Module):
            return 'bert', f'{name}.transform'  # BertLMPredictionHead
    lm_head = getattr(mlm, 'lm_head', None)
    if getattr(lm_head, 'decoder', None) is decoder and {'dense', 'layer_norm'} <= set(dict(lm_head.named_children())):
        return 'roberta', 'lm_head'
    if getattr(mlm, 'decoder', None) is decoder and isinstance(getattr(mlm, 'head', None), nn.Module):
        return 'modernbert', 'head'
    if getattr(mlm, 'vocab_projector', None) is decoder:
        return 'distilbert', ''
    return None


def _head_transform(mlm: nn.Module, layout: tuple[str, str], hidden: torch.Tensor) -> torch.Tensor:
    """The head transform of ``layout``, op for op as the library's own forward (bit-identical results)."""
    kind, name = layout
    module = mlm.get_submodule(name)
    if kind == 'roberta':
        from transformers.activations import gelu
        return module.layer_norm(gelu(module.dense(hidden)))
    if kind == 'distilbert':
        return module.vocab_layer_norm(module.activation(module.vocab_transform(hidden)))
    return module(hidden)


class SpladeModel(nn.Module):
    """Wraps an ``AutoModelForMaskedLM``: ``forward`` returns ``log(1 + relu(max_i logits_i / head_scale))``.

    ``head_scale`` is the MLM-head rescaling factor k (logits are divided by k); special tokens
    are zeroed in the output so they never become terms.  The settings ``pooling='sum'`` (sum over the tokens instead
    of the max) and ``activation='log1p_relu'`` (a second ``log1p``) read sentence-transformers' other SpladePooling
    options.

    The forward pass never modifies a module, so one model may encode from several threads at once. For the head
    layouts of :func:`_head_layout` the backbone and head transform run explicitly and the vocabulary projection
    is fused with the max pooling (no batch x length x vocabulary tensor); any other masked LM runs whole (same
    result, more memory).
    """

    def __init__(self, mlm: nn.Module, special_token_ids: Iterable[int] = ()):
        super().__init__()
        self.mlm = mlm
        settings = dict(DEFAULT_SETTINGS, **(getattr(mlm.config, CONFIG_KEY, None) or {}))
        setattr(mlm.config, CONFIG_KEY, check_settings(settings))
        self.register_buffer('special_token_ids', torch.tensor(sorted(set(special_token_ids)), dtype=torch.long),
                             persistent=False)
        self._head_layout = _head_layout(mlm)

    @property
    def settings(self) -> dict:
        return getattr(self.mlm.config, CONFIG_KEY)

    @property
    def vocab_size(self) -> int:
        return self.mlm.get_output_embeddings().weight.shape[0]

    @property
    def has_split_head(self) -> bool:
        """Whether the MLM head's layout is known, so that :meth:`decoder_inputs` can stop before its projection."""
        return self._head_layout is not None

    def decoder_inputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **inputs) -> torch.Tensor:
        """The MLM head's input to its vocabulary projection, batch x length x hidden; ``inputs``: more inputs of the
        backbone (``token_type_ids``)."""
        if self._head_layout is None:
            raise NotImplementedError(f'the MLM head layout of {type(self.mlm).__name__} is not one SpladeModel can '
                                      'split before its vocabulary projection (BERT, RoBERTa, DistilBERT, ModernBERT)')
        hidden = self.mlm.base_model(input_ids=input_ids, attention_mask=attention_mask, **inputs)[0]
        return _head_transform(self.mlm, self._head_layout, hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder = self.mlm.get_output_embeddings()
        if self.settings['pooling'] == 'sum':
            return self._summed(input_ids, attention_mask)
        if self._head_layout is None:
            logits = self.mlm(input_ids=input_ids, attention_mask=attention_mask).logits
            pooled = logits.masked_fill(~attention_mask.bool()[..., None], float('-inf')).amax(dim=1)
        else:
            pooled = max_pooled_logits(self.decoder_inputs(input_ids, attention_mask), attention_mask,
                                       decoder.weight, decoder.bias)
        return self.activate(pooled)

    def _activation(self, logits: torch.Tensor) -> torch.Tensor:
        weights = log_saturation(logits.float() / float(self.settings['head_scale']))
        return torch.log1p(weights) if self.settings.get('activation', 'relu') == 'log1p_relu' else weights

    def _summed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sum pooling: each token's activated logits, added over the text's tokens (a few texts at a time: the
        logits of a whole batch would be batch x length x vocabulary floats)."""
        step = max(1, (1 << 24) // max(1, input_ids.shape[1] * self.vocab_size))
        rows = []
        for i in range(0, len(input_ids), step):
            ids, mask = input_ids[i:i + step], attention_mask[i:i + step]
            logits = self.mlm(input_ids=ids, attention_mask=mask).logits
            rows.append((self._activation(logits) * mask[..., None].float()).sum(dim=1))
        return self._zero_special(torch.cat(rows))

    def activate(self, pooled: torch.Tensor) -> torch.Tensor:
        """SPLADE's activation of max-pooled logits (batch x vocabulary), special tokens set to 0."""
        return self._zero_special(self._activation(pooled))

    def _zero_special(self, pooled: torch.Tensor) -> torch.Tensor:
        if len(self.special_token_ids):
            pooled = pooled.index_fill(1, self.special_token_ids, 0.)
        return pooled

    @classmethod
    def from_pretrained(cls, name_or_path: str, special_token_ids: Iterable[int] = (), new_head: bool = False,
                        settings: dict | None = None, **kwargs) -> 'SpladeModel':
        """Loads a masked-LM checkpoint; raises :class:`ModelLoadError` when transformers would initialise part of
        the model randomly (e.g. a dense encoder folder without an MLM head) unless ``new_head=True`` asks for that
        (see :func:`pyterrier_lsr.models.heads.splade_from_encoder` for a deliberate initialisation), and when the
        ``lsr`` settings in ``config.json`` are invalid.  ``settings`` override those of ``config.json`` (a folder
        written by another library declares its pooling elsewhere)."""
        from transformers import AutoModelForMaskedLM
        mlm, info = load_hf_model(AutoModelForMaskedLM, name_or_path, 'the masked LM', **kwargs)
        bad = sorted(info.get('missing_keys', ()))
        if bad and not new_head:
            raise ModelLoadError(f'{name_or_path} lacks MLM-head weights that transformers would initialise randomly '
                                 f'({", ".join(bad[:4])}{", ..." if len(bad) > 4 else ""}): it is not a masked-LM '
                                 'checkpoint. Pass new_head=True to train a new head on purpose '
                                 '(or use models.heads.splade_from_encoder)')
        if settings:
            setattr(mlm.config, CONFIG_KEY, dict(getattr(mlm.config, CONFIG_KEY, None) or {}, **settings))
        return cls(mlm, special_token_ids)

    def save_pretrained(self, path: str, **kwargs):
        self.mlm.save_pretrained(path, **kwargs)
