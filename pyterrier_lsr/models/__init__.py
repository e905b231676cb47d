from .pooling import log_saturation, max_pooled_logits
from .splade import SpladeModel
