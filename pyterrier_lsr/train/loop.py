"""The bundled training loop: plain torch, one readable function, used by every trained method.

``train(model, tokenizer, examples, output_dir, TrainConfig(...))`` optimizes a :class:`~pyterrier_lsr.SpladeModel`
(or any module mapping ``(input_ids, attention_mask)`` to batch x vocabulary weights) with InfoNCE and/or
distillation losses plus FLOPS regularization; logs metrics to ``metrics.csv``/``metrics.json``; saves
``checkpoint-<step>`` folders (an HF model folder plus ``trainer_state.pt``) from which ``resume=True`` continues
exactly as an uninterrupted run would (same seed => same weights). The optimization machinery itself,
:func:`run_loop`, runs any ``loss_fn(batch, step)`` (the MLM adaptation of :mod:`.mlm` reuses it).

Checkpoints are built beside their final name and swapped into place when complete
(:func:`pyterrier_lsr.core.storage.build_folder`, marked ``checkpoint``), so a ``checkpoint-<step>`` folder is always
whole and saving a step again replaces only our own checkpoint. ``trainer_state.pt`` holds tensors, numbers, strings,
lists and dicts only (torch's RNG state is a tensor) and is read with ``torch.load(weights_only=True)``: a checkpoint
cannot run code. Resume takes the newest checkpoint that loads, warning about newer ones that do not, and refuses a
``TrainConfig`` that differs from the saved one unless ``resume='force'``.

Checkpoints and resumption are in :mod:`.checkpoints`.
"""

import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import losses as L
from . import torchrun as dist
from .checkpoints import check_same_model, checkpoints, claim_output, resume_state, save_checkpoint, write_log
from .config import TrainConfig
from .data import Example


def micro_batches(examples, batch_size: int, seed: int) -> Iterator[list[Example]]:
    """Micro-batches: reshuffled epochs (seeded) for a sequence, one pass in order for a stream."""
    if isinstance(examples, Sequence):
        if len(examples) < batch_size:  # no whole batch: the epochs below would yield nothing, forever
            raise ValueError(f'need at least batch_size={batch_size} examples, got {len(examples)}')
        epoch = 0
        while True:
            order = list(range(len(examples)))
            random.Random(seed + epoch).shuffle(order)
            for start in range(0, len(order) - batch_size + 1, batch_size):
                yield [examples[i] for i in order[start : start + batch_size]]
            epoch += 1
    else:
        batch = []
        for example in examples:
            batch.append(example)
            if len(batch) == batch_size:
                yield batch
                batch = []


def _lr_lambda(config: TrainConfig):
    def factor(step):
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        return max(0.0, (config.steps - step) / max(1, config.steps - config.warmup_steps))

    return factor


def param_groups(
    model: torch.nn.Module, extra_parameters: Sequence[torch.nn.Parameter], config: TrainConfig
) -> list[dict]:
    """AdamW parameter groups: the trainable parameters of ``model`` whose name (as in ``named_parameters()``)
    starts with a prefix of ``config.lr_multipliers`` get ``lr`` times its factor (the longest matching prefix wins),
    all others and ``extra_parameters`` get ``lr``. Parts of a model can need larger steps than the rest, e.g. the
    freshly initialised SAE encoder and scale of SAE-SPLADE next to a pre-trained backbone. The default group comes
    first (its lr is the one logged), and the groups depend only on the model and config, so resume rebuilds them
    identically."""
    groups = {prefix: [] for prefix in config.lr_multipliers}
    default = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            prefix = max((p for p in groups if name.startswith(p)), key=len, default=None)
            (default if prefix is None else groups[prefix]).append(param)
    unused = [prefix for prefix, params in groups.items() if not params]
    if unused:
        raise ValueError(f'lr_multipliers prefixes {unused} match no trainable parameter of the model')
    return [{'params': default + list(extra_parameters), 'lr': config.lr}] + [
        {'params': params, 'lr': config.lr * config.lr_multipliers[prefix]} for prefix, params in groups.items()
    ]


def train_autocast(device: torch.device, precision: str):
    """bf16 autocast around forward passes for ``precision='bf16'`` (and explicitly off otherwise)."""
    enabled = precision == 'bf16'
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else torch.autocast(device.type, enabled=False)


def _encode(model, tokenizer, texts: list[str], max_length: int, device) -> torch.Tensor:
    inputs = tokenizer(texts, truncation=True, max_length=max_length, padding=True, return_tensors='pt')
    return model(inputs['input_ids'].to(device), inputs['attention_mask'].to(device))


def batch_loss(model, tokenizer, batch: list[Example], config: TrainConfig, step: int, query_encoder=None,
               doc_encoder=None):
    """Loss of one micro-batch and its parts (floats) for logging.

    Under torchrun each process encodes its share of ``batch`` and the loss is computed over the gathered global batch
    (:mod:`.distributed`): the same loss and logs on every process, and as on one process.
    ``query_encoder`` and ``doc_encoder`` (optional) map ``(texts, tokenizer, max_length)`` to query / document
    vectors; by default both go through ``model``.
    """
    device = next(model.parameters()).device
    n = len(batch[0].negatives)
    if any(len(ex.negatives) != n for ex in batch):
        raise ValueError('all examples of a batch must have the same number of negatives')
    if {'margin_mse', 'kl'} & set(config.losses) and any(ex.teacher is None for ex in batch):
        raise ValueError(f'losses {sorted(config.losses)} need teacher scores (see add_teacher_scores)')
    local = dist.local_slice(batch)
    with train_autocast(device, config.precision):
        queries = [ex.query for ex in local]
        q = (
            query_encoder(queries, tokenizer, config.query_max_length)
            if query_encoder is not None
            else _encode(model, tokenizer, queries, config.query_max_length, device)
        ).float()
        texts = [t for ex in local for t in [ex.positive] + ex.negatives]
        d = (
            doc_encoder(texts, tokenizer, config.max_length)
            if doc_encoder is not None
            else _encode(model, tokenizer, texts, config.max_length, device)
        ).float()
    q, d = dist.gather(q), dist.gather(d)
    docs = d.view(len(batch), 1 + n, -1)
    scores = L.candidate_scores(q, docs)
    parts = {}
    if 'infonce' in config.losses:
        parts['infonce'] = L.infonce(q, docs, config.in_batch_negatives, config.temperature)
    if 'margin_mse' in config.losses or 'kl' in config.losses:
        teacher = torch.tensor([ex.teacher for ex in batch], dtype=torch.float, device=device)
        if 'margin_mse' in config.losses:
            parts['margin_mse'] = L.margin_mse(scores, teacher)
        if 'kl' in config.losses:
            parts['kl'] = L.kl_distillation(scores, teacher, config.temperature)
    lam_q = L.flops_weight(step, config.lambda_q, config.flops_warmup_steps)
    lam_d = L.flops_weight(step, config.lambda_d, config.flops_warmup_steps)
    flops_q, flops_d = L.flops(q), L.flops(d, config.flops_doc_threshold)
    loss = sum(config.losses[k] * v for k, v in parts.items()) + lam_q * flops_q + lam_d * flops_d
    logs = {k: v.item() for k, v in parts.items()}
    logs.update(
        loss=loss.item(),
        flops_q=flops_q.item(),
        flops_d=flops_d.item(),
        lambda_q=lam_q,
        lambda_d=lam_d,
        q_nnz=(q > 0).sum(1).float().mean().item(),
        d_nnz=(d > 0).sum(1).float().mean().item(),
    )
    return loss, logs


def train(
    model: torch.nn.Module,
    tokenizer,
    examples: Iterable[Example],
    output_dir,
    config: TrainConfig = None,
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    resume: bool | str = False,
    extra_parameters: Sequence[torch.nn.Parameter] = (),
    query_encoder=None,
    verbose: bool = True,
    resumed: tuple[Path | None, dict | None] | None = None,
) -> list[dict]:
    """Trains ``model`` in place and returns the metrics log (one row per ``log_every`` steps and per evaluation).

    Args:
        examples: a list (shuffled each epoch) or a stream (one pass) of :class:`Example`.
        evaluate: called with the model every ``eval_every`` steps and at the end; returns metrics to log.
        resume: ``True``: continue from the newest intact ``checkpoint-*`` in ``output_dir`` (from scratch if there is
            none), refusing a config that differs from the saved one in anything but ``log_every``/``save_every``/
            ``eval_every``; ``'force'``: continue with the new config anyway (from the checkpoint's step on; the
            optimizer's moments are kept, its learning rates, schedule and weight decay are the new config's).
        extra_parameters, query_encoder: trainable parameters and query side outside ``model`` (inference-free
            training); see :func:`batch_loss`.
        resumed: what :func:`resume_state` returned for these ``output_dir``, ``config`` and ``resume``, when the
            caller checked it already (the command line, before loading the model): the checkpoint is read once.
    """
    config = config or TrainConfig()
    config.check_lengths(tokenizer)
    if isinstance(examples, Sequence) and len(examples) < config.batch_size:
        raise ValueError(f'need at least batch_size={config.batch_size} examples, got {len(examples)}')
    return run_loop(
        model,
        lambda batch, step: batch_loss(model, tokenizer, batch, config, step, query_encoder),
        micro_batches(examples, config.batch_size, config.seed),
        output_dir,
        config,
        tokenizer=tokenizer,
        evaluate=evaluate,
        resume=resume,
        extra_parameters=extra_parameters,
        verbose=verbose,
        resumed=resumed,
    )


class TrainingDiverged(FloatingPointError):
    """The loss, the gradients or the weights became infinite or NaN: the run stops at that step and saves nothing
    from it (earlier checkpoints stay as they were)."""


def _diverged(step: int, what: str, config: TrainConfig, output_dir: Path) -> TrainingDiverged:
    kept = checkpoints(output_dir)
    last = f'the last good checkpoint, {kept[0].name}, is kept' if kept else 'there is no earlier checkpoint'
    return TrainingDiverged(f'training diverged at step {step + 1}: {what}. Nothing from this step was saved ({last}); '
                            f'lower lr (now {config.lr:g}) or max_grad_norm (now {config.max_grad_norm:g}), or check '
                            'the data and teacher scores')


def _check_finite_weights(params: Sequence[torch.nn.Parameter], model: torch.nn.Module, step: int,
                          config: TrainConfig, output_dir: Path) -> None:
    """Before a save: a finite loss and gradient norm do not keep the weights finite (a huge lr's weight decay
    multiplies them by ``1 - lr * weight_decay`` each step), and a saved non-finite model fails only when it encodes."""
    with torch.no_grad():
        bad = [p for p in params if not torch.isfinite(p).all()]
    if bad:
        names = {id(p): name for name, p in model.named_parameters()}
        first = names.get(id(bad[0]), 'an extra parameter')
        raise _diverged(step - 1, f'{len(bad)} weight tensors hold infinite or NaN values (e.g. {first})', config,
                        output_dir)


@dataclass
class _Run:
    """One :func:`run_loop` call's state, and its parts: resuming, one optimizer step, saving a checkpoint."""

    model: torch.nn.Module
    loss_fn: Callable
    batches: Iterator
    output_dir: Path
    config: TrainConfig
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    params: list
    extra_parameters: list

    def restore(self, checkpoint: Path | None, state: dict | None, resume) -> tuple[int, list]:
        """Continues from ``checkpoint`` (if any): model, extra parameters, optimizer, schedule and torch's RNG as its
        ``state`` saved them, the batches replayed up to its step; returns that step and the log so far."""
        if checkpoint is None:
            return 0, []
        model, config, optimizer, scheduler = self.model, self.config, self.optimizer, self.scheduler
        check_same_model(model, state['model'], checkpoint)
        model.load_state_dict(state['model'])
        with torch.no_grad():
            for param, saved in zip(self.extra_parameters, state['extra']):
                param.copy_(saved)
        optimizer.load_state_dict(state['optimizer'])
        scheduler.load_state_dict(state['scheduler'])
        torch.set_rng_state(state['torch_rng'])
        if resume == 'force':  # the loaded optimizer and scheduler carry the saved rates: the new config's apply
            scheduler.base_lrs = [group['lr'] for group in param_groups(model, self.extra_parameters, config)]
            factor = _lr_lambda(config)(scheduler.last_epoch)
            for group, base_lr in zip(optimizer.param_groups, scheduler.base_lrs):
                group.update(initial_lr=base_lr, lr=base_lr * factor, weight_decay=config.weight_decay)
        for _ in range(state['step'] * config.grad_accum):  # replay the data order up to the checkpoint
            next(self.batches)
        return state['step'], state['log']

    def step(self, step: int) -> list[dict] | None:
        """Optimizer step ``step``: ``grad_accum`` micro-batches, gradient averaging and clipping; the micro-batches'
        logs, or None when a stream ran out.  A non-finite loss or gradient norm stops before the weights change."""
        config = self.config
        self.optimizer.zero_grad()
        torch.manual_seed(dist.step_seed(config.seed, step))
        parts = []
        for _ in range(config.grad_accum):
            batch = next(self.batches, None)
            if batch is None:
                break
            loss, logs = self.loss_fn(batch, step)
            if not torch.isfinite(loss):
                raise _diverged(step, f'the loss is {loss.item()}', config, self.output_dir)
            (loss / config.grad_accum).backward()
            parts.append(logs)
        if not parts:
            return None
        dist.average_gradients(self.params)
        norm = torch.nn.utils.clip_grad_norm_(self.params, config.max_grad_norm)
        if not torch.isfinite(norm):
            raise _diverged(step, f'the gradient norm is {norm.item()}', config, self.output_dir)
        self.optimizer.step()
        self.scheduler.step()
        return parts

    def save(self, step: int, tokenizer, log: list) -> None:
        _check_finite_weights(self.params, self.model, step, self.config, self.output_dir)
        if dist.is_main():
            save_checkpoint(self.model, tokenizer, self.optimizer, self.scheduler, step,
                            self.output_dir / f'checkpoint-{step}', self.config, log, self.extra_parameters)


def run_loop(
    model: torch.nn.Module,
    loss_fn: Callable[[object, int], tuple[torch.Tensor, dict[str, float]]],
    batches: Iterator,
    output_dir,
    config: TrainConfig,
    tokenizer=None,
    evaluate: Callable[[torch.nn.Module], dict[str, float]] | None = None,
    resume: bool | str = False,
    extra_parameters: Sequence[torch.nn.Parameter] = (),
    verbose: bool = True,
    desc: str = 'training',
    resumed: tuple[Path | None, dict | None] | None = None,
) -> list[dict]:
    """The optimization machinery shared by every objective: runs ``loss_fn(batch, step) -> (loss, logs)`` over
    ``batches`` for ``config.steps`` optimizer steps (only the optimization, logging and checkpoint fields of
    ``config`` are read).

    AdamW (per-prefix learning rates: :func:`param_groups`), linear warm-up/decay, ``grad_accum`` micro-batches per
    step, gradient clipping, ``metrics.csv/json``, ``checkpoint-<step>`` folders (``model.save_pretrained`` +
    ``tokenizer`` + ``trainer_state.pt``) and exact resume: the batch iterator is replayed up to the checkpoint and
    torch's RNG restored, so ``batches`` must be deterministic and any randomness in ``loss_fn`` must come from
    torch's global RNG (reseeded every step).
    ``resume``, ``resumed``: see :func:`train`. Data that run out end the run early: warned, its steps saved.

    A loss or gradient norm that is infinite or NaN, or weights that are when a checkpoint is due, raise
    :class:`TrainingDiverged` naming the step: a diverged model is never saved, and earlier checkpoints stay.

    Under ``torchrun`` (see :mod:`.distributed`) every process runs this same loop: parameters start from rank 0's,
    gradients are averaged over processes once per optimizer step, and only rank 0 evaluates and writes metrics and
    checkpoints (a shared ``output_dir`` for multi-node runs).
    """
    output_dir = Path(output_dir)
    checkpoint, state = resumed if resumed is not None else resume_state(output_dir, config, resume)
    dist.setup()
    if dist.is_main():  # rank 0 writes here; the others only read checkpoints
        claim_output(output_dir)
    torch.manual_seed(config.seed)
    extra_parameters = list(extra_parameters)
    groups = param_groups(model, extra_parameters, config)
    params = [p for group in groups for p in group['params']]
    dist.broadcast_parameters(params)
    optimizer = torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay)
    run = _Run(model, loss_fn, batches, output_dir, config, optimizer,
               torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config)), params, extra_parameters)
    step, log = run.restore(checkpoint, state, resume)
    model.train()
    try:  # left in eval mode however it ends: a model in training mode is not safe to share
        window, start_time = [], time.time()
        with tqdm(
            total=config.steps, initial=step, desc=desc, unit='step', disable=not verbose or not dist.is_main()
        ) as pbar:
            while step < config.steps:
                parts = run.step(step)
                if parts is None:  # a stream ran out: what was trained is saved, and said
                    warnings.warn(f'the training data ran out after {step} of {config.steps} steps', stacklevel=2)
                    if step and not _every(step, config.save_every):
                        run.save(step, tokenizer, log)
                    break
                step += 1
                window.extend(parts)
                pbar.update(1)
                if step % config.log_every == 0 or step == config.steps:
                    log.append(_mean_row(window, step, run.scheduler.get_last_lr()[0], time.time() - start_time))
                    window = []
                    pbar.set_postfix({k: f'{log[-1][k]:.3g}' for k in ('loss', 'd_nnz') if k in log[-1]})
                evaluating = _every(step, config.eval_every) or step == config.steps
                if evaluate is not None and dist.is_main() and evaluating:
                    model.eval()
                    log.append({'step': step, **evaluate(model)})
                    model.train()
                if _every(step, config.save_every) or step == config.steps:
                    run.save(step, tokenizer, log)
                if log and dist.is_main():
                    write_log(output_dir, log)
    finally:
        model.eval()
    dist.barrier()  # checkpoints are complete before any process returns (and, say, resumes or evaluates)
    return log


def _mean_row(window: list[dict], step: int, lr: float, seconds: float) -> dict:
    """One metrics row: the mean of each logged value over the micro-batches since the last row."""
    row = {k: sum(p[k] for p in window if k in p) / len(window) for k in window[0]}
    return dict(row, step=step, lr=lr, seconds=round(seconds, 1))


def _every(step: int, period: int) -> bool:
    """Whether ``step`` is a multiple of ``period`` (0: never)."""
    return bool(period) and step % period == 0
