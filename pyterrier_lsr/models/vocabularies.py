"""Target vocabularies for :mod:`.vocab_transfer`: a WordPiece or byte-level BPE vocabulary trained on a corpus, an
existing vocabulary extended by the corpus words it splits, and training only the rows of the added words."""
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from .vocab_transfer import normalize_text, tokenizer_size, tokenizer_style


def _normalized_words(tokenizer, texts: Iterable[str]) -> Counter:
    """Word counts of ``texts`` under the tokenizer's own normalizer and pre-tokenizer."""
    backend = tokenizer.backend_tokenizer
    counts = Counter()
    for text in texts:
        text = backend.normalizer.normalize_str(text) if backend.normalizer else normalize_text(text)
        counts.update(w for w, _ in backend.pre_tokenizer.pre_tokenize_str(text))
    return counts


def train_wordpiece(texts: Iterable[str], vocab_size: int = 20_000, min_frequency: int = 2):
    """A lowercase, accent-stripping WordPiece tokenizer (BERT-uncased style, ``[CLS] [SEP] [PAD] [MASK] [UNK]``)
    trained on ``texts`` with the ``tokenizers`` library."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizerFast
    if vocab_size < 10:
        raise ValueError(f'vocab_size must be >= 10, got {vocab_size}')
    backend = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                        special_tokens=['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'])
    backend.train_from_iterator(texts, trainer)
    # Built from the vocabulary (not the trained object) so the tokenizer is an ordinary BERT-uncased one.
    return BertTokenizerFast(vocab=backend.get_vocab(), do_lower_case=True)


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int, model_max_length: int = 256):
    """A cased byte-level BPE tokenizer (RoBERTa layout: ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3,
    ``<mask>``=4) trained on ``texts``: the surface-form vocabularies vocabulary transfer starts from."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import RobertaTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=['<s>', '<pad>', '</s>', '<unk>', '<mask>'],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    backend.post_processor = processors.RobertaProcessing(('</s>', 2), ('<s>', 0))
    return RobertaTokenizerFast(tokenizer_object=backend, bos_token='<s>', eos_token='</s>', sep_token='</s>',
                                cls_token='<s>', unk_token='<unk>', pad_token='<pad>', mask_token='<mask>',
                                model_max_length=model_max_length, model_input_names=['input_ids', 'attention_mask'])


def extend_vocabulary(tokenizer, texts: Iterable[str], n: int = 1000, min_frequency: int = 2):
    """Adds the ``n`` most frequent normalized, alphabetic corpus words that ``tokenizer`` (a WordPiece vocabulary)
    splits into several tokens, as ordinary vocabulary entries (ids after the existing ones), so they become whole
    terms everywhere they occur. Returns ``(new_tokenizer, added_words)``; initialize their embeddings with
    :func:`transfer_vocabulary` (old tokens copy exactly, added words are composed)."""
    if tokenizer_style(tokenizer) != 'wordpiece':
        raise ValueError('extend_vocabulary needs a (normalized) WordPiece tokenizer; transfer to one first')
    if n < 1:
        raise ValueError(f'n must be >= 1, got {n}')
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state['model']['vocab']
    if set(tokenizer.get_vocab()) - set(vocab):
        raise ValueError('tokenizer has added tokens outside its WordPiece vocabulary')
    counts = _normalized_words(tokenizer, texts)
    words = [w for w, c in counts.most_common() if c >= min_frequency and w.isalpha() and w not in vocab][:n]
    first = tokenizer_size(tokenizer)
    for i, word in enumerate(words):
        vocab[word] = first + i
    from tokenizers import Tokenizer
    new = type(tokenizer)(tokenizer_object=Tokenizer.from_str(json.dumps(state)), **tokenizer.special_tokens_map,
                          model_input_names=tokenizer.model_input_names, model_max_length=tokenizer.model_max_length)
    return new, words


@contextmanager
def new_rows_only(model: nn.Module, first_new: int) -> Iterator[list[nn.Parameter]]:
    """Within the block, training moves only the vocabulary rows from ``first_new`` on (VT-SPLADE's embedding
    warm-up: the added words learn before the network adapts to them). Every parameter but the input embeddings (the
    decoder is tied to them) and the output bias is frozen; the earlier rows get no gradient (so they do not count
    in gradient clipping) and are put back bit for bit after every optimizer step (decoupled weight decay shrinks rows
    without a gradient too). Yields the parameters that train. ``model`` is a masked LM or a :class:`SpladeModel`."""
    mlm = getattr(model, 'mlm', model)
    weight = mlm.get_input_embeddings().weight
    decoder = mlm.get_output_embeddings()
    if decoder is None or decoder.weight is not weight:
        raise ValueError('new_rows_only needs a masked LM whose decoder is tied to its input embeddings')
    if not 0 < first_new < len(weight):
        raise ValueError(f'first_new must be in 1..{len(weight) - 1} (rows of the vocabulary), got {first_new}')
    rows = [p for p in (weight, decoder.bias) if p is not None]
    kept = [p.detach()[:first_new].clone() for p in rows]
    trainable = {p: p.requires_grad for p in mlm.parameters()}
    mask = torch.arange(len(weight), device=weight.device) >= first_new

    @torch.no_grad()
    def restore(*_):
        for p, old in zip(rows, kept):
            p[:first_new] = old

    hooks = [p.register_hook(lambda grad: grad * mask.view(-1, *[1] * (grad.dim() - 1)).to(grad.dtype))
             for p in rows]
    hooks.append(register_optimizer_step_post_hook(restore))
    for p in mlm.parameters():
        p.requires_grad_(any(p is r for r in rows))
    try:
        yield rows
    finally:
        for hook in hooks:
            hook.remove()
        for p, requires_grad in trainable.items():
            p.requires_grad_(requires_grad)
