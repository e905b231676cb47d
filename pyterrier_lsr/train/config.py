"""The settings of the bundled training loop (:class:`TrainConfig`), checked when made."""
from dataclasses import dataclass, field

from ..core.checks import check_bool, check_choice, check_float, check_int, check_max_length
from . import losses as L

__all__ = ['TrainConfig', 'TRAIN_PRECISIONS']

# TrainConfig's integer fields and their smallest values (a max_length below 3 leaves no room for a token)
INT_FIELDS = {'steps': 1, 'batch_size': 1, 'grad_accum': 1, 'warmup_steps': 0, 'flops_warmup_steps': 0,
              'flops_doc_threshold': 0, 'query_max_length': 3, 'max_length': 3, 'seed': 0, 'log_every': 1,
              'save_every': 0, 'eval_every': 0}
TRAIN_PRECISIONS = ('fp32', 'bf16')
# float fields: (name, minimum, whether the minimum itself is refused); a temperature of 0 divides by zero
FLOAT_FIELDS = (('lr', 0, True), ('weight_decay', 0, False), ('max_grad_norm', 0, True), ('temperature', 0, True),
                ('lambda_q', 0, False), ('lambda_d', 0, False))


@dataclass
class TrainConfig:
    """Settings of :func:`train`. Defaults suit small CPU runs (published GPU recipes use larger batches)."""

    steps: int = 1000
    batch_size: int = 16  # examples per micro-batch (global: split over torchrun processes)
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 5e-5
    lr_multipliers: dict[str, float] = field(default_factory=dict)  # parameter-name prefix -> factor of lr
    weight_decay: float = 0.01
    warmup_steps: int = 100  # linear warm-up, then linear decay to 0 at `steps`
    max_grad_norm: float = 1.0
    losses: dict[str, float] = field(default_factory=lambda: {'infonce': 1.0})  # infonce, margin_mse, kl
    in_batch_negatives: bool = True
    temperature: float = 1.0  # for infonce and kl
    lambda_q: float = 1e-2  # FLOPS weights, ramped up quadratically over flops_warmup_steps
    lambda_d: float = 8e-3
    flops_warmup_steps: int = 300
    flops_doc_threshold: int = 0  # > 0: FLOPS only on documents with more non-zero terms than this
    query_max_length: int = 32
    max_length: int = 256
    precision: str = 'fp32'  # 'bf16': bf16 autocast for forward passes (fast with AMX/avx512_bf16 or a GPU)
    seed: int = 42
    log_every: int = 10
    save_every: int = 0  # 0: only at the end
    eval_every: int = 0  # 0: never (evaluate= is then called at the end only)

    def __post_init__(self):
        if not isinstance(self.losses, dict) or not self.losses or set(self.losses) - L.LOSSES:
            raise ValueError(f'losses must be a non-empty dict over {sorted(L.LOSSES)}, got {self.losses!r}')
        for name, weight in self.losses.items():
            check_float(f'losses[{name!r}]', weight, 0)
        if not any(self.losses.values()):  # only the FLOPS regulariser would train: every vector goes to empty
            raise ValueError(f'losses must give at least one loss a weight > 0, got {self.losses!r}')
        if not isinstance(self.lr_multipliers, dict):
            raise TypeError(f'lr_multipliers must be a dict of prefix -> factor, got {self.lr_multipliers!r}')
        for prefix, factor in self.lr_multipliers.items():
            check_float(f'lr_multipliers[{prefix!r}]', factor, 0)
        for name, minimum in INT_FIELDS.items():
            check_int(name, getattr(self, name), minimum)
        for name, minimum, exclusive in FLOAT_FIELDS:
            check_float(name, getattr(self, name), minimum, exclusive_minimum=exclusive)
        check_bool('in_batch_negatives', self.in_batch_negatives)
        check_choice('precision', self.precision, TRAIN_PRECISIONS)

    def check_lengths(self, tokenizer) -> None:
        """Refuses a ``query_max_length``/``max_length`` above ``tokenizer``'s ``model_max_length`` (see
        :func:`~pyterrier_lsr.core.checks.check_max_length`): the model has no positions past it, so the first batch
        would crash inside the model.  Called where the tokenizer is known, before any step."""
        for name in ('query_max_length', 'max_length'):
            check_max_length(name, getattr(self, name), tokenizer, getattr(self, name))
