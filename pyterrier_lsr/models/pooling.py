"""Poolings that turn per-token logits over a vocabulary into one sparse vector per text."""

import torch

# Upper bound on the number of logits materialised at once.  On CPU the vocabulary projection is
# computed in cache-sized tiles (1M logits = 4 MB in fp32): writing, re-reading and max-reducing a
# tile that stays in cache is ~3x faster than streaming a large logits tensor through memory.
# Accelerators prefer fewer, larger kernels.
CPU_CHUNK_ELEMENTS = 1 << 20
ACCELERATOR_CHUNK_ELEMENTS = 1 << 26
# Narrower vocabulary slices make the matrix products inefficient; texts are tiled instead.
MIN_VOCAB_STEP = 512


def _compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


def max_pooled_logits(hidden: torch.Tensor, attention_mask: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None, chunk_elements: int | None = None) -> torch.Tensor:
    """``max_i (hidden_i · weight^T + bias)`` over the non-padding positions ``i`` of each text.

    The logits are computed in tiles of at most ``chunk_elements`` (a group of texts x a slice of the
    vocabulary; default: cache-sized on CPU), so the full batch×length×vocab tensor never exists;
    only batch×vocab maxima are kept.  Padding positions are given the hidden state of a real position
    of the same text, which leaves the maximum unchanged without masking any logits.  The bias is
    constant over positions, so it is added after the max.  Under autocast the products run in the
    autocast dtype, as ``F.linear`` would.  Texts with no unmasked position get ``-inf``.
    """
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _differentiable_max_pooled_logits(hidden, attention_mask, weight, bias)
    if chunk_elements is None:
        chunk_elements = CPU_CHUNK_ELEMENTS if hidden.device.type == 'cpu' else ACCELERATOR_CHUNK_ELEMENTS
    batch, length, dim = hidden.shape
    vocab = weight.shape[0]
    dtype = _compute_dtype(hidden)
    hidden, weight = hidden.to(dtype), weight.to(dtype)

    valid = attention_mask.bool()
    if not valid.all():
        first_valid = valid.int().argmax(dim=1)
        stand_in = hidden[torch.arange(batch, device=hidden.device), first_valid]
        hidden = torch.where(valid[..., None], hidden, stand_in[:, None])

    # fp32: vocabulary rows times positions, not positions times vocabulary columns: the same products, and MKL's
    # fp32 GEMM took 0.6-0.8x the time in this layout (AMD EPYC, 2026-12-02, benchmarks/encode.py); the maximum
    # then runs over contiguous positions. bf16 on CPU: positions times vocabulary columns, the maximum taken across
    # rows: ATen's bf16 maximum over a contiguous run of a short text's positions is slow, and this layout was 2.9x
    # faster per tile with 48-token texts on an AMX CPU, where the bf16 products are 8x fp32's
    # (2026-12-02, benchmarks/int8.py --precisions fp32 int8 bf16: docs/results.md, int8).
    rows_first = dtype == torch.bfloat16 and hidden.device.type == 'cpu'
    texts_per_tile = max(1, chunk_elements // (length * MIN_VOCAB_STEP))
    pooled = torch.empty(batch, vocab, dtype=dtype, device=hidden.device)
    for t0 in range(0, batch, texts_per_tile):
        tile = hidden[t0:t0 + texts_per_tile]
        # A contiguous copy: MKL's sums over a transposed view changed in the last bits with the tensors' memory (a
        # reloaded model encoded differently).
        positions = tile.reshape(-1, dim).contiguous() if rows_first else tile.reshape(-1, dim).t().contiguous()
        step = max(MIN_VOCAB_STEP, chunk_elements // (tile.shape[0] * length))
        for v0 in range(0, vocab, step):
            if rows_first:
                logits = torch.mm(positions, weight[v0:v0 + step].t()).view(tile.shape[0], length, -1).amax(dim=1)
            else:
                logits = torch.mm(weight[v0:v0 + step], positions).view(-1, tile.shape[0], length).amax(dim=2).t()
            pooled[t0:t0 + texts_per_tile, v0:v0 + step] = logits

    if bias is not None:
        pooled += bias.to(dtype)
    pooled[~valid.any(dim=1)] = float('-inf')
    return pooled


class _SparseBackwardMaxPool(torch.autograd.Function):
    """Max-pooled logits whose backward pass only touches the (text, term) pairs with a non-zero gradient.

    Forward: the projection in vocabulary tiles, keeping each maximum and the position it came from. Backward: a
    SPLADE loss has zero gradient wherever ``relu`` is inactive, i.e. for all but the few hundred active terms of a
    text, so instead of two dense batch x length x vocab products (and a saved logits tensor of that size) the
    gradients are gathered and scattered at the arg-max positions of the non-zero pairs only.
    """

    @staticmethod
    def forward(ctx, hidden, attention_mask, weight, chunk_elements):
        batch, length, dim = hidden.shape
        dtype = _compute_dtype(hidden)
        h, w = hidden.to(dtype), weight.to(dtype)
        flat = h.reshape(-1, dim)
        pad = ~attention_mask.bool()[..., None]
        step = max(MIN_VOCAB_STEP, chunk_elements // max(1, flat.shape[0]))
        pooled = torch.empty(batch, weight.shape[0], dtype=dtype, device=hidden.device)
        argmax = torch.empty(batch, weight.shape[0], dtype=torch.long, device=hidden.device)
        for v0 in range(0, weight.shape[0], step):
            logits = torch.mm(flat, w[v0:v0 + step].t()).view(batch, length, -1).masked_fill_(pad, float('-inf'))
            torch.max(logits, dim=1, out=(pooled[:, v0:v0 + step], argmax[:, v0:v0 + step]))
        ctx.save_for_backward(h, w, argmax)
        ctx.dtypes = hidden.dtype, weight.dtype
        return pooled

    @staticmethod
    def backward(ctx, grad):
        h, w, argmax = ctx.saved_tensors
        rows, cols = grad.nonzero(as_tuple=True)
        g = grad[rows, cols].to(w.dtype)[:, None]
        positions = argmax[rows, cols]
        # index_add_ rather than index_put_(accumulate=True), which is not deterministic on CPU: resumed training
        # must reproduce an uninterrupted run exactly.
        grad_hidden = torch.zeros(h.shape, dtype=ctx.dtypes[0], device=h.device)
        grad_hidden.view(-1, h.shape[-1]).index_add_(0, rows * h.shape[1] + positions, (g * w[cols]).to(ctx.dtypes[0]))
        grad_weight = torch.zeros(w.shape, dtype=ctx.dtypes[1], device=w.device)
        grad_weight.index_add_(0, cols, (g * h[rows, positions]).to(ctx.dtypes[1]))
        return grad_hidden, None, grad_weight, None


def _differentiable_max_pooled_logits(hidden, attention_mask, weight, bias):
    pooled = _SparseBackwardMaxPool.apply(hidden, attention_mask, weight, 1 << 22)
    return pooled if bias is None else pooled + bias.to(pooled.dtype)


def log_saturation(x: torch.Tensor) -> torch.Tensor:
    """SPLADE's activation ``log(1 + relu(x))``; monotone, so it commutes with the max pooling."""
    return torch.log1p(torch.relu(x))
