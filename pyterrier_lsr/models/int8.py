"""int8 CPU encoding: a dynamically quantized copy of a sparse model's torch module (``precision='int8'``).

Every ``nn.Linear`` of the copy but SPLADE's head transform (:func:`head_linears`) runs as an int8 matrix product
(fbgemm/oneDNN, through the same ``torch.ops.quantized.linear_dynamic`` kernels as
``torch.ao.quantization.quantize_dynamic``): weights are quantized once, symmetrically per output row;
activations are quantized **per token**: each token's vector is divided by its largest magnitude before the kernel
quantizes the call's input, and the product is multiplied back (it is linear; only the bias is added after), so
every token gets a grid of its own. The kernels alone quantize a call's whole input on one grid (a batch of texts,
padding included), which lost 1 % nDCG@10 on CISI's long queries (benchmarks/int8.py).
SPLADE's vocabulary projection (128 or 768 -> 30522, most of the cost of a small model) is not an ``nn.Linear`` call
but is fused with the max pooling (:func:`~pyterrier_lsr.models.pooling.max_pooled_logits`); here it runs in int8
over prepacked vocabulary slices, one text at a time, never over padding, its tokens quantized per token too; the
few terms it finds that can be non-zero are then computed again in fp32 (:class:`Int8MaxPool`).
Activations get 8 bits where the CPU's int8 kernels accumulate in int32 (VNNI), 7 elsewhere (:func:`reduce_range`).

The user's fp32 module is never modified: :class:`Int8Module` keeps it (for saving, settings, training) beside the
quantized copy that encodes. Chosen by measurement against ONNX Runtime's dynamic int8 (see ``benchmarks/int8.py``
and ``docs/int8.md``): it needs no new dependency and keeps the fused pooling.
"""
import contextlib
import copy
import warnings

import torch
from torch import nn

from .splade import SpladeModel

# Vocabulary rows per prepacked slice: 256 positions x 4096 logits = 4 MB of fp32 logits, a cache-sized tile
# (see pooling.CPU_CHUNK_ELEMENTS).
VOCAB_STEP = 4096


def packing_engine() -> str:
    """The quantized engine the weights are prepacked for; the product runs in that engine's kernels whatever
    ``torch.backends.quantized.engine`` says later. oneDNN's where the CPU has AMX: there its kernels are 1.4-2.3x
    fbgemm's in the projection and the Linear layers (benchmarks/int8.py); torch's default elsewhere, as measured on
    AVX2 and VNNI CPUs."""
    amx = getattr(torch.cpu, '_is_amx_tile_supported', lambda: False)()
    if amx and 'onednn' in torch.backends.quantized.supported_engines:
        return 'onednn'
    return torch.backends.quantized.engine


def reduce_range(engine: str) -> bool:
    """Whether the activations get 7 bits instead of 8 in ``engine``'s kernels. fbgemm's kernels without VNNI (AVX2)
    sum pairs of uint8 x int8 products in int16, which 8-bit activations can saturate: there they get 7 bits, as
    ``quantize_dynamic`` gives them on x86. With avx512_vnni (``vpdpbusd`` accumulates in int32; AMX CPUs have it too)
    nothing saturates, and the eighth bit halved SPLADE-tiny's int8 error on held-out text
    (``benchmarks/int8_activations.py``)."""
    return not (engine == 'onednn' or torch.cpu._is_vnni_supported())


@contextlib.contextmanager
def _engine(name: str):
    # The engine is a process-wide setting; it is switched only while packing, and put back.
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def pack(weight: torch.Tensor, bias=None):
    """``weight`` (out x in) quantized to int8 symmetrically per output row, prepacked for the int8 kernels of
    :func:`packing_engine`."""
    weight = weight.detach().float().contiguous()
    scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny).double()
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    # torch 2.13 deprecates quantized tensor creation in favour of torchao, which has no CPU int8 kernels for this;
    # the warning would fire once per layer at every int8 load and concerns torch's roadmap, not the user's code.
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='torch.quantize_per_tensor, torch.quantize_per_channel',
                                category=UserWarning)
        quantized = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
    with _engine(packing_engine()):
        return torch.ops.quantized.linear_prepack(quantized, None if bias is None else bias.detach().float())


def per_token(x: torch.Tensor):
    """``x`` with each last-axis vector divided by its largest magnitude (contiguous), and those magnitudes
    (``... x 1``): the int8 kernels then quantize every token on a grid of its own."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    return (x / scale).contiguous(), scale


class Int8Linear(nn.Module):
    """An ``nn.Linear`` as an int8 product (weights quantized once, activations per call)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = pack(linear.weight)
        self.reduce_range = reduce_range(packing_engine())
        bias = linear.bias
        self.register_buffer('bias', None if bias is None else bias.detach().float().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, scale = per_token(x.float())
        out = torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range).mul_(scale)
        return out if self.bias is None else out.add_(self.bias)

    def extra_repr(self) -> str:
        return f'in_features={self.in_features}, out_features={self.out_features}, int8'


# Logits within this distance below 0 in int8 are computed again in fp32 (see Int8MaxPool). On held-out text
# (600 documents and 300 queries of the packages corpus, SPLADE-tiny), no term positive in fp32 was below -0.2 in
# int8 (the int8 error of one logit near 0 stays under 0.1; of the largest, about 0.3), and 0.5 made the candidates
# 1.3-2x the positive terms: a fraction of a percent of the projection's work.
REFINE_MARGIN = 0.5


class Int8MaxPool(nn.Module):
    """``max_i (hidden_i · weight^T) + bias`` over each text's real positions (see the module docstring).

    The int8 product screens the vocabulary; the terms it finds above ``-REFINE_MARGIN`` (the few that can be
    non-zero after SPLADE's ``relu``: tens to hundreds of 30,522) are computed again in fp32 over the same positions.
    Their weights are then fp32's for the same hidden states, and rounding noise cannot make a spurious term: on
    held-out text this halved the distance of SPLADE-tiny's int8 vectors to fp32's (what remains is the backbone's
    int8 error) at a few percent of the encoding time (``benchmarks/int8_activations.py``).
    """

    def __init__(self, decoder: nn.Linear):
        super().__init__()
        weight = decoder.weight.detach()
        self.register_buffer('weight', weight.float(), persistent=False)
        self.vocab_size = weight.shape[0]
        self.starts = range(0, self.vocab_size, VOCAB_STEP)
        self.slices = [pack(weight[v0:v0 + VOCAB_STEP]) for v0 in self.starts]
        self.reduce_range = reduce_range(packing_engine())
        bias = decoder.bias
        self.register_buffer('bias', None if bias is None else bias.detach().float().clone(), persistent=False)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        valid = attention_mask.bool()
        pooled = torch.full((hidden.shape[0], self.vocab_size), float('-inf'))
        texts = [hidden[row, valid[row]].float() for row in range(hidden.shape[0])]
        for row, tokens in enumerate(texts):
            if not len(tokens):
                continue
            normed, scale = per_token(tokens)
            for part, v0 in zip(self.slices, self.starts):
                logits = torch.ops.quantized.linear_dynamic(normed, part, self.reduce_range).mul_(scale)
                torch.amax(logits, dim=0, out=pooled[row, v0:v0 + logits.shape[1]])
        if self.bias is not None:
            pooled += self.bias
        # the candidates of the whole batch found at once: per text, the calls' overhead outweighed their work
        rows, terms = (pooled > -REFINE_MARGIN).nonzero(as_tuple=True)
        exact = torch.empty(len(terms))
        start = 0
        for row, count in enumerate(torch.bincount(rows, minlength=len(texts)).tolist()):
            if count:
                part = terms[start:start + count]
                torch.amax(torch.mm(texts[row], self.weight.index_select(0, part).t()), dim=0,
                           out=exact[start:start + count])
                start += count
        pooled[rows, terms] = exact if self.bias is None else exact + self.bias[terms]
        return pooled


def quantize_linears(module: nn.Module, skip=()) -> None:
    """Replaces, in place, every ``nn.Linear`` of ``module`` but those in ``skip`` by an :class:`Int8Linear`."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and not any(child is s for s in skip):
            setattr(module, name, Int8Linear(child))
        else:
            quantize_linears(child, skip)


def head_linears(model: SpladeModel) -> list[nn.Linear]:
    """The Linear layers of SPLADE's head transform, which stay fp32: their output reaches every vocabulary logit,
    and the maximum over a text's positions turns its rounding noise into spurious terms. In SPLADE-tiny this one
    128 x 128 product, alone in int8, moved the vectors on held-out text twice as far from fp32's as the whole int8
    vocabulary projection, and added 0.8-0.9 % non-zero terms (``benchmarks/int8_activations.py``); it is one product
    per token beside the backbone's six per layer."""
    kind, name = model._head_layout
    head = model.mlm.vocab_transform if kind == 'distilbert' else model.mlm.get_submodule(name)
    return [m for m in head.modules() if isinstance(m, nn.Linear)]


# A SPLADE model's backbone (every Linear before the vocabulary projection) runs in int8 only where its products are
# at least this share of the model's multiply-adds per token. Below it, int8 there saves a few percent of the time and
# costs all of the int8 error that remains once the projection is refined: SPLADE-tiny's backbone is 9 % of its
# products, and in fp32 its int8 vectors became fp32's (cosine 1 - 1e-14, the same terms) at 1.77x fp32's documents
# per CPU-second instead of 1.89x on the same texts (benchmarks/int8_activations.py). BERT-base's is 78 %: int8 is
# its speed.
BACKBONE_SHARE = 0.25


def backbone_share(model: SpladeModel, skip) -> float:
    """The share of ``model``'s multiply-adds per token in its Linear layers outside ``skip`` (the projection and the
    head transform), against those plus the vocabulary projection's (attention's own products left out)."""
    backbone = sum(m.weight.numel() for m in model.modules()
                   if isinstance(m, nn.Linear) and not any(m is s for s in skip))
    projection = model.mlm.get_output_embeddings().weight.numel()
    return backbone / (backbone + projection)


class Int8Module(nn.Module):
    """A sparse model's module (``(input_ids, attention_mask)`` -> batch x terms) encoding through an int8 copy.

    ``float_module`` stays the model (``save_pretrained``, ``settings``, ``vocab_size``... are its own: attributes
    this wrapper lacks are looked up there); the copy is quantized once, here. CPU only. Training the float module
    afterwards does not update the copy: quantize again (build the model again with ``precision='int8'``).
    """

    def __init__(self, float_module: nn.Module):
        super().__init__()
        if any(p.device.type != 'cpu' for p in float_module.parameters()):
            raise ValueError('int8 encoding runs on CPU only: move the model to the CPU first')
        self.float_module = float_module
        quantized = copy.deepcopy(float_module).eval()
        self.pool = None
        self.int8_backbone = True
        skip = ()
        # SPLADE's fused projection reads the decoder's weight directly: it gets its own int8 pooling (max pooling
        # only; a sum-pooled model runs its own forward over int8 layers).
        if isinstance(quantized, SpladeModel) and quantized._head_layout is not None \
                and quantized.settings['pooling'] == 'max':
            decoder = quantized.mlm.get_output_embeddings()
            self.pool = Int8MaxPool(decoder)
            skip = (decoder, *head_linears(quantized))
            self.int8_backbone = backbone_share(quantized, skip) >= BACKBONE_SHARE
        if self.int8_backbone:
            quantize_linears(quantized, skip)
        self.quantized = quantized
        self.train(False)

    def train(self, mode: bool = True) -> 'Int8Module':
        """Stays in eval mode whatever ``mode`` asks, and leaves the float module's mode to its owner: the int8 copy
        only encodes. Left in training mode (``nn.Module``'s default), every encoding call switched it to eval and
        back, and with one model shared by several threads a call ending switched dropout back on under the other
        threads' forward passes."""
        self.training = False
        for part in (self.quantized, self.pool):
            if part is not None:
                part.train(False)
        return self

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ('_modules', 'float_module'):  # not yet set (copying, unpickling): no delegation
                raise
            return getattr(self.float_module, name)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pool is None:
            return self.quantized(input_ids, attention_mask)
        model = self.quantized
        return model.activate(self.pool(model.decoder_inputs(input_ids, attention_mask), attention_mask))
