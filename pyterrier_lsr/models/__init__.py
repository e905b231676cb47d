"""Pure-torch models: backbones, heads, pooling, SAEs, token-state extraction, vocabulary transfer."""
from .pooling import log_saturation, max_pooled_logits
from .splade import SpladeModel

__all__ = ['log_saturation', 'max_pooled_logits', 'SpladeModel']
