"""Where int8 SPLADE loses fidelity to fp32, component by component, on held-out text (no test topic is read).

    PYTHONPATH=. python benchmarks/int8_activations.py --corpus path/to/packages --texts 300

Texts: from the ``packages`` corpus folder (``docs.jsonl.gz``: Debian long descriptions and short package
descriptions; ``queries.tsv``: its held-out queries), ``--texts`` of each kind, a domain none of the test collections
shares. Each variant of the int8 copy (the model defaults to the offline ``splade-tiny``) encodes them, and its vectors
are compared with fp32's: mean and minimum cosine, mean overlap of the top-10 terms, non-zero terms relative to fp32
(spurious terms from rounding noise push it above 1).

Variants: the package's int8 path as it is (the backbone in int8 or fp32 by its share of the model's products, see
:data:`pyterrier_lsr.models.int8.BACKBONE_SHARE`); the backbone in int8 with the projection's non-zero terms computed
again in fp32 or not (:data:`~pyterrier_lsr.models.int8.REFINE_MARGIN`); with 7-bit and with 8-bit activations
(``reduce_range``, see :func:`pyterrier_lsr.models.int8.reduce_range`); the head transform in int8 and in fp32; every
Linear but one in fp32 (one variant per Linear), and the vocabulary projection alone in int8. Per encoder layer, the
relative error (``||int8 - fp32|| / ||fp32||`` per token, averaged) of the hidden states with the backbone in int8.
Speed: documents per CPU-second of fp32 and of the refined projection with the backbone in int8 and in fp32, on all
the texts, the three alternating for ``--speed-rounds`` rounds (what :data:`~pyterrier_lsr.models.int8.BACKBONE_SHARE`
weighs).
One torch thread. Prints JSON and writes it to ``--output``.
"""
import argparse
import datetime
import gzip
import itertools
import json
import os
import sys
import time
from pathlib import Path


def read_texts(folder: Path, n: int) -> dict[str, list[str]]:
    long, short = [], []
    with gzip.open(folder / 'docs.jsonl.gz', 'rt', encoding='utf8') as f:
        for line in f:
            doc = json.loads(line)
            kind = long if doc['docno'].startswith('debian:') else short
            if len(kind) < n:
                kind.append(doc['text'])
            if len(long) == len(short) == n:
                break
    with open(folder / 'queries.tsv', encoding='utf8') as f:
        queries = [line.rstrip('\n').split('\t', 1)[1] for line in itertools.islice(f, n)]
    return {'long docs': long, 'short docs': short, 'queries': queries}


def fidelity(reference: list[dict], vectors: list[dict]) -> dict:
    def cosine(a, b):
        dot = sum(w * b.get(t, 0.0) for t, w in a.items())
        return dot / ((sum(w * w for w in a.values()) * sum(w * w for w in b.values())) ** 0.5 or 1.0)

    def top(v):
        return set(sorted(v, key=v.get, reverse=True)[:10])
    cosines = [cosine(r, v) for r, v in zip(reference, vectors)]
    return {'cosine': sum(cosines) / len(cosines), 'cosine_min': min(cosines),
            'top10_overlap': sum(len(top(r) & top(v)) / 10 for r, v in zip(reference, vectors)) / len(vectors),
            'terms_vs_fp32': sum(map(len, vectors)) / sum(map(len, reference))}


def layer_errors(fp32, int8_model, texts: list[str]) -> list[float]:
    """Mean relative error of each encoder layer's output hidden states, int8 against fp32, over real tokens."""
    import torch

    from pyterrier_lsr.core.encoding import length_sorted_batches
    layers = {}
    for side, module in (('fp32', fp32.model), ('int8', int8_model.model.quantized)):
        for i, layer in enumerate(module.mlm.base_model.encoder.layer):
            layer.register_forward_hook(lambda m, inp, out, key=(side, i): layers.setdefault(key, []).append(
                (out[0] if isinstance(out, tuple) else out).detach()))
    errors = {}
    with torch.inference_mode():
        for batch in length_sorted_batches(fp32.tokenizer, texts, 32, fp32.max_length, 'cpu'):
            layers.clear()
            fp32.model(batch.input_ids, batch.attention_mask)
            int8_model.model(batch.input_ids, batch.attention_mask)
            valid = batch.attention_mask.bool()
            for (side, i), (out,) in layers.items():
                if side == 'int8':
                    ref = layers['fp32', i][0][valid]
                    rel = (out[valid] - ref).norm(dim=-1) / ref.norm(dim=-1)
                    errors.setdefault(i, []).extend(rel.tolist())
    return [sum(e) / len(e) for _, e in sorted(errors.items())]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--corpus', default='packages', help='the packages corpus folder (docs.jsonl.gz, queries.tsv)')
    p.add_argument('--texts', type=int, default=300, help='texts of each kind (long docs, short docs, queries)')
    p.add_argument('--model', default='splade-tiny')
    p.add_argument('--speed-rounds', type=int, default=3, help='rounds of the speed comparison (0: none)')
    p.add_argument('--output', default='benchmarks/results/int8_components.json')
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.storage import write_json
    from pyterrier_lsr.models import int8

    started, load_before = datetime.datetime.now(datetime.timezone.utc), os.getloadavg()
    fp32 = Splade.from_pretrained(args.model, device='cpu', batch_size=32)
    model = Splade.from_pretrained(args.model, device='cpu', batch_size=32, precision='int8')
    module, copy = model.model, model.model.quantized
    floats = dict(module.float_module.named_modules())
    decoder = module.float_module.mlm.get_output_embeddings()
    head_ids = {id(m) for m in int8.head_linears(module.float_module) if m is not decoder}
    head = [name for name, m in floats.items() if id(m) in head_ids]
    int8s = {name: int8.Int8Linear(m) for name, m in floats.items()
             if isinstance(m, torch.nn.Linear) and m is not decoder}
    default_bits = 7 if int8.reduce_range(int8.packing_engine()) else 8
    texts = read_texts(Path(args.corpus), args.texts)
    references = {kind: fp32.encode_docs(t) for kind, t in texts.items()}

    def use(linears_int8=(), pool=True, bits=default_bits, refine=True):
        for name in int8s:
            parent, _, leaf = name.rpartition('.')
            setattr(copy.get_submodule(parent), leaf, int8s[name] if name in linears_int8 else floats[name])
        for m in list(int8s.values()) + [module.pool]:
            m.reduce_range = bits == 7
        module.pool, pool_module = (module.pool if pool else None), module.pool
        margin, int8.REFINE_MARGIN = int8.REFINE_MARGIN, (int8.REFINE_MARGIN if refine else float('-inf'))
        result = {kind: fidelity(references[kind], model.encode_docs(t)) for kind, t in texts.items()}
        module.pool, int8.REFINE_MARGIN = pool_module, margin
        return result

    backbone = [name for name in int8s if name not in head]
    package = backbone if module.int8_backbone else []
    variants = {'package path (backbone share '
                f'{int8.backbone_share(module.float_module, (decoder, *int8.head_linears(module.float_module))):.2f}: '
                f'backbone {"int8" if package else "fp32"}), {default_bits}-bit activations': use(package)}
    for bits in (7, 8):
        variants[f'backbone int8, projection refined, {bits}-bit activations'] = use(backbone, bits=bits)
        variants[f'backbone int8, projection not refined, {bits}-bit activations'] = use(backbone, bits=bits,
                                                                                          refine=False)
        variants[f'head transform int8 too, projection refined, {bits}-bit activations'] = use(list(int8s), bits=bits)
        variants[f'projection alone in int8, not refined, {bits}-bit activations'] = use((), bits=bits, refine=False)
        variants[f'backbone alone in int8 (projection fp32), {bits}-bit activations'] = use(backbone, False, bits)
    for name in int8s:
        variants[f'{name} alone in int8, {default_bits}-bit activations'] = use([name], pool=False)
    use(backbone)
    everything = [t for ts in texts.values() for t in ts]
    errors = layer_errors(fp32, model, everything)
    speed = {'fp32': [], 'backbone int8, projection refined': [], 'backbone fp32, projection refined': []}
    for _ in range(args.speed_rounds):  # interleaved, so that a noisy neighbour slows every variant alike
        for name in speed:
            if name != 'fp32':
                use(backbone if 'backbone int8' in name else [])
            encoder, cpu = fp32 if name == 'fp32' else model, time.process_time()
            encoder.encode_docs(everything)
            speed[name].append(len(everything) / (time.process_time() - cpu))
    use(package)
    result = {'command': ' '.join([Path(sys.executable).name] + sys.argv), 'started': started.isoformat(),
              'loadavg_before': load_before, 'torch': torch.__version__, 'engine': int8.packing_engine(),
              'vnni': torch.cpu._is_vnni_supported(), 'package_activation_bits': default_bits, 'model': args.model,
              'texts': {kind: len(t) for kind, t in texts.items()}, 'fidelity': variants,
              'layer_relative_error': errors,
              'docs_per_cpu_s': {name: {'rounds': rates, 'best_vs_fp32': max(rates) / max(speed['fp32'])}
                                 for name, rates in speed.items() if rates},
              'loadavg_after': os.getloadavg()}
    write_json(args.output, result)
    print(json.dumps(result, indent=1))


if __name__ == '__main__':
    main()
