"""Vocabulary transfer (VT-SPLADE): sparsemax, overlap normalization for the three tokenizer styles, the transfer of
BERT / RoBERTa / ModernBERT masked LMs, APC and the MLM adaptation. Tiny random models, a few seconds each."""

import pytest
import torch

from pyterrier_lsr import Splade
from pyterrier_lsr.models.heads import calibrate_activation
from pyterrier_lsr.models.vocab_transfer import (
    find_overlap,
    normalize_token,
    sparsemax,
    tokenizer_style,
    transfer_vocabulary,
)
from pyterrier_lsr.models.vocabularies import extend_vocabulary, train_byte_level_bpe, train_wordpiece

CORPUS = [
    f'{a} {b} {c}.'
    for a, b, c in zip(
        (
            'The Nuclear reactor',
            'Ionosphere density',
            'A Café in Zürich',
            'Radio waves',
            'the cat sat',
            'Electron beams',
            'Dielectric constant',
            'Transistor amplifier',
        )
        * 40,
        (
            'measured the',
            'of the ionosphere',
            'served naïve',
            'and noise',
            'on the mat',
            'in a Magnetic field',
            'of Liquids',
            'circuits with',
        )
        * 40,
        ('electron density', 'at night', 'résumés', 'in circuits', 'again', 'were measured', 'by microwaves', 'noise')
        * 40,
    )
]


def test_sparsemax_sums_to_one_and_is_sparse():
    z = torch.tensor([[1.0, 0.8, 0.1, -1.0], [0.5, 0.5, 0.5, 0.5], [10.0, 0.0, 0.0, 0.0]])
    p = sparsemax(z)
    torch.testing.assert_close(p.sum(1), torch.ones(3))
    assert (p >= 0).all()
    assert torch.equal(p[2], torch.tensor([1.0, 0.0, 0.0, 0.0]))  # a clear winner takes all
    torch.testing.assert_close(p[1], torch.full((4,), 0.25))  # ties share equally
    assert (p[0] == 0).sum() >= 2  # exact zeros, unlike softmax
    # the projection onto the simplex: p = relu(z - tau) with the closed-form threshold
    tau = (1.0 + 0.8 - 1.0) / 2
    torch.testing.assert_close(p[0], torch.relu(z[0] - tau))  # [0.6, 0.4, 0, 0]
    torch.testing.assert_close(sparsemax(z.T, dim=0), p.T)


@pytest.mark.parametrize(
    'style, tokens',
    [
        (
            'wordpiece',
            {'café': ('cafe', True), '##ing': ('ing', False), 'Hello': ('hello', True), '[CLS]': ('[cls]', True)},
        ),
        (
            'bpe',
            {
                'ĠCafÃ©': ('cafe', True),
                'ĠHello': ('hello', True),
                'ing': ('ing', False),
                'Ġ': None,
                'Ã': None,
                'ĠNAÃ¯VE': ('naive', True),
            },
        ),
        ('sentencepiece', {'▁Café': ('cafe', True), '▁': None, 'ing': ('ing', False), '▁HELLO': ('hello', True)}),
    ],
)
def test_normalize_token_styles(style, tokens):
    for token, expected in tokens.items():
        assert normalize_token(token, style) == expected, token
    with pytest.raises(ValueError, match='style'):
        normalize_token('x', 'morfessor')


class _Vocab:
    """A stand-in tokenizer: a hand-written vocabulary and its special ids."""

    def __init__(self, tokens, special=()):
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.all_special_ids = [self.vocab[t] for t in special]

    def get_vocab(self):
        return dict(self.vocab)


def test_overlap_across_styles():
    target = _Vocab(['[PAD]', 'hello', '##ing', 'cafe', 'world', 'new'], special=['[PAD]'])
    bpe = _Vocab(['<s>', 'ĠHello', 'Ġhello', 'ing', 'ĠCafÃ©', 'ĠWORLD', 'ĠWorld', 'Ġ'], special=['<s>'])
    sp = _Vocab(['<pad>', '▁Hello', 'ing', '▁café', '▁world'], special=['<pad>'])
    assert (
        tokenizer_style(bpe) == 'bpe'
        and tokenizer_style(sp) == 'sentencepiece'
        and tokenizer_style(target) == 'wordpiece'
    )
    # exact normalized form preferred (Ġhello), single forms copied, several non-normalized forms averaged
    assert find_overlap(bpe, target) == {1: [2], 2: [3], 3: [4], 4: [5, 6]}
    assert find_overlap(bpe, target, merge='mean')[1] == [1, 2]
    assert find_overlap(sp, target) == {1: [1], 2: [2], 3: [3], 4: [4]}
    assert find_overlap(target, target) == {i: [i] for i in range(1, 6)}


def bpe_tokenizer(texts, vocab_size=400):
    return train_byte_level_bpe(texts, vocab_size, model_max_length=120)


def masked_lm(kind, vocab_size):
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        ModernBertConfig,
        ModernBertForMaskedLM,
        RobertaConfig,
        RobertaForMaskedLM,
    )

    torch.manual_seed(0)
    common = dict(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    if kind == 'bert':
        return BertForMaskedLM(BertConfig(max_position_embeddings=128, **common))
    ids = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if kind == 'roberta':
        return RobertaForMaskedLM(RobertaConfig(max_position_embeddings=124, type_vocab_size=1, **common, **ids))
    return ModernBertForMaskedLM(ModernBertConfig(cls_token_id=0, sep_token_id=2, **common, **ids))


@pytest.fixture(scope='module')
def wordpiece():
    return train_wordpiece(CORPUS, vocab_size=150, min_frequency=1)


@pytest.fixture(scope='module')
def bpe():
    return bpe_tokenizer(CORPUS)


def _weights(model, tokenizer, texts):
    enc = tokenizer(texts, padding=True, return_tensors='pt')
    with torch.no_grad():
        return model(enc['input_ids'], enc['attention_mask'])


@pytest.mark.parametrize('kind', ['roberta', 'modernbert'])
def test_transfer_cased_bpe_model(kind, bpe, wordpiece, tmp_path):
    assert wordpiece.tokenize('The CAFÉ') == wordpiece.tokenize('the cafe')  # a normalized vocabulary
    mlm = masked_lm(kind, len(bpe))
    source_weight = mlm.get_input_embeddings().weight.detach().clone()
    source_bias = mlm.get_output_embeddings().bias.detach().clone()
    model, tokenizer, report = transfer_vocabulary(mlm, bpe, wordpiece)
    assert report['source_style'] == 'bpe' and report['target_style'] == 'wordpiece'
    assert report['special'] == 5 and report['copied'] > 20 and report['composed'] > 0
    assert sum(report[k] for k in ('special', 'copied', 'averaged', 'composed', 'fallback')) == len(wordpiece)
    assert torch.equal(mlm.get_input_embeddings().weight, source_weight)  # the source model is left alone

    # copied tokens keep exactly their source vectors and biases; special tokens map by role
    weight, bias = model.mlm.get_input_embeddings().weight, model.mlm.get_output_embeddings().bias
    for target, sources in find_overlap(bpe, wordpiece).items():
        if len(sources) == 1:
            assert torch.equal(weight[target], source_weight[sources[0]])
            assert torch.equal(bias[target], source_bias[sources[0]])
    for role in ('cls', 'sep', 'pad', 'mask', 'unk'):
        assert torch.equal(
            weight[getattr(wordpiece, f'{role}_token_id')], source_weight[getattr(bpe, f'{role}_token_id')]
        )
    assert model.mlm.get_output_embeddings().weight is weight  # decoder tied to the new embeddings
    norms = weight.norm(dim=1)
    assert norms.mean().item() == pytest.approx(source_weight.norm(dim=1).mean().item(), rel=0.2)

    # encodes into target terms only; an ordinary HF folder that Splade reloads identically
    splade = Splade(model, tokenizer)
    texts = ['The Nuclear REACTOR in Zürich', 'ionosphere density at night']
    vectors = splade.encode(texts)
    assert all(v and set(v) <= set(wordpiece.get_vocab()) - set(wordpiece.all_special_tokens) for v in vectors)
    splade.save_pretrained(str(tmp_path))
    again = Splade.from_pretrained(str(tmp_path))
    assert again.model.vocab_size == len(wordpiece) and again.model.mlm.config.pad_token_id == wordpiece.pad_token_id
    assert again.model.settings['vocab_transfer']['copied'] == report['copied']
    assert 'token_type_ids' not in again.tokenizer(texts[0])
    torch.testing.assert_close(_weights(again.model, again.tokenizer, texts), _weights(model, tokenizer, texts))


def test_roberta_positions_follow_the_new_pad_id(bpe, wordpiece):
    """RoBERTa numbers positions from pad_id + 1: after the transfer (pad 1 -> 0) each real token must still get the
    position vector it was trained with."""
    mlm = masked_lm('roberta', len(bpe))
    model, _, _ = transfer_vocabulary(mlm, bpe, wordpiece)
    old, new = (
        mlm.roberta.embeddings.position_embeddings.weight,
        model.mlm.roberta.embeddings.position_embeddings.weight,
    )
    torch.testing.assert_close(new[1:10], old[2:11])
    assert model.mlm.roberta.embeddings.padding_idx == wordpiece.pad_token_id


def test_domain_extension_copies_old_tokens_and_composes_new_words(tiny):
    model, tokenizer = tiny
    extended, words = extend_vocabulary(tokenizer, CORPUS, n=5)
    assert len(words) == 5 and all(w.isalpha() and w not in tokenizer.get_vocab() for w in words)
    assert all(extended.tokenize(w) == [w] for w in words)
    new, new_tokenizer, report = transfer_vocabulary(model, tokenizer, extended)
    assert report['copied'] == len(tokenizer.get_vocab()) - len(tokenizer.all_special_ids) and report['composed'] == 5
    assert new.vocab_size == model.vocab_size + 5
    old = list(tokenizer.get_vocab().values())
    old_weight = model.mlm.get_input_embeddings().weight
    assert torch.equal(new.mlm.get_input_embeddings().weight[old], old_weight[old])
    assert torch.equal(new.mlm.get_output_embeddings().bias[old], model.mlm.get_output_embeddings().bias[old])
    vector = Splade(new, new_tokenizer).encode([f'{words[0]} measured'])[0]
    # the fixture's vocabulary lists 'a' twice, leaving an id without a token (named [unused_id_<i>])
    assert {t for t in vector if not t.startswith('[unused_id_')} <= set(extended.get_vocab())
    mean, _, report = transfer_vocabulary(model, tokenizer, extended, composition='mean')
    assert report['composed'] == 0 and report['fallback'] >= 5  # (plus the fixture's id without a token)
    torch.testing.assert_close(mean.mlm.get_input_embeddings().weight[-1], old_weight.mean(0))
    with pytest.raises(ValueError, match='WordPiece'):
        extend_vocabulary(bpe_tokenizer(CORPUS, 300), CORPUS)
    with pytest.raises(ValueError, match='composition'):
        transfer_vocabulary(model, tokenizer, extended, composition='nearest')


def test_new_rows_only_trains_the_added_words_alone(tiny):
    from pyterrier_lsr.models.vocabularies import new_rows_only
    model, tokenizer = tiny
    extended, words = extend_vocabulary(tokenizer, CORPUS, n=5)
    new, new_tokenizer, _ = transfer_vocabulary(model, tokenizer, extended)
    first = model.vocab_size
    before = {name: p.detach().clone() for name, p in new.named_parameters()}
    enc = new_tokenizer([f'{w} measured the electron' for w in words], padding=True, return_tensors='pt')
    with new_rows_only(new, first) as rows:
        trainable = [p for p in new.parameters() if p.requires_grad]
        assert len(trainable) == len(rows) == 2  # tied embeddings/decoder and the output bias
        optimizer = torch.optim.AdamW(trainable, lr=0.1, weight_decay=0.5)
        for _ in range(3):
            new(enc['input_ids'], enc['attention_mask']).sum().backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad()
    assert all(p.requires_grad for p in new.parameters())
    embeddings = 'mlm.bert.embeddings.word_embeddings.weight'
    for name, p in new.named_parameters():
        if name in (embeddings, 'mlm.cls.predictions.bias'):
            assert torch.equal(p[:first], before[name][:first]), name  # bit for bit, despite weight decay
            assert not torch.allclose(p[first:], before[name][first:]), name
        else:
            assert torch.equal(p, before[name]), name
    with pytest.raises(ValueError, match='first_new'):
        with new_rows_only(new, new.vocab_size):
            pass
    untied, _ = tiny
    untied.mlm.get_output_embeddings().weight = torch.nn.Parameter(untied.mlm.get_input_embeddings().weight.clone())
    with pytest.raises(ValueError, match='tied'):
        with new_rows_only(untied, first):
            pass


def test_transfer_from_bert_and_another_embedding_space(tiny, wordpiece):
    from pyterrier_lsr.models.vocab_transfer import decomposition_embedder

    model, tokenizer = tiny
    other = masked_lm('bert', len(tokenizer))
    new, new_tokenizer, report = transfer_vocabulary(
        model, tokenizer, wordpiece, embedder=decomposition_embedder(other, tokenizer)
    )
    assert report['copied'] > 10 and report['composed'] > 10 and new.vocab_size == len(wordpiece)
    assert 'token_type_ids' in new_tokenizer('a text')  # BERT takes segment ids: kept


def test_apc_moves_the_active_fraction(bpe, wordpiece):
    model, tokenizer, _ = transfer_vocabulary(masked_lm('modernbert', len(bpe)), bpe, wordpiece)
    stats = calibrate_activation(model, tokenizer, CORPUS[:40], target_active=0.05)
    assert stats['active_after'] == pytest.approx(0.05, abs=0.01)
    assert stats['pooled_p50_after'] < 0 < stats['pooled_p99_after']
    again = calibrate_activation(model, tokenizer, CORPUS[:40], target_active=0.05)
    assert again['active_before'] == pytest.approx(0.05, abs=0.01)


def test_mlm_adaptation_learns_and_resumes(bpe, wordpiece, tmp_path):
    import copy

    from pyterrier_lsr.train import TrainConfig, train_mlm

    model, tokenizer, _ = transfer_vocabulary(masked_lm('roberta', len(bpe)), bpe, wordpiece)
    fresh = copy.deepcopy(model.mlm)
    config = TrainConfig(steps=40, batch_size=16, lr=3e-3, warmup_steps=0, log_every=10)
    log = train_mlm(model, tokenizer, CORPUS, tmp_path / 'full', config, verbose=False)
    assert log[-1]['loss'] < 0.85 * log[0]['loss'] and (tmp_path / 'full' / 'checkpoint-40' / 'config.json').exists()
    short = TrainConfig(steps=4, batch_size=8, grad_accum=2, save_every=2, warmup_steps=1)
    full = copy.deepcopy(fresh)
    train_mlm(full, tokenizer, CORPUS, tmp_path / 'a', short, verbose=False)
    import shutil

    train_mlm(copy.deepcopy(fresh), tokenizer, CORPUS, tmp_path / 'b', short, verbose=False)
    shutil.rmtree(tmp_path / 'b' / 'checkpoint-4')
    resumed = copy.deepcopy(fresh)
    train_mlm(resumed, tokenizer, CORPUS, tmp_path / 'b', short, resume=True, verbose=False)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match='mask_rate'):
        train_mlm(model, tokenizer, CORPUS, tmp_path / 'c', short, mask_rate=0.0)


def test_mask_tokens_rate_and_specials():
    from pyterrier_lsr.train import mask_tokens

    torch.manual_seed(0)
    ids = torch.randint(5, 100, (64, 50))
    ids[:, 0], ids[:, -1] = 0, 2
    mask = torch.ones_like(ids)
    corrupted, labels = mask_tokens(ids, mask, [0, 2], 4, 100, mask_rate=0.3)
    chosen = labels != -100
    assert chosen.float().mean().item() == pytest.approx(0.3 * 48 / 50, abs=0.02)
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert (corrupted[chosen] == 4).float().mean().item() == pytest.approx(0.8, abs=0.03)
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(corrupted[~chosen], ids[~chosen])


def test_bad_inputs(tiny, wordpiece):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match='temperature'):
        transfer_vocabulary(model, tokenizer, wordpiece, temperature=0)
    with pytest.raises(ValueError, match='merge'):
        find_overlap(tokenizer, wordpiece, merge='max')
    assert len(wordpiece) > model.vocab_size
    with pytest.raises(ValueError, match='own tokenizer'):
        transfer_vocabulary(model, wordpiece, tokenizer)
    with pytest.raises(ValueError, match='vocab_size'):
        train_wordpiece(CORPUS, vocab_size=3)
