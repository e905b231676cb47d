"""GPU check, ready, not yet run on a GPU (no GPU was lent when it was written; ``--smoke`` was run on a CPU): one
command of a few minutes on one GPU, offline, every model and text from local paths.

    python benchmarks/gpu_check.py --docs path/to/docs.jsonl --output $OUT/gpu_check.json     # on the GPU machine
    python benchmarks/gpu_check.py --docs path/to/docs.jsonl --smoke                          # anywhere, on CPU

``--docs``: a ``docs.jsonl`` (or ``.jsonl.gz``) of ``{"text": ...}`` lines, e.g. CISI's (longer texts) or the
packages corpus (short ones); the first ``--n-docs`` are used. ``--splade``: SPLADE-tiny's folder or offline name.
Every part runs under the package's device rule with no ``device`` argument (CUDA when present), so the check also
shows that the defaults land on the GPU. Per model (SPLADE-tiny, and a BERT-base-sized masked LM with random weights,
its output bias calibrated to about 150 active terms per text like a trained SPLADE, which serves for timing):

* docs/s of ``encode_docs`` (default precision: bf16 autocast on CUDA, fp32 on CPU), and docs/s of a raw forward
  over the same batches, tokenized and on the device beforehand: the package's overhead (tokenizing, sorting,
  ``{term: weight}`` dicts) is the difference;
* bf16 against fp32 (explicit) on the same texts: mean cosine and top-10 overlap of the vectors;
* the projected time to encode MS MARCO's 8,841,823 passages at that rate, scaled by the ratio of mean token counts
  (``--msmarco-tokens``, about 78 WordPiece tokens with specials) to these texts';
* training pairs/s of the bundled loop (bf16 on CUDA, each pair a query made of a text's first words and the text,
  in-batch negatives), 2 warm-up steps excluded.

Then SAE training time: ``train_sae`` with no ``device`` on a tensor of random vectors made on the device
(``--sae-vectors`` x 768, 16,384 latents, k=32, one epoch). ``--smoke`` shrinks every size (the random BERT to
2 x 256) so that the whole runs in minutes on a CPU. Prints one JSON line per part and writes them to ``--output``.
"""
import argparse
import datetime
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

MSMARCO_PASSAGES = 8_841_823


def read_docs(path: Path, n: int) -> list[str]:
    opener = gzip.open if path.suffix == '.gz' else open
    texts = []
    with opener(path, 'rt', encoding='utf8') as f:
        for line in f:
            texts.append(json.loads(line)['text'])
            if len(texts) == n:
                break
    return texts


def sync():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def random_bert(tokenizer, texts, layers: int, hidden: int):
    """A BERT SPLADE of ``layers`` x ``hidden`` (12 x 768: BERT-base) with random weights, whose output bias leaves
    ~0.5 % of terms active."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from pyterrier_lsr.models import SpladeModel
    from pyterrier_lsr.models.heads import calibrate_activation
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), num_hidden_layers=layers, hidden_size=hidden,
                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
    module = SpladeModel(BertForMaskedLM(config), tokenizer.all_special_ids).eval()
    calibrate_activation(module, tokenizer, texts[:64])
    return module


def encoding(name, model, texts, batch_size, msmarco_tokens) -> dict:
    import torch

    from pyterrier_lsr.core.encoding import autocast, length_sorted_batches
    model.encode_docs(texts[:batch_size])  # warm-up: kernels, allocator
    package = timed(lambda: model.encode_docs(texts))
    batches = list(length_sorted_batches(model.tokenizer, texts, batch_size, model.max_length, model.device))

    def raw():
        with torch.inference_mode(), autocast(model.device, model.precision):
            for batch in batches:
                model.model(batch.input_ids, batch.attention_mask)
    raw()
    forward = timed(raw)
    tokens = sum(int(b.attention_mask.sum()) for b in batches) / len(texts)
    docs_per_s = len(texts) / package
    return {'part': 'encoding', 'model': name, 'device': str(model.device), 'precision': model.precision,
            'docs': len(texts), 'mean_tokens': tokens, 'docs_per_s': docs_per_s,
            'raw_forward_docs_per_s': len(texts) / forward, 'package_vs_raw': forward / package,
            'msmarco_hours_projected': MSMARCO_PASSAGES / docs_per_s * (msmarco_tokens / tokens) / 3600}


def agreement(name, module, tokenizer, texts, device) -> dict:
    from pyterrier_lsr import Splade
    vectors = {p: Splade(module, tokenizer, device=device, precision=p, batch_size=32).encode_docs(texts)
               for p in ('fp32', 'bf16')}

    def cosine(a, b):
        dot = sum(w * b.get(t, 0.0) for t, w in a.items())
        return dot / ((sum(w * w for w in a.values()) * sum(w * w for w in b.values())) ** 0.5 or 1.0)

    def top(v):
        return set(sorted(v, key=v.get, reverse=True)[:10])
    pairs = list(zip(vectors['fp32'], vectors['bf16']))
    return {'part': 'bf16 vs fp32', 'model': name, 'device': str(device), 'texts': len(texts),
            'cosine': sum(cosine(a, b) for a, b in pairs) / len(pairs),
            'top10_overlap': sum(len(top(a) & top(b)) / 10 for a, b in pairs) / len(pairs)}


def training(name, module, tokenizer, texts, steps, batch_size) -> dict:
    """Pairs/s over ``steps`` steps after 2 warm-up steps, from the loop's own log (the final checkpoint's write is
    not timed; the log's clock has 0.1 s steps)."""
    import torch

    from pyterrier_lsr.train import Example, TrainConfig, train
    examples = [Example(' '.join(t.split()[:8]), t) for t in texts if t.strip()]
    bf16 = torch.cuda.is_available()
    config = TrainConfig(steps=steps + 2, batch_size=batch_size, warmup_steps=0, flops_warmup_steps=0,
                         precision='bf16' if bf16 else 'fp32',
                         log_every=1, max_length=128)
    with tempfile.TemporaryDirectory() as tmp:
        log = train(module, tokenizer, examples, tmp, config, verbose=False)
    seconds = {row['step']: row['seconds'] for row in log if 'seconds' in row}
    elapsed = seconds[steps + 2] - seconds[2]
    return {'part': 'training', 'model': name, 'device': str(next(module.parameters()).device), 'bf16': bf16,
            'steps': steps, 'batch_size': batch_size, 'seconds': elapsed,
            'pairs_per_s': steps * batch_size / elapsed if elapsed else None}


def sae_training(n_vectors, d, n_latents, k) -> dict:
    import torch

    from pyterrier_lsr.core.encoding import resolve_device
    from pyterrier_lsr.models.sae import SAEConfig, train_sae
    vectors = torch.randn(n_vectors, d, generator=torch.Generator().manual_seed(0)).to(resolve_device())
    config = SAEConfig(d_in=d, n_latents=n_latents, k=k, batch_size=4096)
    log = []
    seconds = timed(lambda: log.extend(train_sae(vectors, config, verbose=False)[1]))
    return {'part': 'sae training', 'vectors_device': str(vectors.device), 'vectors': n_vectors, 'd': d,
            'n_latents': n_latents, 'k': k, 'seconds': seconds, 'vectors_per_s': n_vectors / seconds,
            'fve': log[-1]['fve']}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--docs', default='docs.jsonl', help='a docs.jsonl(.gz) of {"text": ...} lines')
    p.add_argument('--splade', default='splade-tiny', help="SPLADE-tiny's folder (or offline name)")
    p.add_argument('--n-docs', type=int, default=20_000)
    p.add_argument('--batch-size', type=int, default=256)
    p.add_argument('--msmarco-tokens', type=float, default=78.)
    p.add_argument('--train-steps', type=int, default=30)
    p.add_argument('--train-batch-size', type=int, default=64)
    p.add_argument('--sae-vectors', type=int, default=1_000_000)
    p.add_argument('--smoke', action='store_true', help='tiny sizes, for a CPU')
    p.add_argument('--output', default='benchmarks/results/gpu_check.json')
    args = p.parse_args()
    if args.smoke:
        args.n_docs, args.batch_size, args.train_steps, args.train_batch_size = 64, 32, 3, 4
        args.sae_vectors = 8192
    import torch

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.storage import write_json
    started = datetime.datetime.now(datetime.timezone.utc)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    result = {'command': ' '.join([Path(sys.executable).name] + sys.argv), 'started': started.isoformat(),
              'gpu': gpu, 'torch': torch.__version__, 'loadavg_before': os.getloadavg(), 'parts': []}
    texts = read_docs(Path(args.docs), args.n_docs)
    tiny = Splade.from_pretrained(args.splade, batch_size=args.batch_size)
    layers, hidden = (2, 256) if args.smoke else (12, 768)
    modules = {'splade-tiny': tiny.model,
               f'random BERT {layers} x {hidden}': random_bert(tiny.tokenizer, texts, layers, hidden)}
    few = texts[:min(len(texts), 1000)]
    for name, module in modules.items():
        model = Splade(module, tiny.tokenizer, batch_size=args.batch_size)
        for part in (lambda: encoding(name, model, texts, args.batch_size, args.msmarco_tokens),
                     lambda: agreement(name, module, tiny.tokenizer, few, model.device),
                     lambda: training(name, module, tiny.tokenizer, texts, args.train_steps, args.train_batch_size)):
            result['parts'].append(part())
            print(json.dumps(result['parts'][-1]), flush=True)
        module.eval()
    d, latents, k = (64, 512, 8) if args.smoke else (768, 16_384, 32)
    result['parts'].append(sae_training(args.sae_vectors, d, latents, k))
    print(json.dumps(result['parts'][-1]), flush=True)
    result['seconds'] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    result['loadavg_after'] = os.getloadavg()
    write_json(args.output, result)
    print(f'wrote {args.output}')


if __name__ == '__main__':
    main()
