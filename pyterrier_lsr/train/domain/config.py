"""The settings of a domain adaptation run (:class:`DomainConfig`), checked when made, and read from ``name=value``
strings (CLI and scripts)."""
from dataclasses import dataclass, field, fields, replace

from ...core.checks import check_choice, check_float, check_int, check_str
from ..config import TRAIN_PRECISIONS, TrainConfig

SIDES = ('both', 'query')
QUERY_KINDS = ('sentence', 'keywords', 'mixed')
CANDIDATES = ('bm25', 'teacher')
TEACHERS = ('bm25', 'dense', 'latent')
SELECT_ON = ('heldout_ndcg', 'heldout_mrr', 'heldout_first_ndcg', 'heldout_first_mrr')
# field -> smallest allowed value; every other numeric field is a finite float (see __post_init__)
MINIMUM = {'steps': 1, 'batch_size': 1, 'max_length': 3, 'per_doc': 1, 'negatives': 1, 'depth': 1, 'pool': 1,
           'heldout': 1, 'heldout_pool': 1, 'heldout_corpus': 1, 'eval_every': 0, 'seed': 0}


@dataclass
class DomainConfig:
    """Settings of :func:`~pyterrier_lsr.train.domain_adapt`. The defaults are the recipe measured in docs/results.md
    (Trained models): the query encoder alone adapts (documents frozen), by listwise distillation over the
    teacher's top 64 per pseudo-query. :meth:`two_sided` is the recipe for models whose documents must train too (a
    new vocabulary, head or latents). Every field is checked when the config is made (``ValueError``/``TypeError``
    naming the field)."""
    side: str = 'query'                # 'query': adapt the query encoder alone, documents frozen; 'both'
    steps: int = 360
    batch_size: int = 8
    lr: float = 1e-4
    lr_multipliers: dict[str, float] = field(default_factory=dict)  # parameter-name prefix -> factor of lr
    anchor: float = 0.0                # weight of the L2 pull to the starting weights (sum of squared drifts)
    losses: dict[str, float] = field(default_factory=lambda: {'infonce': 1.0, 'kl': 1.0})
    lambda_q: float = 1e-3
    lambda_d: float = 1e-3
    max_length: int = 96
    precision: str = 'fp32'            # 'bf16': autocast, faster with AMX/avx512_bf16, ~10x slower without
    queries: str = 'sentence'          # pseudo-queries: sentence windows, high-idf keywords, or alternating
    per_doc: int = 3                   # pseudo-queries per sampled document
    candidates: str = 'teacher'        # 'bm25': negatives sampled from BM25's top `depth`; 'teacher': teacher's top
    negatives: int = 63                # candidates per example = 1 + negatives
    depth: int = 30
    pool: int = 50                     # BM25 and dense top-`pool` per query form the teacher's candidate pool
    teachers: tuple[str, ...] = ('bm25', 'dense')
    dense_teacher: str = 'all-MiniLM-L6-v2'
    latent_teacher: str = 'all-MiniLM-L6-v2'  # the dense base of the 'latent' teacher (Latent Terms, BM25-scored)
    teacher_scale: float = 2.0
    heldout: int = 60                  # held-out pseudo-queries (from documents no training query comes from)
    heldout_pool: int = 10
    heldout_corpus: int = 1000         # documents the held-out queries retrieve from: their pools + random ones
    eval_every: int = 40
    select_on: str = 'heldout_first_ndcg'  # one of SELECT_ON (see heldout_scores)
    min_gain: float = 0.0              # the adapted model must beat the start by more than this on `select_on`
    seed: int = 0

    def __post_init__(self):
        check_choice('side', self.side, SIDES)
        check_choice('queries', self.queries, QUERY_KINDS)
        check_choice('candidates', self.candidates, CANDIDATES)
        check_choice('select_on', self.select_on, SELECT_ON)
        if isinstance(self.teachers, str) or not self.teachers or not set(self.teachers) <= set(TEACHERS):
            raise ValueError(f'teachers must be a non-empty subset of {TEACHERS}, got {self.teachers!r}')
        self.teachers = tuple(self.teachers)
        check_choice('precision', self.precision, TRAIN_PRECISIONS)
        for name in ('dense_teacher', 'latent_teacher'):  # model names, loaded only after the pseudo-queries
            check_str(name, getattr(self, name))
        for name, minimum in MINIMUM.items():
            check_int(name, getattr(self, name), minimum)
        check_float('lr', self.lr, 0, exclusive_minimum=True)
        check_float('teacher_scale', self.teacher_scale, 0, exclusive_minimum=True)
        for name in ('anchor', 'lambda_q', 'lambda_d', 'min_gain'):
            check_float(name, getattr(self, name), 0)
        self.train_config()  # the loop's own checks (losses, lr_multipliers) before any work

    @classmethod
    def two_sided(cls, **overrides) -> 'DomainConfig':
        """The recipe when documents train too (each step encodes every candidate with gradients, so 3 BM25
        negatives instead of 63 and one pseudo-query per document): ``side='both', steps=120, per_doc=1,
        candidates='bm25', negatives=3``, then ``overrides``."""
        return cls(**{'side': 'both', 'steps': 120, 'per_doc': 1, 'candidates': 'bm25', 'negatives': 3, **overrides})

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup_steps=self.steps // 10,
                           lr_multipliers=dict(self.lr_multipliers),
                           losses=dict(self.losses), lambda_q=self.lambda_q, lambda_d=self.lambda_d,
                           flops_warmup_steps=self.steps // 3, max_length=self.max_length, precision=self.precision,
                           seed=self.seed, log_every=10, eval_every=self.eval_every)


def logged_config(config: dict) -> dict:
    """A :class:`DomainConfig`'s fields as read back from a run's log (``domain_adapt.json``): runs logged before
    ``side`` existed trained both sides, and runs logged before ``latent_teacher`` existed had its default."""
    return {'side': 'both', 'latent_teacher': DomainConfig.latent_teacher, **config}


def _parse(name: str, text: str, current):
    if name in ('losses', 'lr_multipliers'):
        items = [item.rsplit(':', 1) for item in text.split('+') if item]
        if any(len(item) != 2 for item in items):
            raise ValueError(f'{name} must read name:number+name:number, got {text!r}')
        return {k: float(v) for k, v in items}
    if name == 'teachers':
        return tuple(text.split('+'))
    if isinstance(current, bool):
        if text.lower() not in ('1', 'true', 'yes', '0', 'false', 'no'):
            raise ValueError(f'{name} must be true or false, got {text!r}')
        return text.lower() in ('1', 'true', 'yes')
    return type(current)(text)


def config_from_overrides(overrides: dict[str, str], base: DomainConfig | None = None) -> DomainConfig:
    """A :class:`DomainConfig` from ``name=value`` strings (CLI and scripts): numbers, booleans, ``losses`` as
    ``infonce:1+kl:1``, ``lr_multipliers`` as ``mlm.cls.:0.1`` and ``teachers`` as ``bm25+dense`` (or
    ``bm25+latent``). An unknown name or a value that does not parse is a ``ValueError`` naming it."""
    base = base or DomainConfig()
    names = [f.name for f in fields(DomainConfig)]
    values = {}
    for name, text in overrides.items():
        if name not in names:
            raise ValueError(f'unknown DomainConfig setting {name!r} (settings: {", ".join(names)})')
        try:
            values[name] = _parse(name, text, getattr(base, name))
        except ValueError as e:
            if str(e).startswith(name):
                raise
            kind = {int: 'an integer', float: 'a number'}.get(type(getattr(base, name)), 'a string')
            raise ValueError(f'{name} must be {kind}, got {text!r}') from None
    return replace(base, **values)
