"""The fixed-budget recipe the method comparisons share (examples/head_scale.py, sae_splade.py, vocab_transfer.py):
self-supervised examples with cached teacher scores, and training for a fixed number of steps with the test curve
logged. Settings come from an argparse namespace (:func:`parser`), so every comparison exposes the same flags.

For adapting a model to a new collection use :func:`pyterrier_lsr.train.domain_adapt`, which selects its checkpoint
on held-out pseudo-queries and never returns a model worse than the start on them.
"""
import argparse
import time
from dataclasses import asdict
from pathlib import Path

from ..core.extras import require_models
from ..core.names import resolve_model
from ..core.offline import use_irds_cache
from ..core.storage import read_json, write_json
from ..index.bm25 import bm25_index as build_bm25_index
from ..train.domain.teacher import cache_key as _key

TEACHERS = {'none': [], 'bm25': ['bm25'], 'minilm': ['minilm'], 'fusion': ['bm25', 'minilm']}


def _cached(path: Path, compute):
    """JSON value at ``path``, computed (and written) on first use."""
    if path.exists():
        return read_json(path, 'a cached value', expect=None)
    value = compute()
    write_json(path, value, indent=None)
    return value


def prepare_examples(args, corpus) -> list:
    """Self-supervised examples with the teacher's scores (``args.teacher_scale`` times the sum of each teacher's
    per-query z-scores, as :class:`ZScoreFusion` computes them), cached under ``args.cache_dir``."""
    from ..train.data import Example, add_teacher_scores, self_supervised
    from ..train.teachers import DenseScorer, RetrieverScorer, ZScoreFusion
    cache = Path(args.cache_dir or args.output)
    data_settings = {'dataset': args.dataset, 'negatives': args.negatives, 'depth': args.depth,
                     'per_doc': args.per_doc, 'seed': args.seed}
    key = _key(data_settings)
    precision = args.teacher_precision
    bm25_path = cache / f'bm25-{_key({"dataset": args.dataset})}.pisa'
    bm25_index = build_bm25_index(bm25_path, corpus)
    examples = [Example(**ex) for ex in _cached(cache / f'examples-{key}.json', lambda: [
        asdict(ex) for ex in self_supervised(corpus, num_negatives=args.negatives, depth=args.depth, seed=args.seed,
                                             per_doc=args.per_doc, bm25_index=bm25_index)])]
    scorers = {'bm25': lambda: RetrieverScorer(bm25_index.bm25(), {d['docno']: d['text'] for d in corpus}),
               'minilm': lambda: DenseScorer(resolve_model(args.dense_teacher), precision=precision)}
    names = {'bm25': 'bm25', 'minilm': [args.dense_teacher, precision]}
    total = None
    for teacher in TEACHERS[args.teacher]:
        z = _cached(cache / f'teacher-{key}-{_key({"teacher": names[teacher]})}.json',
                    lambda: [ex.teacher for ex in add_teacher_scores(examples, ZScoreFusion([scorers[teacher]()]))])
        total = z if total is None else [[a + b for a, b in zip(x, y)] for x, y in zip(total, z)]
    if total is not None:
        examples = [Example(ex.query, ex.positive, ex.negatives, [args.teacher_scale * s for s in scores])
                    for ex, scores in zip(examples, total)]
    return examples


def train_config(args):
    from ..train.config import TrainConfig
    losses = dict(item.split('=') for item in args.losses.split(','))
    multipliers = dict(item.rsplit('=', 1) for item in args.lr_multipliers.split(',') if item)
    return TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.steps // 10,
                       lr_multipliers={k: float(v) for k, v in multipliers.items()},
                       losses={k: float(v) for k, v in losses.items()}, lambda_q=args.lambda_q, lambda_d=args.lambda_d,
                       flops_warmup_steps=args.steps // 3, max_length=args.max_length, precision=args.precision,
                       seed=args.seed, eval_every=args.eval_every, log_every=args.log_every)


def fine_tune(model, tokenizer, examples, corpus, topics, qrels, output: Path, args, prep_seconds: float = 0.) -> dict:
    """Trains ``model`` (a :class:`SpladeModel`) on ``examples`` with the settings of ``args``, evaluating nDCG@10 on
    ``topics``/``qrels`` along the way; writes and returns ``result.json``.

    ``--query-side idf|learned`` trains an inference-free (doc-only) model: queries are a static table initialised
    with the corpus idf (fixed, or learned jointly), FLOPS on documents only."""
    from dataclasses import replace

    from pyterrier.measures import nDCG

    from ..stages.query import IDFQueryEncoder, StaticQueryWeights
    from ..train.evaluate import experiment_evaluator
    from ..train.loop import train
    config, weights, query_side = train_config(args), None, None
    if args.query_side != 'model':
        idf = IDFQueryEncoder.from_corpus(tokenizer, [d['text'] for d in corpus])
        weights = StaticQueryWeights(tokenizer, idf.weights, trainable=args.query_side == 'learned')
        config = replace(config, lambda_q=0.)
        query_side = weights.to_encoder
    precision = args.precision
    evaluate = (experiment_evaluator(tokenizer, corpus, topics, qrels, [nDCG @ 10], precision=precision,
                                     query_side=query_side) if args.evaluate else None)
    zero_shot = evaluate(model) if evaluate is not None and args.zero_shot else None
    train_start = time.time()
    log = train(model, tokenizer, examples, output, config, evaluate=evaluate, query_encoder=weights,
                extra_parameters=[weights.weight] if args.query_side == 'learned' else [])
    result = {'args': vars(args), 'zero_shot': zero_shot, 'final': log[-1],
              'prep_seconds': round(prep_seconds), 'train_seconds': round(time.time() - train_start),
              'curve': [(row['step'], row['nDCG@10']) for row in log if 'nDCG@10' in row]}
    write_json(output / 'result.json', result)
    return result


def parser(description: str = None, steps: int = 250) -> argparse.ArgumentParser:
    """Command-line settings of the data and the training (shared by the method comparisons in examples/)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dataset', default='irds:vaswani')
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--dense-teacher', default='all-MiniLM-L6-v2')
    parser.add_argument('--teacher', choices=sorted(TEACHERS), default='fusion')
    parser.add_argument('--teacher-precision', choices=['fp32', 'bf16'], default='fp32', help='of the dense teacher')
    parser.add_argument('--teacher-scale', type=float, default=2.0, help='weight of each z-normalized teacher score')
    parser.add_argument('--losses', default='infonce=1,kl=1')
    parser.add_argument('--query-side', choices=['model', 'idf', 'learned'], default='model',
                        help='queries through the model (SPLADE) or a static idf table, fixed or learned (doc-only)')
    parser.add_argument('--steps', type=int, default=steps)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--negatives', type=int, default=3)
    parser.add_argument('--depth', type=int, default=30, help='BM25 depth negatives are sampled from')
    parser.add_argument('--per-doc', type=int, default=1, help='pseudo-queries per document')
    parser.add_argument('--lr', type=float, default=1e-4)
    parser.add_argument('--lr-multipliers', default='', help='factors of --lr for parameters by name prefix, e.g. '
                                                             'sae.=10,alpha=10 (SAE-SPLADE\'s SAE encoder and α)')
    parser.add_argument('--lambda-q', type=float, default=1e-3)
    parser.add_argument('--lambda-d', type=float, default=1e-3)
    parser.add_argument('--max-length', type=int, default=96)
    parser.add_argument('--precision', choices=['fp32', 'bf16'], default='bf16')
    parser.add_argument('--eval-every', type=int, default=125)
    parser.add_argument('--evaluate', action=argparse.BooleanOptionalAction, default=True,
                        help='evaluate nDCG@10 on the test topics every --eval-every steps and at the end')
    parser.add_argument('--log-every', type=int, default=10)
    parser.add_argument('--zero-shot', action=argparse.BooleanOptionalAction, default=True,
                        help='evaluate the model before training too')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--output', default='runs/domain_adaptation')
    parser.add_argument('--cache-dir', help='where examples, teacher scores and the BM25 index are cached '
                                            '(default: --output)')
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    return parser


def parse_args(parser: argparse.ArgumentParser):
    """The arguments, the offline checkpoints they name checked before any work (the demo extra)."""
    args = parser.parse_args()
    require_models(*(value for value in vars(args).values() if isinstance(value, str)))
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    return args
