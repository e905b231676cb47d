"""Texts to a (texts x vocabulary) sparse tensor under a model, batched by the package's one batching engine
(:func:`~pyterrier_lsr.core.encoding.length_sorted_batches`): blank texts and texts of special tokens only are zero
rows,
as everywhere else in the package."""
from collections.abc import Sequence

import torch

from ...core.encoding import autocast, length_sorted_batches

BATCH_SIZE = 64


@torch.inference_mode()
def sparse_vectors(model, tokenizer, texts: Sequence[str], max_length: int, precision: str, size: int | None = None,
                   verbose: bool = False, desc: str = 'encoding') -> torch.Tensor:
    """``model``'s vectors of ``texts`` (in input order) as a sparse COO tensor of ``len(texts) x size`` (default: the
    model's output width)."""
    device = next(model.parameters()).device
    rows, cols, values, width = [], [], [], size
    with autocast(device, precision):
        for batch in length_sorted_batches(tokenizer, texts, BATCH_SIZE, max_length, device, verbose, desc):
            out = model(batch.input_ids, batch.attention_mask).float()
            width = out.shape[1] if width is None else width
            r, c = out.nonzero(as_tuple=True)
            rows.append(torch.tensor(batch.positions, device=out.device)[r].cpu())
            cols.append(c.cpu())
            values.append(out[r, c].cpu())
    if width is None:  # nothing to encode: the model's width from its configuration
        width = model.vocab_size
    if not rows:
        return torch.sparse_coo_tensor(torch.zeros((2, 0), dtype=torch.long), torch.zeros(0), (len(texts), width),
                                       check_invariants=False)
    indices = torch.stack([torch.cat(rows), torch.cat(cols)])  # in range by construction: no invariant check
    return torch.sparse_coo_tensor(indices, torch.cat(values), (len(texts), width), check_invariants=False).coalesce()
