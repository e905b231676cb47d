"""OpenVINO probe: SPLADE document encoding through OpenVINO fp32 and NNCF int8, against torch fp32 and
``precision='int8'`` (issue #30's int8 target, measured before any backend is integrated).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/openvino_probe.py --cisi path/to/cisi

Needs ``openvino`` and ``nncf`` (not dependencies of the library). The document side is converted end to end:
``(input_ids, attention_mask)`` -> the max-pooled ``log(1 + relu)`` vocabulary vector. The library's fused pooling
(:func:`~pyterrier_lsr.models.pooling.max_pooled_logits`, vocabulary tiles in a Python loop over texts) cannot be
traced, so :class:`PlainDocuments` computes the same thing in plain torch ops (padding positions take the ``[CLS]``
hidden state, as the fused pooling gives them a real position's; the bias is added after the max; special tokens
zeroed by a mask, since OpenVINO has no ``index_fill``), checked against the library's fp32 output first.
``--vocab-steps`` also converts a variant whose vocabulary projection is split into slices of that many rows
(unrolled in the graph), so each slice's logits are smaller than the batch's whole batch x length x vocabulary.

* int8: ``nncf.quantize`` (post-training static quantization, ``ModelType.TRANSFORMER``) calibrated on
  ``--calibration-docs`` Vaswani documents taken after the speed documents (one text per item, never topics);
* speed: docs/s on the first ``--speed-docs`` Vaswani documents, every variant tokenized and batched by the
  library's engine (:func:`~pyterrier_lsr.core.encoding.length_sorted_batches`, the same max_length, batch size and
  length sorting) and turned into dicts alike, interleaved for ``--rounds`` rounds, one thread each (OpenVINO's
  ``INFERENCE_NUM_THREADS``); best round and every round reported, load average before and after;
* fidelity to torch fp32 on the speed documents: cosine, top-10 terms kept, non-zero terms (as
  ``benchmarks/int8_activations.py``);
* ``--effectiveness``: nDCG@10 on Vaswani and CISI of OpenVINO int8 documents and queries against torch fp32
  (``benchmarks/int8.py``'s effectiveness run, PISA exact).

Prints a table and writes JSON (``--output``).
"""
import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from int8 import cpu_info, effectiveness
from int8_activations import fidelity
from torch import nn


class PlainDocuments(nn.Module):
    """A :class:`~pyterrier_lsr.models.splade.SpladeModel`'s forward in traceable torch ops (see the module
    docstring); ``vocab_step`` splits the vocabulary projection into slices of that many rows."""

    def __init__(self, model, vocab_step: int = 0):
        super().__init__()
        self.model = model
        decoder = model.mlm.get_output_embeddings()
        vocab = decoder.weight.shape[0]
        step = vocab_step or vocab
        self.slices = [(v0, min(vocab, v0 + step)) for v0 in range(0, vocab, step)]
        self.decoder = decoder
        keep = torch.ones(vocab)
        keep[model.special_token_ids] = 0
        self.register_buffer('keep', keep, persistent=False)
        self.scale = float(model.settings['head_scale'])

    def forward(self, input_ids, attention_mask):
        hidden = self.model.decoder_inputs(input_ids, attention_mask)
        hidden = torch.where(attention_mask.bool()[..., None], hidden, hidden[:, :1])
        weight, bias = self.decoder.weight, self.decoder.bias
        pooled = torch.cat([nn.functional.linear(hidden, weight[v0:v1]).amax(dim=1) for v0, v1 in self.slices], 1)
        if bias is not None:
            pooled = pooled + bias
        return torch.log1p(torch.relu(pooled / self.scale)) * self.keep


class OpenVinoEncoder:
    """Texts -> dicts through a compiled OpenVINO model, batched exactly as the library's ``encode_texts``."""

    def __init__(self, compiled, splade):
        self.request = compiled.create_infer_request()
        self.splade = splade

    def weights(self, input_ids, attention_mask) -> torch.Tensor:
        self.request.infer({'input_ids': input_ids.numpy(), 'attention_mask': attention_mask.numpy()})
        return torch.from_numpy(self.request.get_output_tensor(0).data.copy())

    def encode_docs(self, texts, batch_size=None, verbose=False, desc='encoding'):
        from pyterrier_lsr.core.encoding import as_text, length_sorted_batches, to_dicts
        s = self.splade
        texts = [as_text(text, i) for i, text in enumerate(texts)]
        results = [{} for _ in texts]
        for batch in length_sorted_batches(s.tokenizer, texts, batch_size or s.batch_size, s.max_length,
                                           verbose=verbose, desc=desc):
            for i, vec in zip(batch.positions, to_dicts(self.weights(batch.input_ids, batch.attention_mask), s.terms)):
                results[i] = vec
        return results


def openvino_model(encoder):
    """A :class:`~pyterrier_lsr.Splade` whose documents and queries go through ``encoder`` (for the indexer and
    the retriever of the effectiveness run; saving writes the fp32 torch weights)."""
    from pyterrier_lsr import Splade

    class OpenVinoSplade(Splade):
        def encode_docs(self, texts, batch_size=None, verbose=False, desc='encoding'):
            return encoder.encode_docs(texts, batch_size, verbose, desc)

    s = encoder.splade
    return OpenVinoSplade(s.model, s.tokenizer, device='cpu', max_length=s.max_length, batch_size=s.batch_size,
                          name=s.name)


def max_difference(splade, plain, texts) -> float:
    from pyterrier_lsr.core.encoding import length_sorted_batches
    worst = 0.
    with torch.inference_mode():
        for batch in length_sorted_batches(splade.tokenizer, texts, splade.batch_size, splade.max_length):
            ours = splade.model(batch.input_ids, batch.attention_mask)
            worst = max(worst, (ours - plain(batch.input_ids, batch.attention_mask)).abs().max().item())
    return worst


def profile(compiled, splade, texts, top: int = 6) -> dict:
    """The largest shares of OpenVINO's own per-node time over ``texts`` (batched as :class:`OpenVinoEncoder`),
    by node type and kernel: which kernels run the vocabulary projection."""
    from collections import Counter

    from pyterrier_lsr.core.encoding import length_sorted_batches
    request, spent = compiled.create_infer_request(), Counter()
    for batch in length_sorted_batches(splade.tokenizer, texts, splade.batch_size, splade.max_length):
        request.infer({'input_ids': batch.input_ids.numpy(), 'attention_mask': batch.attention_mask.numpy()})
        for node in request.profiling_info:
            spent[f'{node.node_type} ({node.exec_type})'] += node.real_time.total_seconds()
    total = sum(spent.values()) or 1.
    return {name: round(seconds / total, 3) for name, seconds in spent.most_common(top)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--vaswani', default='irds:vaswani')
    parser.add_argument('--cisi', default='cisi', help='the CISI folder (docs.jsonl, topics.tsv, qrels.txt)')
    parser.add_argument('--speed-docs', type=int, default=500)
    parser.add_argument('--calibration-docs', type=int, default=300)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--vocab-steps', type=int, nargs='+', default=[0],
                        help='vocabulary slice sizes of the converted variants (0: one projection)')
    parser.add_argument('--precision-hints', nargs='*', default=[],
                        help='OpenVINO INFERENCE_PRECISION_HINT values (e.g. bf16 f16), timed where the CPU runs them')
    parser.add_argument('--profile', action='store_true', help="OpenVINO's per-kernel time shares (untimed pass)")
    parser.add_argument('--effectiveness', action='store_true', help='nDCG@10 of OpenVINO int8 (the first step)')
    parser.add_argument('--workdir', default=None, help='where the effectiveness indexes go (default: temporary)')
    parser.add_argument('--output', default='benchmarks/results/openvino_probe.json')
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    import nncf
    import openvino as ov

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.core.encoding import length_sorted_batches
    from pyterrier_lsr.core.storage import write_json

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    fp32 = Splade.from_pretrained(args.model, device='cpu')
    int8 = Splade.from_pretrained(args.model, device='cpu', precision='int8')
    vaswani = load_collection(args.vaswani)
    corpus = [d['text'] for d in vaswani.corpus]
    texts = corpus[:args.speed_docs]
    calibration = corpus[args.speed_docs:args.speed_docs + args.calibration_docs]
    config = {'INFERENCE_NUM_THREADS': 1}
    result = {'command': ' '.join([Path(sys.executable).name] + sys.argv), 'started': started.isoformat(),
              'cpu': cpu_info(), 'versions': {'torch': torch.__version__, 'openvino': ov.__version__,
                                              'nncf': nncf.__version__},
              'model': args.model, 'batch_size': fp32.batch_size, 'max_length': fp32.max_length,
              'openvino_config': config, 'speed_docs': len(texts), 'calibration_docs': len(calibration),
              'loadavg_before': load_before, 'conversion': {}}

    core = ov.Core()
    example = next(length_sorted_batches(fp32.tokenizer, texts[:4], 4, fp32.max_length))
    inputs = [('input_ids', [-1, -1], ov.Type.i64), ('attention_mask', [-1, -1], ov.Type.i64)]
    items = [(b.input_ids.numpy(), b.attention_mask.numpy())
             for b in length_sorted_batches(fp32.tokenizer, calibration, 1, fp32.max_length)]
    encoders = {'torch fp32': fp32, 'torch int8': int8}
    for step in args.vocab_steps:
        plain = PlainDocuments(fp32.model, step).eval()
        tag = f' (vocab slices {step})' if step else ''
        info = {'max_abs_difference_to_fused': max_difference(fp32, plain, texts[:64])}
        start = time.perf_counter()
        with torch.inference_mode():
            graph = ov.convert_model(plain, example_input=(example.input_ids, example.attention_mask), input=inputs)
        info['convert_s'] = time.perf_counter() - start
        start = time.perf_counter()
        quantized = nncf.quantize(graph, nncf.Dataset(items, lambda item: {'input_ids': item[0],
                                                                           'attention_mask': item[1]}),
                                  model_type=nncf.ModelType.TRANSFORMER, subset_size=len(items))
        info['quantize_s'] = time.perf_counter() - start
        result['conversion'][step] = info
        encoders['openvino fp32' + tag] = OpenVinoEncoder(core.compile_model(graph, 'CPU', config), fp32)
        info['precision_hints'] = {}
        for hint in args.precision_hints:
            compiled = core.compile_model(graph, 'CPU', dict(config, INFERENCE_PRECISION_HINT=hint))
            # a hint the CPU cannot run (bf16/f16 without avx512_bf16/AMX/avx512_fp16) falls back to f32: not timed
            effective = compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name()
            info['precision_hints'][hint] = effective
            if effective != 'f32':
                encoders[f'openvino {hint}' + tag] = OpenVinoEncoder(compiled, fp32)
        encoders['openvino int8' + tag] = OpenVinoEncoder(core.compile_model(quantized, 'CPU', config), fp32)
        if args.profile:
            info['profile'] = {kind: profile(core.compile_model(model, 'CPU', dict(config, PERF_COUNT=True)),
                                             fp32, texts)
                               for kind, model in (('fp32', graph), ('int8', quantized))}
    result['loadavg_after_conversion'] = os.getloadavg()

    vectors = {}
    for name, encoder in encoders.items():  # warm-up (first-call allocations, kernel selection) and fidelity
        vectors[name] = encoder.encode_docs(texts)
    result['fidelity'] = {name: fidelity(vectors['torch fp32'], v) for name, v in vectors.items()}
    times = {name: [] for name in encoders}
    for _ in range(args.rounds):
        for name, encoder in encoders.items():
            start = time.perf_counter()
            encoder.encode_docs(texts)
            times[name].append(time.perf_counter() - start)
    result['speed'] = {name: {'rounds_s': t, 'docs_per_s': len(texts) / min(t),
                              'vs_torch_fp32': min(times['torch fp32']) / min(t),
                              'vs_torch_fp32_median': sorted(times['torch fp32'])[len(t) // 2] / sorted(t)[len(t) // 2]}
                       for name, t in times.items()}
    result['loadavg_after_speed'] = os.getloadavg()

    if args.effectiveness:
        best = max((name for name in encoders if name.startswith('openvino int8')),
                   key=lambda name: result['speed'][name]['docs_per_s'])
        result['effectiveness_variant'] = best
        models = {'fp32': fp32, 'int8': openvino_model(encoders[best])}
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(args.workdir or tmp)
            result['effectiveness'] = {name: effectiveness(name, collection, models, workdir)
                                       for name, collection in [('vaswani', vaswani),
                                                                ('cisi', load_collection(args.cisi))]}
        result['loadavg_after'] = os.getloadavg()
    result['seconds'] = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()
    write_json(args.output, result)

    print(f"{result['cpu']['model']}, torch {torch.__version__}, openvino {ov.__version__}, nncf {nncf.__version__}, "
          f"1 thread, load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'':34s}{'docs/s':>8s}{'x fp32':>8s}{'median x':>9s}{'cosine':>8s}{'top-10':>8s}{'terms':>7s}  rounds (s)")
    for name, s in result['speed'].items():
        f = result['fidelity'][name]
        print(f"{name:34s}{s['docs_per_s']:8.1f}{s['vs_torch_fp32']:8.2f}{s['vs_torch_fp32_median']:9.2f}"
              f"{f['cosine']:8.4f}{f['top10_overlap']:8.3f}{f['terms_vs_fp32']:7.3f}  "
              + ' '.join(f'{x:.1f}' for x in s['rounds_s']))
    for name, e in result.get('effectiveness', {}).items():
        n = e['ndcg@10']
        print(f"{name} nDCG@10: fp32 {n['docs fp32 / queries fp32']:.4f}, {result['effectiveness_variant']} "
              f"{n['docs int8 / queries int8']:.4f} ({e['vs_fp32']['int8']:.4f}); mixed: int8 docs/fp32 queries "
              f"{n['docs int8 / queries fp32']:.4f}, fp32 docs/int8 queries {n['docs fp32 / queries int8']:.4f}")
    print(f'wrote {args.output}')


if __name__ == '__main__':
    main()
