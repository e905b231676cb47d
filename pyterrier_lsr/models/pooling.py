"""Poolings that turn per-token logits over a vocabulary into one sparse vector per text."""
import torch
import torch.nn.functional as F

# Upper bound on the number of logits materialised at once (64M floats = 256 MB in fp32).
CHUNK_ELEMENTS = 1 << 26


def max_pooled_logits(hidden: torch.Tensor, attention_mask: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor = None, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """``max_i (hidden_i · weight^T + bias)`` over the non-padding positions ``i`` of each text.

    The logits are computed a slice of positions at a time, so the full batch×length×vocab tensor
    never exists; only batch×vocab maxima are kept.  Texts with no unmasked position get ``-inf``.
    """
    batch, length, _ = hidden.shape
    step = max(1, chunk_elements // max(1, batch * weight.shape[0]))
    pad = ~attention_mask.bool()
    pooled = None
    for start in range(0, length, step):
        logits = F.linear(hidden[:, start:start + step], weight, bias)
        logits = logits.masked_fill_(pad[:, start:start + step, None], float('-inf')).amax(dim=1)
        pooled = logits if pooled is None else torch.maximum(pooled, logits)
    return pooled


def log_saturation(x: torch.Tensor) -> torch.Tensor:
    """SPLADE's activation ``log(1 + relu(x))``; monotone, so it commutes with the max pooling."""
    return torch.log1p(torch.relu(x))
