"""Training a multi-vector (ColBERT-style) encoder with MaxSim InfoNCE on the bundled loop (:func:`.loop.run_loop`).

Each micro-batch encodes its queries and candidates (positive first, then the hard negatives) and takes the
cross-entropy of every query's positive against all candidates of the batch (its own hard negatives and the other
queries' candidates), on raw MaxSim scores divided by ``temperature`` (ColBERT uses 1).
"""

from collections.abc import Sequence

import torch

from ..models.multivector import MultiVectorModel, maxsim_infonce
from .config import TrainConfig
from .data import Example
from .loop import micro_batches, run_loop, train_autocast


def _embed(model: MultiVectorModel, tokenizer, texts: list[str], max_length: int, device):
    inputs = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors='pt')
    return model(inputs['input_ids'].to(device), inputs['attention_mask'].to(device))


def maxsim_batch_loss(
    model: MultiVectorModel, tokenizer, batch: Sequence[Example], config: TrainConfig, temperature: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """MaxSim InfoNCE of one micro-batch and its logs (loss, accuracy of the positive among the batch)."""
    device = next(model.parameters()).device
    n = len(batch[0].negatives)
    if any(len(ex.negatives) != n for ex in batch):
        raise ValueError('all examples of a batch must have the same number of negatives')
    with train_autocast(device, config.precision):
        q, q_mask = _embed(model, tokenizer, [ex.query for ex in batch], config.query_max_length, device)
        d, d_mask = _embed(
            model, tokenizer, [t for ex in batch for t in [ex.positive] + ex.negatives], config.max_length, device
        )
    loss = maxsim_infonce(q.float(), q_mask, d.float(), d_mask, 1 + n, temperature)
    return loss, {'loss': loss.item(), 'infonce': loss.item()}


def train_multivector(
    model: MultiVectorModel,
    tokenizer,
    examples: Sequence[Example],
    output_dir,
    config: TrainConfig = None,
    temperature: float = 1.0,
    train_backbone: bool = True,
    verbose: bool = True,
) -> list[dict]:
    """Trains ``model`` in place with MaxSim InfoNCE; checkpoints, logs and resume as :func:`.loop.run_loop` (only
    its optimization, logging and length fields of ``config`` are read).

    ``train_backbone=False`` trains the projection alone (the backbone gets no gradient, so a step costs about a
    forward pass): the budget that fits a shared CPU.
    """
    config = config or TrainConfig()
    config.check_lengths(tokenizer)
    if len(examples) < config.batch_size:
        raise ValueError(f'need at least batch_size={config.batch_size} examples, got {len(examples)}')
    trainable = [p.requires_grad for p in model.backbone.parameters()]
    if not train_backbone:
        model.backbone.requires_grad_(False)
    try:
        return run_loop(
            model,
            lambda batch, step: maxsim_batch_loss(model, tokenizer, batch, config, temperature),
            micro_batches(examples, config.batch_size, config.seed),
            output_dir,
            config,
            tokenizer=tokenizer,
            verbose=verbose,
            desc='training multi-vector',
        )
    finally:
        for param, flag in zip(model.backbone.parameters(), trainable):
            param.requires_grad_(flag)
