"""Vocabulary Transfer (VT-SPLADE, seed: "Why advanced encoders lag on sparse retrieval"): move a masked LM to a
normalized (lowercased, accent-free, marker-free) vocabulary before SPLADE training.

Modern tokenizers are cased and byte-level, so one word has many surface forms (``ĠHello``, ``Hello``, ``Ġhello``)
and a sparse lexical representation spends its terms on them. :func:`transfer_vocabulary` re-initializes a masked LM's
embeddings (and output bias) for a target vocabulary:

* tokens whose normalized surface form exists in the source vocabulary copy its embedding and bias (several source
  forms: the already-normalized one if present, otherwise their average);
* every other target token ("composed") gets sparsemax weights over the copied tokens, from cosine similarities in an
  embedding space where both are defined (default: the source model's mean input embedding of the token's
  decomposition by the source tokenizer), and the weighted sum of their embeddings and biases; composed embeddings are
  rescaled to the source embeddings' mean norm and composed biases z-score-mapped onto the source bias statistics;
* tokens with no decomposition fall back to the mean source embedding and bias.

The decoder is tied to the new input embeddings; the rest of the MLM head is kept. Target vocabularies:
any normalized tokenizer (e.g. bert-base-uncased's WordPiece), or one made by :mod:`.vocabularies` from a corpus.
"""
import copy
import inspect
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

import torch
from torch import nn

from .splade import CONFIG_KEY, SpladeModel

STYLES = ('wordpiece', 'bpe', 'sentencepiece')
# Special-token roles and the role standing in for each when a tokenizer lacks it (BERT has no bos/eos, RoBERTa
# calls its cls <s> = bos and its sep </s> = eos).
ROLES = {'cls': 'bos', 'sep': 'eos', 'pad': None, 'mask': None, 'unk': None, 'bos': 'cls', 'eos': 'sep'}
Embedder = Callable[[Sequence[str]], torch.Tensor]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies (``Ġ`` is the space byte)."""
    bs = list(range(ord('!'), ord('~') + 1)) + list(range(ord('¡'), ord('¬') + 1)) + list(range(ord('®'), ord('ÿ') + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_OF_CHAR = {c: b for b, c in _bytes_to_unicode().items()}


def sparsemax(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax (Martins & Astudillo, 2016): the Euclidean projection of ``z`` onto the probability simplex.

    Like softmax it sums to 1 along ``dim``, but entries below a data-dependent threshold are exactly 0.
    """
    z = z.transpose(dim, -1)
    sorted_z, _ = torch.sort(z, dim=-1, descending=True)
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    cumsum = sorted_z.cumsum(-1)
    support = (1 + k * sorted_z) > cumsum
    k_z = support.sum(-1, keepdim=True)
    tau = (cumsum.gather(-1, k_z - 1) - 1) / k_z.to(z.dtype)
    return torch.clamp(z - tau, min=0).transpose(dim, -1)


def tokenizer_style(tokenizer) -> str:
    """``wordpiece`` (``##`` continuations), ``bpe`` (byte-level, ``Ġ`` word starts) or ``sentencepiece`` (``▁``),
    by whichever marker most vocabulary entries carry."""
    counts = Counter()
    for token in tokenizer.get_vocab():
        for style, marker in (('wordpiece', '##'), ('bpe', 'Ġ'), ('sentencepiece', '▁')):
            counts[style] += token.startswith(marker)
    return counts.most_common(1)[0][0] if counts and counts.most_common(1)[0][1] else 'wordpiece'


def normalize_text(text: str) -> str:
    """Lowercase, accents stripped (NFD without combining marks), as uncased WordPiece normalizes."""
    return ''.join(c for c in unicodedata.normalize('NFD', text) if unicodedata.category(c) != 'Mn').lower()


def _surface(token: str, style: str) -> tuple[str, bool] | None:
    """``(text, starts_word)`` of a vocabulary entry with its style's markers removed (not yet normalized)."""
    if style not in STYLES:
        raise ValueError(f'style must be one of {STYLES}, got {style!r}')
    if style == 'wordpiece':
        start = not token.startswith('##')
        body = token if start else token[2:]
    else:
        marker = 'Ġ' if style == 'bpe' else '▁'
        start = token.startswith(marker)
        body = token[1:] if start else token
        if style == 'bpe' and all(c in _BYTE_OF_CHAR for c in body):
            try:  # byte-level: each character stands for one byte of UTF-8
                body = bytes(_BYTE_OF_CHAR[c] for c in body).decode('utf-8')
            except UnicodeDecodeError:
                return None  # part of a multi-byte character: no surface form of its own
    body = body.strip()
    return (body, start) if body else None


def normalize_token(token: str, style: str) -> tuple[str, bool] | None:
    """The normalized surface form of a vocabulary entry and whether it starts a word, or None (no text of its own).

    ``normalize_token('ĠCafé', 'bpe') == normalize_token('café', 'wordpiece') == ('cafe', True)``;
    ``normalize_token('##ing', 'wordpiece') == normalize_token('ing', 'bpe') == normalize_token('ing', 'sentencepiece')
    == ('ing', False)``. Byte-level BPE entries are decoded from bytes first.
    """
    surface = _surface(token, style)
    if surface is None:
        return None
    text = normalize_text(surface[0])
    return (text, surface[1]) if text else None


def find_overlap(source_tokenizer, target_tokenizer, merge: str = 'exact') -> dict[int, list[int]]:
    """Maps each non-special target token id to the source token ids with the same normalized surface form.

    ``merge='exact'``: when one of those source forms is already normalized (``Ġhello`` for ``hello``), only that
    one is kept; otherwise all forms are kept (and averaged). ``merge='mean'``: always all forms.
    """
    if merge not in ('exact', 'mean'):
        raise ValueError(f"merge must be 'exact' or 'mean', got {merge!r}")
    source_style, target_style = tokenizer_style(source_tokenizer), tokenizer_style(target_tokenizer)
    source_special, target_special = set(source_tokenizer.all_special_ids), set(target_tokenizer.all_special_ids)
    forms: dict[tuple[str, bool], list[tuple[int, bool]]] = {}
    for token, i in sorted(source_tokenizer.get_vocab().items(), key=lambda item: item[1]):
        key = None if i in source_special else normalize_token(token, source_style)
        if key is not None:
            forms.setdefault(key, []).append((i, _surface(token, source_style)[0] == key[0]))
    overlap = {}
    for token, i in target_tokenizer.get_vocab().items():
        key = None if i in target_special else normalize_token(token, target_style)
        if key in forms:
            exact = [j for j, is_exact in forms[key] if is_exact]
            overlap[i] = exact[:1] if merge == 'exact' and exact else [j for j, _ in forms[key]]
    return overlap


def decomposition_embedder(model: nn.Module, tokenizer) -> Embedder:
    """An embedding space for words: the mean input embedding of a text's tokens under ``tokenizer`` (no special
    tokens). A text with no tokens embeds as a zero vector. ``model`` is any HF model (or :class:`SpladeModel`)."""
    model = getattr(model, 'mlm', model)
    weight = model.get_input_embeddings().weight.detach()

    def embed(texts: Sequence[str]) -> torch.Tensor:
        ids = tokenizer(list(texts), add_special_tokens=False)['input_ids']
        flat = torch.tensor([i for row in ids for i in row], dtype=torch.long)
        offsets = torch.tensor([0] + [len(row) for row in ids[:-1]], dtype=torch.long).cumsum(0)
        return nn.functional.embedding_bag(flat, weight.float(), offsets, mode='mean')
    return embed


def tokenizer_size(tokenizer) -> int:
    """Rows a model needs for this tokenizer: its largest id + 1 (a vocabulary may have holes)."""
    return max(tokenizer.get_vocab().values()) + 1


def _special_map(source_tokenizer, target_tokenizer) -> dict[int, int]:
    """Target special token id -> the source special token id of the same role (cls/bos, sep/eos, pad, mask, unk)."""
    out = {}
    for role, alternative in ROLES.items():
        target = getattr(target_tokenizer, f'{role}_token_id', None)
        source = getattr(source_tokenizer, f'{role}_token_id', None)
        if source is None and alternative is not None:
            source = getattr(source_tokenizer, f'{alternative}_token_id', None)
        if target is not None and source is not None:
            out.setdefault(target, source)
    return out


def _compose(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, temperature: float, chunk: int = 1024
             ) -> tuple[torch.Tensor, int]:
    """For each query row, sparsemax weights over the key rows (cosine / temperature) applied to ``values``; also
    returns the total number of non-zero weights."""
    keys = nn.functional.normalize(keys, dim=1)
    out, support = [], 0
    for start in range(0, len(query), chunk):
        weights = sparsemax(nn.functional.normalize(query[start:start + chunk], dim=1) @ keys.T / temperature, dim=1)
        out.append(weights @ values)
        support += int((weights > 0).sum())
    return torch.cat(out), support


def _word(token: str, style: str) -> str | None:
    """How a target token appears in running text, for embedding it: word starts get a leading space."""
    key = normalize_token(token, style)
    return None if key is None else (' ' + key[0] if key[1] else key[0])


def _shift_padding_positions(mlm: nn.Module, old_pad: int, new_pad: int):
    """RoBERTa-style embeddings number positions from ``padding_idx + 1``: when the pad id changes, shift the position
    table so every real token keeps the position vector it was trained with (and reloads from config identically)."""
    for module in mlm.modules():
        if hasattr(module, 'create_position_ids_from_input_ids') and hasattr(module, 'position_embeddings'):
            table = module.position_embeddings.weight
            delta = new_pad - old_pad
            old = table.detach().clone()
            if delta < 0:
                table.data[:delta] = old[-delta:]
            elif delta > 0:
                table.data[delta:] = old[:-delta]
            module.padding_idx = new_pad
            module.position_embeddings.padding_idx = new_pad


def _model_tokenizer(target_tokenizer, mlm: nn.Module, source_tokenizer):
    """A copy of the target tokenizer fit for the model: no ``token_type_ids`` unless the model takes two segment
    types, and no longer inputs than the source tokenizer allowed (position embeddings)."""
    takes_types = ('token_type_ids' in inspect.signature(mlm.forward).parameters
                   and getattr(mlm.config, 'type_vocab_size', 0) >= 2)
    names = [n for n in target_tokenizer.model_input_names if takes_types or n != 'token_type_ids']
    return type(target_tokenizer)(tokenizer_object=copy.deepcopy(target_tokenizer.backend_tokenizer),
                                  model_input_names=names, **target_tokenizer.special_tokens_map,
                                  model_max_length=min(target_tokenizer.model_max_length,
                                                       source_tokenizer.model_max_length))


@torch.no_grad()
def transfer_vocabulary(model: nn.Module, source_tokenizer, target_tokenizer, embedder: Embedder | None = None,
                        composition: str = 'sparsemax', temperature: float = 0.05, merge: str = 'exact'
                        ) -> tuple[SpladeModel, object, dict[str, float]]:
    """Moves a masked LM (or :class:`SpladeModel`) from ``source_tokenizer``'s vocabulary to ``target_tokenizer``'s.

    Args:
        model: a BERT-, RoBERTa- or ModernBERT-style ``*ForMaskedLM`` (any HF masked LM whose decoder can be tied to
            its input embeddings), or a :class:`SpladeModel` around one; it is not modified.
        embedder: maps texts (target tokens as they appear in running text) to vectors; the space where composed
            tokens find their similar copied tokens. Default: :func:`decomposition_embedder` of the source model and
            tokenizer; pass ``decomposition_embedder(other_model, other_tokenizer)`` to use another model's.
        composition: ``'sparsemax'`` (semantic initialization) or ``'mean'`` (every non-copied token starts at the
            mean source embedding and bias, the simple domain-extension initialization).
        temperature: cosine similarities are divided by it before sparsemax; smaller = fewer tokens per composition
            (our default 0.05 gives a handful; the report's ``support_mean`` says how many).
        merge: how several source forms of one normalized token combine (see :func:`find_overlap`).

    Returns the SPLADE model (decoder tied to the new embeddings, config updated with the target vocabulary size and
    special-token ids, so ``save_pretrained`` folders reload with ``Splade.from_pretrained``), the tokenizer to use
    with it, and a report: how many target tokens were ``special``-mapped, ``copied``, ``averaged`` (several source
    forms), ``composed`` or left at ``fallback``, the mean sparsemax support and the norm rescaling factor.
    """
    if composition not in ('sparsemax', 'mean'):
        raise ValueError(f"composition must be 'sparsemax' or 'mean', got {composition!r}")
    if not temperature > 0:
        raise ValueError(f'temperature must be > 0, got {temperature}')
    mlm = copy.deepcopy(getattr(model, 'mlm', model))
    source_weight, source_bias = _source_rows(mlm, source_tokenizer)
    weight, bias, kind = _copied_rows(source_weight, source_bias, source_tokenizer, target_tokenizer, merge)
    report = {'source_vocab_size': len(source_weight), 'target_vocab_size': len(weight),
              'source_style': tokenizer_style(source_tokenizer), 'target_style': tokenizer_style(target_tokenizer),
              'composition': composition, 'temperature': temperature, 'support_mean': 0., 'norm_scale': 1.}
    if composition == 'sparsemax':
        _semantic_init(weight, bias, kind, source_weight, source_bias, target_tokenizer, report,
                       embedder or decomposition_embedder(mlm, source_tokenizer), temperature)
    report.update({k: kind.count(k) for k in ('special', 'copied', 'averaged', 'composed', 'fallback')})
    _install_rows(mlm, weight, bias, target_tokenizer, report)
    tokenizer = _model_tokenizer(target_tokenizer, mlm, source_tokenizer)
    return SpladeModel(mlm, tokenizer.all_special_ids), tokenizer, report


def _source_rows(mlm: nn.Module, source_tokenizer) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The source input embeddings and output bias (float copies), checked against the source tokenizer."""
    source_weight = mlm.get_input_embeddings().weight.detach().float().clone()
    decoder = mlm.get_output_embeddings()
    if decoder is None:
        raise ValueError(f'{type(mlm).__name__} has no output embeddings (not a masked LM?)')
    source_bias = None if decoder.bias is None else decoder.bias.detach().float().clone()
    if tokenizer_size(source_tokenizer) > len(source_weight):
        raise ValueError(f'source tokenizer has ids up to {tokenizer_size(source_tokenizer) - 1} but the model only '
                         f'{len(source_weight)} embeddings: is it the model\'s own tokenizer?')
    return source_weight, source_bias


def _copied_rows(source_weight, source_bias, source_tokenizer, target_tokenizer, merge: str):
    """The target rows every token starts from (the mean source row, ``fallback``), with the special tokens and the
    tokens found in the source vocabulary (``copied``, or ``averaged`` over several source forms) filled in."""
    size = tokenizer_size(target_tokenizer)
    weight = source_weight.mean(0).repeat(size, 1)
    bias = None if source_bias is None else source_bias.mean().repeat(size)
    kind = ['fallback'] * size
    for target, source in _special_map(source_tokenizer, target_tokenizer).items():
        weight[target] = source_weight[source]
        if bias is not None:
            bias[target] = source_bias[source]
        kind[target] = 'special'
    overlap = find_overlap(source_tokenizer, target_tokenizer, merge)
    copied = [(target, sources[0]) for target, sources in overlap.items() if len(sources) == 1]
    if copied:  # most tokens: one indexed copy instead of a Python loop over the vocabulary
        targets, sources = (list(ids) for ids in zip(*copied))
        weight[targets] = source_weight[sources]
        if bias is not None:
            bias[targets] = source_bias[sources]
        for target in targets:
            kind[target] = 'copied'
    for target, sources in overlap.items():
        if len(sources) > 1:
            weight[target] = source_weight[sources].mean(0)
            if bias is not None:
                bias[target] = source_bias[sources].mean()
            kind[target] = 'averaged'
    return weight, bias, kind


def _install_rows(mlm: nn.Module, weight: torch.Tensor, bias, target_tokenizer, report: dict):
    """Resizes ``mlm`` to the target vocabulary, ties its decoder to the new embeddings and records the transfer in
    its config."""
    old_pad = mlm.config.pad_token_id
    mlm.resize_token_embeddings(len(weight), mean_resizing=False)
    embeddings = mlm.get_input_embeddings()
    embeddings.weight.data = weight.to(embeddings.weight.dtype)
    mlm.config.tie_word_embeddings = True
    mlm.get_output_embeddings().weight = embeddings.weight
    if bias is not None:
        mlm.get_output_embeddings().bias.data = bias.to(embeddings.weight.dtype)
    _set_special_ids(mlm, target_tokenizer, old_pad)
    settings = dict(getattr(mlm.config, CONFIG_KEY, None) or {})
    settings['vocab_transfer'] = {k: report[k]
                                  for k in ('source_vocab_size', 'copied', 'averaged', 'composed', 'fallback')}
    setattr(mlm.config, CONFIG_KEY, settings)


def _semantic_init(weight, bias, kind, source_weight, source_bias, target_tokenizer, report, embed: Embedder,
                   temperature: float):
    """Sparsemax composition of the non-copied target tokens over the copied ones (in place), then norm and bias
    matching."""
    style, special = report['target_style'], set(target_tokenizer.all_special_ids)
    words = {i: _word(t, style) for t, i in target_tokenizer.get_vocab().items()
             if kind[i] == 'fallback' and i not in special}
    anchors = [i for i, k in enumerate(kind) if k in ('copied', 'averaged')]
    todo = [i for i, w in words.items() if w is not None]
    if not anchors or not todo:
        return
    tokens = target_tokenizer.convert_ids_to_tokens(anchors)
    anchor_vectors = embed([_word(t, style) for t in tokens])
    vectors = embed([words[i] for i in todo])
    has_vector = vectors.norm(dim=1) > 0
    todo = [i for i, ok in zip(todo, has_vector.tolist()) if ok]
    if not todo:
        return
    values = weight[anchors] if bias is None else torch.cat([weight[anchors], bias[anchors, None]], dim=1)
    mixed, support = _compose(vectors[has_vector], anchor_vectors, values, temperature)
    composed = mixed[:, :weight.shape[1]]
    scale = source_weight.norm(dim=1).mean() / composed.norm(dim=1).mean().clamp_min(1e-12)
    weight[todo] = composed * scale
    if bias is not None:
        mixed_bias = mixed[:, -1]
        z = (mixed_bias - mixed_bias.mean()) / mixed_bias.std().clamp_min(1e-12) if len(todo) > 1 else mixed_bias * 0
        bias[todo] = z * source_bias.std() + source_bias.mean()
    for i in todo:
        kind[i] = 'composed'
    report.update(support_mean=support / len(todo), norm_scale=scale.item())


def _set_special_ids(mlm: nn.Module, tokenizer, old_pad: int | None):
    """Points the config's special-token ids (and padding indices) at the target tokenizer's."""
    config = mlm.config
    for role, alternative in ROLES.items():
        name = f'{role}_token_id'
        value = getattr(tokenizer, name, None)
        if value is None and alternative is not None:
            value = getattr(tokenizer, f'{alternative}_token_id', None)
        if role == 'pad' or getattr(config, name, None) is not None:
            setattr(config, name, value)
    new_pad = tokenizer.pad_token_id
    mlm.get_input_embeddings().padding_idx = new_pad
    if old_pad is not None and new_pad is not None and old_pad != new_pad:
        _shift_padding_positions(mlm, old_pad, new_pad)
