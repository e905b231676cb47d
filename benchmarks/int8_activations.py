"""int8 activation quantization per token (pyterrier_lsr.core.int8, now) against per call (one grid for a kernel call's
whole input, the previous version, reproduced here): query vectors against fp32, and document-encoding speed.

    PYTHONPATH=. python benchmarks/int8_activations.py --collections irds:vaswani path/to/cisi --speed-docs 200

* fidelity, per collection's topics (SPLADE-tiny query encoder): mean cosine to the fp32 vector, mean overlap of the
  top-10 terms, and non-zero terms relative to fp32 (spurious terms from quantization noise);
* speed: docs/s of ``encode_docs`` on the first ``--speed-docs`` Vaswani documents, fp32 / per call / per token
  interleaved for ``--rounds`` rounds, best round of each (1 thread).

Prints JSON and writes it to ``--output``.
"""
import argparse
import json
import os
import time


def per_call(int8):
    """The previous kernels' forwards: activations quantized on one grid per call (bias inside the kernel)."""
    import torch

    def linear_forward(self, x):
        out = torch.ops.quantized.linear_dynamic(x.float(), self.packed, int8.REDUCE_RANGE)
        return out if self.bias is None else out + self.bias

    def pool_forward(self, hidden, attention_mask):
        valid = attention_mask.bool()
        pooled = torch.full((hidden.shape[0], self.vocab_size), float('-inf'))
        for row in range(hidden.shape[0]):
            tokens = hidden[row, valid[row]].float().contiguous()
            if not len(tokens):
                continue
            for part, v0 in zip(self.slices, self.starts):
                logits = torch.ops.quantized.linear_dynamic(tokens, part, int8.REDUCE_RANGE)
                torch.amax(logits, dim=0, out=pooled[row, v0:v0 + logits.shape[1]])
            if self.bias is not None:
                pooled[row] += self.bias
        return pooled
    return linear_forward, pool_forward


def fidelity(reference, vectors) -> dict:
    def cosine(a, b):
        dot = sum(w * b.get(t, 0.0) for t, w in a.items())
        return dot / ((sum(w * w for w in a.values()) * sum(w * w for w in b.values())) ** 0.5 or 1.0)

    def top(v):
        return set(sorted(v, key=v.get, reverse=True)[:10])
    n = len(reference)
    return {'cosine': sum(cosine(r, v) for r, v in zip(reference, vectors)) / n,
            'top10_overlap': sum(len(top(r) & top(v)) / 10 for r, v in zip(reference, vectors)) / n,
            'terms_vs_fp32': sum(map(len, vectors)) / sum(map(len, reference))}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collections', nargs='+', default=['irds:vaswani'])
    p.add_argument('--speed-docs', type=int, default=200)
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--output', default='benchmarks/results/int8_activations.json')
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    from pyterrier_lsr import Splade
    from pyterrier_lsr.core import int8
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.offline import resolve_model
    from pyterrier_lsr.core.storage import write_json

    path = resolve_model('splade-tiny')
    fp32, int8_model = Splade.from_pretrained(path, batch_size=32), Splade.from_pretrained(path, batch_size=32,
                                                                                              precision='int8')
    forwards = {'per token': (int8.Int8Linear.forward, int8.Int8MaxPool.forward), 'per call': per_call(int8)}

    def use(name):
        int8.Int8Linear.forward, int8.Int8MaxPool.forward = forwards[name]

    result = {'loadavg_before': os.getloadavg(), 'fidelity': {}}
    for name in args.collections:
        topics = list(load_collection(name).topics['query'])
        reference = fp32.encode_queries(topics)
        result['fidelity'][name] = {}
        for mode in forwards:
            use(mode)
            result['fidelity'][name][mode] = fidelity(reference, int8_model.encode_queries(topics))
    docs = [d['text'] for d in load_collection('irds:vaswani').corpus[:args.speed_docs]]
    times = {'fp32': [], 'per call': [], 'per token': []}
    fp32.encode_docs(docs[:16])
    int8_model.encode_docs(docs[:16])
    for _ in range(args.rounds):
        for mode in times:
            model = fp32 if mode == 'fp32' else int8_model
            if mode != 'fp32':
                use(mode)
            start = time.perf_counter()
            model.encode_docs(docs)
            times[mode].append(time.perf_counter() - start)
    use('per token')
    result['speed'] = {mode: {'rounds_s': t, 'docs_per_s': len(docs) / min(t)} for mode, t in times.items()}
    result['loadavg_after'] = os.getloadavg()
    write_json(args.output, result)
    print(json.dumps(result, indent=1))


if __name__ == '__main__':
    main()
