"""Training speed: our loop vs sentence-transformers' SparseEncoder trainer with SpladeLoss, same run.

    pip install "sentence-transformers[train]"
    python benchmarks/train.py --irds-cache PATH

Both train the same SPLADE checkpoint on the same (query, positive, negative) examples (self-supervised Vaswani pairs)
with the same batch size, max lengths, InfoNCE with in-batch negatives (theirs: SparseMultipleNegativesRankingLoss)
and FLOPS regularization (lambda_q, lambda_d), in fp32 and in bf16. Timed: the optimizer steps after `--warmup`
untimed steps, alternating the two trainers (A, B, A, B) so both see the same machine load. Reports training
pairs/s and writes benchmarks/results/train.json.
"""

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import use_irds_cache


def ours(examples, args, precision):
    from pyterrier_lsr import Splade
    from pyterrier_lsr.train import TrainConfig, train

    splade = Splade.from_pretrained(resolve_model(args.model))
    total = args.warmup + args.steps
    config = TrainConfig(
        steps=total,
        batch_size=args.batch_size,
        lr=2e-5,
        warmup_steps=0,
        lambda_q=args.lambda_q,
        lambda_d=args.lambda_d,
        flops_warmup_steps=0,
        query_max_length=args.query_max_length,
        max_length=args.max_length,
        precision=precision,
        log_every=1,
        save_every=10**9,
    )
    with tempfile.TemporaryDirectory() as tmp:
        log = train(splade.model, splade.tokenizer, examples[: total * args.batch_size], tmp, config, verbose=False)
    seconds = {row['step']: row['seconds'] for row in log if 'seconds' in row}
    return args.steps * args.batch_size / (seconds[total] - seconds[args.warmup])


def theirs(examples, args, precision):
    from datasets import Dataset
    from sentence_transformers import SparseEncoder, SparseEncoderTrainer, SparseEncoderTrainingArguments
    from sentence_transformers.sparse_encoder.losses import SparseMultipleNegativesRankingLoss, SpladeLoss
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import TrainerCallback

    mlm = MLMTransformer(resolve_model(args.model), max_seq_length=args.max_length)
    model = SparseEncoder(modules=[mlm, SpladePooling('max')])
    total = args.warmup + args.steps
    rows = examples[: total * args.batch_size]
    data = Dataset.from_dict(
        {
            'query': [e.query for e in rows],
            'positive': [e.positive for e in rows],
            'negative': [e.negatives[0] for e in rows],
        }
    )
    loss = SpladeLoss(
        model,
        SparseMultipleNegativesRankingLoss(model),
        document_regularizer_weight=args.lambda_d,
        query_regularizer_weight=args.lambda_q,
    )
    stamps = {}

    class Clock(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            stamps[state.global_step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        targs = SparseEncoderTrainingArguments(
            output_dir=tmp,
            max_steps=total,
            per_device_train_batch_size=args.batch_size,
            learning_rate=2e-5,
            warmup_steps=0,
            bf16=precision == 'bf16',
            use_cpu=True,
            report_to='none',
            save_strategy='no',
            logging_strategy='no',
            dataloader_drop_last=True,
            disable_tqdm=True,
            seed=42,
        )
        SparseEncoderTrainer(model=model, args=targs, train_dataset=data, loss=loss, callbacks=[Clock()]).train()
    return args.steps * args.batch_size / (stamps[total] - stamps[args.warmup])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--query-max-length', type=int, default=32)
    parser.add_argument('--max-length', type=int, default=128)
    parser.add_argument('--lambda-q', type=float, default=1e-3)
    parser.add_argument('--lambda-d', type=float, default=1e-3)
    parser.add_argument('--threads', type=int, default=None, help='torch threads (1 is steadier on a shared machine)')
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'train.json'))
    args = parser.parse_args()
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import pyterrier as pt
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from pyterrier_lsr.train import self_supervised

    corpus = list(pt.get_dataset('irds:vaswani').get_corpus_iter(verbose=False))
    examples = self_supervised(corpus, num_negatives=1, seed=0, verbose=False)

    results = {}
    for precision in ('fp32', 'bf16'):
        runs = {'pyterrier-lsr': [], 'sentence-transformers': []}
        for _ in range(args.repeats):
            runs['pyterrier-lsr'].append(ours(examples, args, precision))
            runs['sentence-transformers'].append(theirs(examples, args, precision))
        results[precision] = {name: statistics.median(v) for name, v in runs.items()}
        results[precision]['runs'] = runs
        results[precision]['ratio'] = results[precision]['pyterrier-lsr'] / results[precision]['sentence-transformers']

    print(f'{"precision":<10}{"pyterrier-lsr pairs/s":>24}{"sentence-transformers pairs/s":>32}{"ratio":>8}')
    for precision, r in results.items():
        print(f'{precision:<10}{r["pyterrier-lsr"]:>24.1f}{r["sentence-transformers"]:>32.1f}{r["ratio"]:>8.2f}')
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        json.dumps(
            {
                'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                'machine': platform.machine(),
                'threads': torch.get_num_threads(),
                'settings': vars(args),
                'results': results,
            },
            indent=1,
        )
    )


if __name__ == '__main__':
    main()
