"""ONNX export of a SPLADE model with its pooling inside: one graph from token ids to the pooled vocabulary weights.

sentence-transformers' and optimum's exports stop at the MLM logits (``batch x length x vocabulary``), which leaves
the max over the attention mask, ``log(1 + relu)``, the head scale and the special tokens to every consumer.  The
graph written here computes all of it, so OpenSearch, Vespa, FastEmbed or onnxruntime users get the vectors
:class:`~pyterrier_lsr.models.splade.SpladeModel` gives, from the tokenizer's outputs alone.  The folder layout and the
configuration are read back by :class:`~pyterrier_lsr.core.onnx_runtime.OnnxSparseModule` (``docs/onnx.md``
documents both).
"""
import contextlib
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from ..core import onnx_runtime as rt
from ..core import storage
from ..core.checks import check_choice, check_int
from ..core.extras import require_extra
from .splade import SpladeModel

__all__ = ['PooledSplade', 'export_onnx', 'DEFAULT_OPSET', 'COMPUTATION']

# Opset 17 (onnxruntime >= 1.13) is what OpenSearch's, Vespa's and FastEmbed's onnxruntime builds all run; 14 is the
# lowest the exporter writes these operators in, 20 the highest the TorchScript exporter writes.
DEFAULT_OPSET = 17
OPSETS = range(14, 21)
# The largest difference between the graph's weights and the torch module's allowed when the export checks itself.
TOLERANCE = 1e-4
COMPUTATION = ('weights[b, v] = log(1 + relu((max over positions i with attention_mask[b, i] = 1 of '
               'logits[b, i, v]) / head_scale)), 0 for the special tokens; logits: the masked LM head '
               '(transform, then the vocabulary projection and its bias)')


class PooledSplade(nn.Module):
    """:class:`SpladeModel`'s computation in operators an ONNX graph can hold (no tiling loops, no in-place fills):
    ``(input_ids, attention_mask[, token_type_ids])`` to ``batch x vocabulary`` weights.

    The logits are computed whole (``batch x length x vocabulary``: the graph has no loops to tile them); padding
    positions take the hidden state of their text's first real token, which leaves each maximum unchanged without a
    masked copy of the logits, and the bias is added after the maximum (it is constant over positions), as
    :func:`~pyterrier_lsr.models.pooling.max_pooled_logits` does.
    """

    def __init__(self, model: SpladeModel, token_type_ids: bool):
        super().__init__()
        self.model = model
        self.token_type_ids = token_type_ids
        keep = torch.ones(model.vocab_size)
        keep[model.special_token_ids.cpu()] = 0.0
        self.register_buffer('keep', keep, persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        model, valid = self.model, attention_mask > 0
        extra = {'token_type_ids': token_type_ids} if self.token_type_ids else {}
        if model.has_split_head:
            hidden = model.decoder_inputs(input_ids, attention_mask, **extra)
            first = valid.int().argmax(dim=1)
            stand_in = torch.gather(hidden, 1, first[:, None, None].expand(-1, 1, hidden.shape[-1]))
            hidden = torch.where(valid[..., None], hidden, stand_in)
            decoder = model.mlm.get_output_embeddings()
            pooled = torch.matmul(hidden, decoder.weight.t()).amax(dim=1)
            if decoder.bias is not None:
                pooled = pooled + decoder.bias
        else:
            logits = model.mlm(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
            pooled = torch.where(valid[..., None], logits, torch.finfo(logits.dtype).min).amax(dim=1)
        # log(1 + x) rather than log1p: ONNX has no Log1p operator; the two differ by float rounding only
        return torch.log(1.0 + torch.relu(pooled / float(model.settings['head_scale']))) * self.keep


@contextlib.contextmanager
def _quiet_export():
    """The TorchScript exporter's deprecation notice and tracer warnings (transformers' shape checks, which are
    constant for an encoder) and onnxruntime's quantizer's advice would reach the user on every export."""
    root = logging.getLogger()
    level = root.level
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        root.setLevel(max(level, logging.ERROR))
        try:
            yield
        finally:
            root.setLevel(level)


def _example(tokenizer, texts, max_length: int, names) -> dict:
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors='pt')
    return {name: batch[name] if name in batch else torch.zeros_like(batch['input_ids']) for name in names}


def _max_diff(session, module: PooledSplade, feeds: dict) -> float:
    got = session.run([rt.OUTPUT], {k: v.numpy() for k, v in feeds.items()})[0]
    with torch.inference_mode():
        want = module(*feeds.values())
    return float((torch.from_numpy(got) - want).abs().max())


def _config(model: SpladeModel, tokenizer, names, max_length, precision, opset, source, kind) -> dict:
    import onnx

    rt.import_onnxruntime()
    from onnxruntime import __version__ as ort_version
    mlm_config = model.mlm.config
    shape = ['batch', 'length']
    return {
        'format': rt.FORMAT, 'format_version': rt.FORMAT_VERSION, 'model_file': rt.ONNX_FILE,
        'inputs': [{'name': name, 'dtype': 'int64', 'shape': shape} for name in names],
        'outputs': [{'name': rt.OUTPUT, 'dtype': 'float32', 'shape': ['batch', 'vocabulary']}],
        'vocab_size': model.vocab_size,
        'computation': COMPUTATION,
        'pooling': 'max', 'activation': 'log(1 + relu(x))',
        'head_scale': float(model.settings['head_scale']),
        'special_token_ids': model.special_token_ids.tolist(),
        'max_length': max_length,
        'tokenizer': {'class': type(tokenizer).__name__, 'lowercase': bool(getattr(tokenizer, 'do_lower_case', False)),
                      'truncation': 'longest_first', 'special_tokens': 'added (tokenizer default)'},
        'opset': opset,
        'precision': precision,
        'quantization': None if precision == 'fp32' else {
            'method': 'onnxruntime.quantization.quantize_dynamic', 'weight_type': 'QInt8', 'per_channel': False,
            'activations': 'uint8, one scale per tensor, computed at run time'},
        # a SPLADE graph encodes both sides; the other masked-LM kinds have their own query side
        'encodes': 'documents and queries' if kind == 'splade' else 'documents',
        'source': {'model': source, 'kind': kind, 'model_type': getattr(mlm_config, 'model_type', None),
                   'architecture': type(model.mlm).__name__, 'lsr': dict(model.settings)},
        'exporter': {'torch': torch.__version__, 'onnx': onnx.__version__, 'onnxruntime': ort_version},
    }


def export_onnx(model: SpladeModel, tokenizer, folder, max_length: int, precision: str = 'fp32',
                opset: int = DEFAULT_OPSET, source: str | None = None, kind: str = 'splade',
                artifact: str = 'model', overwrite: bool = True) -> Path:
    """Writes ``folder``: ``model.onnx`` (``model``'s pooled weights as one graph), the tokenizer's files and
    ``onnx_config.json`` (what the graph computes).  The folder is built beside and swapped in; it replaces only a
    model folder of ours.  The fp32 graph is checked against ``model`` on a padded batch before anything is written.

    Args:
        model: the :class:`SpladeModel` to export (left unchanged).
        tokenizer: its tokenizer.
        folder: where to write the model folder.
        max_length: the truncation the model encodes with, recorded for consumers.
        precision: ``'fp32'``, or ``'int8'`` for onnxruntime's dynamic int8 quantization of the graph's weights
            (their matrix products then run in int8, activations quantized at run time).
        opset: the ONNX opset, 14 to 20.
        source: the source model's name, recorded.
        kind: the model kind whose document encoder this is, recorded.
        artifact: the artifact type the folder is marked with.
        overwrite: replace an existing model folder of ours at ``folder``.

    Returns:
        ``folder``.

    Raises:
        TypeError: ``model`` is not a :class:`SpladeModel`.
        ValueError: ``precision`` or ``opset`` not allowed (naming it), or ``folder`` not replaceable.
        ImportError: onnx or onnxruntime is not installed (the ``onnx`` extra).
        RuntimeError: the exported graph's weights differ from ``model``'s by more than 1e-4.
    """
    if not isinstance(model, SpladeModel):
        raise TypeError(f'export_onnx exports a SpladeModel (a masked LM max-pooled over its vocabulary), got '
                        f'{type(model).__name__}')
    precision = check_choice('precision', precision, rt.PRECISIONS)
    opset = check_int('opset', opset, OPSETS.start, OPSETS.stop - 1)
    max_length = check_int('max_length', max_length, 3)
    ort = rt.import_onnxruntime()
    require_extra('onnx', 'onnx', needed_for='export_onnx')  # the exporter writes through it
    names = [name for name in rt.INPUTS if name != 'token_type_ids' or (
        name in getattr(tokenizer, 'model_input_names', ()) and getattr(model.mlm.config, 'type_vocab_size', 0))]
    device = next(model.parameters()).device
    was_training = model.training  # eval() on the wrapper sets it on the model: put back below
    module = PooledSplade(model, 'token_type_ids' in names).eval()
    # padded batches, so the traced graph keeps the attention mask's path
    example = _example(tokenizer, ['a short text', 'a longer text: ' + 'radio waves and signals ' * 8], max_length,
                       names)
    check = _example(tokenizer, ['x', 'Compact memories with flexible capacities. ' * 80, 'more text to encode'],
                     max_length, names)
    try:
        with storage.build_folder(folder, artifact, overwrite=overwrite, what='model folder') as tmp, \
                _quiet_export(), torch.no_grad():
            if device.type != 'cpu':
                module = PooledSplade(_cpu_copy(model), 'token_type_ids' in names).eval()
            fp32_file = tmp / (rt.ONNX_FILE if precision == 'fp32' else 'model.fp32.onnx')
            torch.onnx.export(module, tuple(example.values()), str(fp32_file), dynamo=False,
                              input_names=names, output_names=[rt.OUTPUT], opset_version=opset,
                              dynamic_axes={**{n: {0: 'batch', 1: 'length'} for n in names}, rt.OUTPUT: {0: 'batch'}},
                              do_constant_folding=True)
            session = ort.InferenceSession(str(fp32_file), providers=['CPUExecutionProvider'])
            diff = _max_diff(session, module, check)
            if not diff <= TOLERANCE:
                raise RuntimeError(f'the exported graph gives weights {diff:.3g} away from the torch model\'s '
                                   f'(allowed {TOLERANCE}): {type(model.mlm).__name__} does not export faithfully')
            if precision == 'int8':
                from onnxruntime.quantization import QuantType, quantize_dynamic
                quantize_dynamic(fp32_file, tmp / rt.ONNX_FILE, weight_type=QuantType.QInt8)
                fp32_file.unlink()
            tokenizer.save_pretrained(str(tmp))
            config = _config(model, tokenizer, names, max_length, precision, opset, source, kind)
            storage.write_json(tmp / rt.CONFIG_FILE, config, indent=2)
            rt.OnnxSparseModule(tmp, threads=1)  # the folder reads back
    finally:
        if was_training:
            model.train()
    return Path(folder)


def _cpu_copy(model: SpladeModel) -> SpladeModel:
    import copy
    return copy.deepcopy(model).float().cpu()
