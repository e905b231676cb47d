"""The batched encoding engine every model shares: texts -> ``{term: weight}`` dicts.

Texts are tokenized once, sorted by length and batched with dynamic padding, so a batch pads to its
own longest text only; results come back in input order.  Models are any ``nn.Module`` mapping
``(input_ids, attention_mask)`` to a batch x vocabulary tensor of non-negative weights.
"""

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from .checks import is_missing

# The autocast dtype of each precision.
PRECISIONS = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# Not an autocast: the module itself is quantized (pyterrier_lsr.models.int8), so only kinds that quantize accept it.
INT8 = 'int8'


def resolve_device(device=None, precision: str | None = None) -> torch.device:
    """The package's one device rule, for every encoder and trainer: ``device`` when given, else CUDA when present
    (the CPU for ``precision='int8'``, which runs on CPU only); tensors are then moved where the model is."""
    if device is None:
        device = 'cuda' if torch.cuda.is_available() and precision != INT8 else 'cpu'
    return torch.device(device)


def resolve_precision(precision: str | None, device: torch.device, int8: bool = False) -> str:
    """The encoders' precision: ``None`` means fp32 on CPU (exact) and mixed precision on CUDA (fast: bf16 autocast,
    fp16 where the GPU lacks bf16); ``'int8'`` (CPU only) where ``int8``. Trainers default to fp32 on any device
    (``TrainConfig.precision``); SAEs train in fp32."""
    if precision is None:
        if device.type != 'cuda':
            return 'fp32'
        return 'bf16' if torch.cuda.is_bf16_supported() else 'fp16'
    allowed = sorted(PRECISIONS) + ([INT8] if int8 else [])
    if precision not in allowed:
        raise ValueError(f'precision must be one of {allowed}, got {precision!r}')
    if precision == INT8 and device.type != 'cpu':
        raise ValueError(f"precision='int8' runs on CPU only, got device {str(device)!r}: use 'bf16' or 'fp16' there")
    return precision


def autocast(device: torch.device, precision: str):
    dtype = None if precision == INT8 else PRECISIONS[precision]
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def as_text(value, position: int | None = None) -> str:
    """A text to encode: missing values (see :func:`is_missing`) become ``''``; anything but a ``str`` (bytes, lists,
    numbers, ...) raises ``TypeError`` naming its position, since ``str(value)`` would encode ``"b'...'"``, ``"[...]"``
    or ``"<NA>"`` as if it were text. Bytes are refused rather than decoded: their encoding is the caller's to know.

    A lone surrogate code point (from bytes decoded with ``surrogateescape``, or half of a pair split apart) is no
    character the tokenizers can take: it becomes U+FFFD (the replacement character), and a pair written as two code
    points becomes its character, so one damaged text encodes like its readable rest instead of stopping a corpus."""
    if is_missing(value):
        return ''
    if not isinstance(value, str):
        where = '' if position is None else f' at position {position}'
        raise TypeError(f'text{where} is {type(value).__name__}, not str: {value!r:.60}')
    try:
        value.encode('utf-8')
    except UnicodeEncodeError:
        value = value.encode('utf-16', 'surrogatepass').decode('utf-16', 'replace')
    return value


def is_blank(text) -> bool:
    """Missing values and whitespace-only texts encode to an empty vector without running the model; non-``str``
    values raise ``TypeError`` (see :func:`as_text`)."""
    return not as_text(text).strip()


def as_texts(values, what: str) -> list[str]:
    """``values`` as texts (see :func:`as_text`): missing values are ``''``; bytes, lists and numbers are a
    ``TypeError`` naming ``what`` and the row rather than their ``repr`` encoded as text."""
    try:
        return [as_text(v, i) for i, v in enumerate(values)]
    except TypeError as ex:
        raise TypeError(f'{what}: {ex}') from None


def to_dicts(weights: torch.Tensor, terms: Sequence[str]) -> list[dict[str, float]]:
    """Rows of a (batch x vocab) tensor to ``{term: weight}`` dicts of the non-zero entries."""
    weights = weights.float().cpu()
    rows, cols = weights.nonzero(as_tuple=True)
    values = weights[rows, cols].tolist()
    counts = torch.bincount(rows, minlength=weights.shape[0]).tolist()
    cols = cols.tolist()
    out, start = [], 0
    for count in counts:
        out.append({terms[c]: v for c, v in zip(cols[start : start + count], values[start : start + count])})
        start += count
    return out


class Batch(NamedTuple):
    positions: list[int]  # indices into the texts given to :func:`length_sorted_batches`
    input_ids: torch.Tensor  # padded to the batch's longest text
    attention_mask: torch.Tensor
    encodings: list  # the fast tokenizer's encodings of these texts (offsets, word ids), or []


def length_sorted_batches(
    tokenizer,
    texts: Sequence,
    batch_size: int,
    max_length: int,
    device=None,
    verbose: bool = False,
    desc: str = 'encoding',
) -> Iterator[Batch]:
    """The one batching engine: tokenizes the non-blank ``texts`` once (truncated to ``max_length`` tokens, special
    tokens included), sorts them longest first and yields padded batches. Blank texts (see :func:`is_blank`) and texts
    of special tokens only are skipped, so callers give them their empty result; non-``str`` texts raise
    ``TypeError`` (see :func:`as_text`). The progress bar counts texts."""
    if batch_size < 1:
        raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    device = resolve_device(device)
    todo = [i for i, text in enumerate(texts) if as_text(text, i).strip()]
    if not todo:
        return
    encoded = tokenizer(
        [as_text(texts[i], i) for i in todo], truncation=True, max_length=max_length, return_attention_mask=False
    )
    # [UNK] stands for real text; a text of [CLS]/[SEP]/... only (e.g. control characters) has no content, like ''.
    structural = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    keep = [j for j, ids in enumerate(encoded['input_ids']) if not structural.issuperset(ids)]
    todo, input_ids = [todo[j] for j in keep], [encoded['input_ids'][j] for j in keep]
    encodings = [encoded.encodings[j] for j in keep] if tokenizer.is_fast else None
    order = sorted(range(len(todo)), key=lambda j: len(input_ids[j]), reverse=True)
    with tqdm(total=len(order), desc=desc, unit='text', disable=not verbose) as pbar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            padded = tokenizer.pad({'input_ids': [input_ids[j] for j in batch]}, return_tensors='pt')
            yield Batch(
                [todo[j] for j in batch],
                padded['input_ids'].to(device),
                padded['attention_mask'].to(device),
                [encodings[j] for j in batch] if encodings is not None else [],
            )
            pbar.update(len(batch))


def encode_texts(
    model: torch.nn.Module,
    tokenizer,
    texts: Sequence,
    terms: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int = 256,
    device=None,
    precision: str = 'fp32',
    verbose: bool = False,
    desc: str = 'encoding',
) -> list[dict[str, float]]:
    """Encodes ``texts`` with ``model`` into ``{term: weight}`` dicts, in input order.

    Texts longer than ``max_length`` tokens (special tokens included) are truncated. Missing, blank and texts that
    tokenize to special tokens only (e.g. control characters) give ``{}`` without running the model; non-``str``
    texts raise ``TypeError`` and non-finite model outputs ``ValueError``, each naming the text's position.
    """
    if isinstance(texts, (str, bytes)):  # iterated, it would be one text a character
        raise TypeError(f'texts: a list of strings, not one {type(texts).__name__} (wrap it: [text])')
    device = resolve_device(device)
    texts = [as_text(text, i) for i, text in enumerate(texts)]
    results: list[dict[str, float]] = [{} for _ in texts]
    was_training = model.training
    if was_training:  # toggling every submodule costs ~1 ms, noticeable when encoding one query at a time
        model.eval()
    try:
        with torch.inference_mode(), autocast(device, precision):
            for batch in length_sorted_batches(tokenizer, texts, batch_size, max_length, device, verbose, desc):
                weights = model(batch.input_ids, batch.attention_mask)
                finite = torch.isfinite(weights).all(dim=1)
                if not finite.all():
                    bad = sorted(batch.positions[r] for r in (~finite).nonzero()[:, 0].tolist())
                    raise ValueError(
                        f'the model produced non-finite weights (inf/NaN) for the texts at positions {bad}'
                    )
                for i, vec in zip(batch.positions, to_dicts(weights, terms)):
                    results[i] = vec
    finally:
        if was_training:
            model.train()
    return results


def vocabulary_terms(tokenizer, size: int = 0) -> list[str]:
    """Term strings indexed by token id, ``size`` at least (ids without a token get a placeholder name)."""
    size = max(size, len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    terms = [f'[unused_id_{i}]' for i in range(size)]
    for token, idx in tokenizer.get_vocab().items():
        terms[idx] = token
    return terms
