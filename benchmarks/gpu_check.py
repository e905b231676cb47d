"""GPU check (PREPARED, NOT YET RUN: no GPU machine was available when it was written): encoding speed on one GPU
with bf16, in process and through one Ray worker, the projected MS MARCO encoding time, and a short bf16 training run.

    python benchmarks/gpu_check.py --irds-cache PATH --output $OUT/gpu_check.json

For each model (SPLADE-tiny: BERT 2 layers x 128; all-MiniLM-L6-v2 as a SPLADE model: 6 layers x 384, its MLM head
initialised randomly, which costs what a trained head costs): the Vaswani documents, cycled to ``--docs`` documents
(fresh docnos), are encoded (1) in process, ``model.encode`` over chunks of 1024, bf16 autocast; (2) by
``pyterrier_lsr.scaleout.encode`` with one Ray worker holding the GPU. docs/s exclude a warm-up chunk in (1) and
include actor start-up in (2). Projected MS MARCO passage time = 8,841,823 / docs/s, scaled by the ratio of mean
token counts (MS MARCO passages: ``--msmarco-tokens``, about 78 WordPiece tokens with specials) to these documents'.
Then ``--train-steps`` steps of the bundled loop in bf16 on the GPU (pairs/s) and bf16 vs fp32 agreement of the
document vectors (share of identical quantized impacts on 1,000 documents).
"""
import argparse
import itertools
import json
import platform
import tempfile
import time
from pathlib import Path

MSMARCO_PASSAGES = 8_841_823
MODELS = ('splade-tiny', 'all-MiniLM-L6-v2')


def corpus(n):
    import pyterrier as pt
    docs = list(pt.get_dataset('irds:vaswani').get_corpus_iter(verbose=False))
    return [{'docno': f'{d["docno"]}-{i // len(docs)}', 'text': d['text']}
            for i, d in zip(range(n), itertools.cycle(docs))]


def in_process(model, docs, chunk):
    import torch
    model.encode([d['text'] for d in docs[:chunk]])  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(chunk, len(docs), chunk):
        model.encode([d['text'] for d in docs[i:i + chunk]])
    torch.cuda.synchronize()
    return (len(docs) - chunk) / (time.perf_counter() - start)


def one_ray_worker(name, docs, batch_size):
    import ray

    from pyterrier_lsr import scaleout as distributed
    ray.init(num_gpus=1, num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            distributed.encode(docs, name, Path(tmp) / 'vectors', num_workers=1, gpus_per_worker=1,
                               threads_per_worker=4, model_kwargs={'precision': 'bf16', 'batch_size': batch_size},
                               verbose=False)
            return len(docs) / (time.perf_counter() - start)
    finally:
        ray.shutdown()


def agreement(name, docs, batch_size):
    from pyterrier_lsr import Splade
    from pyterrier_lsr.index import quantize
    texts = [d['text'] for d in docs[:1000]]
    fp32 = Splade.from_pretrained(name, device='cuda', precision='fp32', batch_size=batch_size).encode(texts)
    bf16 = Splade.from_pretrained(name, device='cuda', precision='bf16', batch_size=batch_size).encode(texts)
    same = total = 0
    for a, b in zip(fp32, bf16):
        qa, qb = quantize(a, 100.), quantize(b, 100.)
        total += len(qa.keys() | qb.keys())
        same += sum(qa.get(t) == qb.get(t) for t in qa.keys() | qb.keys())
    return same / max(total, 1)


def training(name, docs, steps, batch_size):
    from pyterrier_lsr import Splade
    from pyterrier_lsr.train import TrainConfig, self_supervised, train
    examples = self_supervised(docs[:10_000], num_negatives=1, seed=0, verbose=False)
    splade = Splade.from_pretrained(name, device='cuda')
    config = TrainConfig(steps=steps + 3, batch_size=batch_size, lr=2e-5, warmup_steps=0, flops_warmup_steps=0,
                         bf16=True, log_every=1, save_every=10 ** 9)
    with tempfile.TemporaryDirectory() as tmp:
        log = train(splade.model, splade.tokenizer, examples, tmp, config, verbose=False)
    seconds = {row['step']: row['seconds'] for row in log if 'seconds' in row}
    return steps * batch_size / (seconds[steps + 3] - seconds[3])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--docs', type=int, default=100_000)
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--chunk-size', type=int, default=1024)
    parser.add_argument('--msmarco-tokens', type=float, default=78.)
    parser.add_argument('--train-steps', type=int, default=30)
    parser.add_argument('--train-batch-size', type=int, default=64)
    parser.add_argument('--models', nargs='+', default=list(MODELS))
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'gpu_check.json'))
    args = parser.parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit('no CUDA device: this script checks the GPU path')

    from pyterrier_lsr import Splade
    docs = corpus(args.docs)
    rows = []
    for name in args.models:
        model = Splade.from_pretrained(name, device='cuda', precision='bf16', batch_size=args.batch_size)
        tokens = sum(len(ids) for ids in model.tokenizer([d['text'] for d in docs[:2000]], truncation=True,
                                                           max_length=model.max_length)['input_ids']) / 2000
        row = {'model': name, 'mean tokens': tokens, 'docs/s in process': in_process(model, docs, args.chunk_size)}
        del model
        torch.cuda.empty_cache()
        row['docs/s Ray (1 worker)'] = one_ray_worker(name, docs, args.batch_size)
        row['MS MARCO hours (Ray)'] = MSMARCO_PASSAGES / row['docs/s Ray (1 worker)'] * (
            args.msmarco_tokens / tokens) / 3600
        row['bf16 = fp32 impacts'] = agreement(name, docs, args.batch_size)
        row['train pairs/s (bf16)'] = training(name, docs, args.train_steps, args.train_batch_size)
        rows.append(row)
        print(json.dumps(row), flush=True)

    import pandas as pd
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f'{x:.3f}'))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({
        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'machine': platform.node(),
        'gpu': torch.cuda.get_device_name(0), 'settings': vars(args), 'rows': rows}, indent=1))


if __name__ == '__main__':
    main()
