"""Ranking losses and the FLOPS regularizer, on plain tensors.

Shapes: ``queries`` (B, V), ``docs`` (B, 1 + n, V) with the positive first; ``scores`` (B, 1 + n) student scores;
``teacher`` (B, 1 + n) teacher scores for the same candidates.
"""
import torch
import torch.nn.functional as F


def candidate_scores(queries: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """Dot product of each query with its own candidates: (B, 1 + n)."""
    return torch.einsum('bv,bnv->bn', queries, docs)


def infonce(queries: torch.Tensor, docs: torch.Tensor, in_batch: bool = True, temperature: float = 1.) -> torch.Tensor:
    """Cross-entropy of the positive against the query's hard negatives and, with ``in_batch``, every other
    query's candidates."""
    if in_batch:
        flat = docs.reshape(-1, docs.shape[-1])
        scores = queries @ flat.T
        target = torch.arange(len(queries), device=queries.device) * docs.shape[1]
    else:
        scores = candidate_scores(queries, docs)
        target = torch.zeros(len(queries), dtype=torch.long, device=queries.device)
    return F.cross_entropy(scores / temperature, target)


def margin_mse(scores: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """MSE between student and teacher margins ``s(q, d+) - s(q, d-)``, averaged over negatives."""
    return F.mse_loss(scores[:, :1] - scores[:, 1:], teacher[:, :1] - teacher[:, 1:])


def kl_distillation(scores: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.) -> torch.Tensor:
    """KL(teacher || student) over each query's candidate list."""
    return F.kl_div(F.log_softmax(scores / temperature, dim=1), F.log_softmax(teacher / temperature, dim=1),
                    log_target=True, reduction='batchmean')


def flops(reps: torch.Tensor, min_nnz: int = 0) -> torch.Tensor:
    """FLOPS regularizer ``sum_j (mean_i |v_ij|)^2`` (Paria et al.).

    With ``min_nnz > 0`` only rows with more than ``min_nnz`` non-zero terms are regularized (mean over all rows),
    so short vectors are left alone.
    """
    if min_nnz > 0:
        reps = reps * ((reps != 0).sum(dim=1, keepdim=True) > min_nnz)
    return (reps.abs().mean(dim=0) ** 2).sum()


def flops_weight(step: int, lam: float, warmup_steps: int) -> float:
    """``lam`` ramped up quadratically from 0 over ``warmup_steps`` (then constant)."""
    if warmup_steps <= 0:
        return lam
    return lam * min(1., step / warmup_steps) ** 2


def l2_drift(params: dict, initial: dict) -> torch.Tensor:
    """``sum ||w - w0||^2`` over named parameters and their starting values (L2-SP: a pull toward the pre-trained
    weights, so that fine-tuning on noisy self-supervised signal cannot wander far from the starting model)."""
    return sum(((p - initial[name].to(p.dtype)) ** 2).sum() for name, p in params.items())


LOSSES = {'infonce', 'margin_mse', 'kl'}
