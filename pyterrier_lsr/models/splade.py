"""SPLADE model: any HF masked LM whose MLM logits are max-pooled into one weight per vocabulary term."""
import contextlib
from typing import Iterable

import torch
from torch import nn

from .pooling import log_saturation, max_pooled_logits

# Our settings travel inside the HF config.json under this key, so a saved folder reloads exactly.
CONFIG_KEY = 'lsr'
DEFAULT_SETTINGS = {'kind': 'splade', 'pooling': 'max', 'head_scale': 1.0}


@contextlib.contextmanager
def _decoder_bypassed(decoder: nn.Module):
    # The MLM head runs up to its last projection; the projection itself is applied chunk-wise
    # by the pooling, which is where the memory of a full batch x length x vocab tensor is saved.
    decoder.forward = lambda x: x
    try:
        yield
    finally:
        del decoder.forward


class SpladeModel(nn.Module):
    """Wraps an ``AutoModelForMaskedLM``: ``forward`` returns ``log(1 + relu(max_i logits_i / head_scale))``.

    ``head_scale`` is the MLM-head rescaling factor k (logits are divided by k); special tokens
    are zeroed in the output so they never become terms.
    """

    def __init__(self, mlm: nn.Module, special_token_ids: Iterable[int] = ()):
        super().__init__()
        self.mlm = mlm
        settings = dict(DEFAULT_SETTINGS, **(getattr(mlm.config, CONFIG_KEY, None) or {}))
        setattr(mlm.config, CONFIG_KEY, settings)
        self.register_buffer('special_token_ids', torch.tensor(sorted(set(special_token_ids)), dtype=torch.long),
                             persistent=False)

    @property
    def settings(self) -> dict:
        return getattr(self.mlm.config, CONFIG_KEY)

    @property
    def vocab_size(self) -> int:
        return self.mlm.get_output_embeddings().weight.shape[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder = self.mlm.get_output_embeddings()
        with _decoder_bypassed(decoder):
            hidden = self.mlm(input_ids=input_ids, attention_mask=attention_mask).logits
        pooled = max_pooled_logits(hidden, attention_mask, decoder.weight, decoder.bias)
        pooled = log_saturation(pooled.float() / float(self.settings['head_scale']))
        if len(self.special_token_ids):
            pooled = pooled.index_fill(1, self.special_token_ids, 0.)
        return pooled

    @classmethod
    def from_pretrained(cls, name_or_path: str, special_token_ids: Iterable[int] = (), **kwargs) -> 'SpladeModel':
        from transformers import AutoModelForMaskedLM
        return cls(AutoModelForMaskedLM.from_pretrained(name_or_path, **kwargs), special_token_ids)

    def save_pretrained(self, path: str, **kwargs):
        self.mlm.save_pretrained(path, **kwargs)
