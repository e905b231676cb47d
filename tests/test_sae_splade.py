import json
import math
import re

import pytest
import torch

from pyterrier_lsr import LsrIndex, SaeSplade, SpladeIndexer, load_model
from pyterrier_lsr.kinds.sae_splade import idf_weighted_queries
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
from pyterrier_lsr.models.sae_splade import DEFAULT_ALPHA, SaeSpladeModel, structural_token_ids
from pyterrier_lsr.train import Example, TrainConfig, train, train_token_sae

TEXTS = ['the nuclear reactor physics', 'the cat sat on the dog', 'radio wave noise in a transistor amplifier circuit',
         'dielectric constant of liquids', 'electron density in the ionosphere', 'measurement of noise']


@pytest.fixture
def sae_splade(tiny):
    """The tiny BERT's encoder (32-d states) + an untrained 64-latent, k=4 SAE (deterministic, seeded)."""
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    sae = SparseAutoencoder(SAEConfig(d_in=32, n_latents=64, k=4, seed=1))
    return SaeSplade(SaeSpladeModel(mlm.bert, sae, structural_token_ids(tokenizer)), tokenizer, batch_size=2)


def reference(splade, text):
    """v_j = α log(1 + max_i z_ij) over the text's non-special tokens, from the dense SAE encoding."""
    model = splade.model
    enc = splade.tokenizer(text, return_tensors='pt')
    with torch.no_grad():
        hidden = model.backbone(**enc).last_hidden_state[0]
        keep = ~torch.isin(enc['input_ids'][0], torch.tensor(splade.tokenizer.all_special_ids))
        z = model.sae.encode(torch.nn.functional.normalize(hidden[keep], dim=-1))
        return model.alpha * torch.log1p(z.max(0).values)


def test_pooling_equals_reference(sae_splade):
    vecs = sae_splade.encode(TEXTS)  # batches of 2 texts of different lengths: padding must not matter
    for text, vec in zip(TEXTS, vecs):
        expected = reference(sae_splade, text)
        assert {int(t[1:]) for t in vec} == set(expected.nonzero()[:, 0].tolist())
        for term, weight in vec.items():
            assert math.isclose(weight, expected[int(term[1:])].item(), rel_tol=1e-5)
    # Another batch composition gives the same terms and, up to float rounding (kernels differ by batch shape on
    # some CPUs), the same weights.
    alone = sae_splade.encode(TEXTS[:1], batch_size=1)[0]
    assert alone.keys() == vecs[0].keys()
    assert all(math.isclose(w, vecs[0][t], rel_tol=1e-5) for t, w in alone.items())
    assert sae_splade.encode(['', None, '[CLS] [SEP]']) == [{}, {}, {}]  # special tokens alone pool nothing


def test_terms_are_only_latent_ids(sae_splade):
    import pandas as pd
    docs = sae_splade.doc_encoder()(pd.DataFrame({'docno': ['1', '2'], 'text': TEXTS[:2]}))
    queries = sae_splade.query_encoder()(pd.DataFrame({'qid': ['q'], 'query': ['nuclear dog']}))
    terms = [t for v in list(docs['toks']) + list(queries['query_toks']) for t in v]
    assert terms and all(re.fullmatch(r'l\d+', t) and int(t[1:]) < 64 for t in terms)
    assert all(len(v) <= 4 * 8 for v in docs['toks'])  # TopK: at most k latents per token


def test_alpha_is_learned_and_saved(sae_splade, tmp_path):
    model, tokenizer = sae_splade.model, sae_splade.tokenizer
    examples = [Example(TEXTS[i], TEXTS[i], [TEXTS[(i + 1) % len(TEXTS)]], [1., 0.]) for i in range(len(TEXTS))]
    decoder, encoder = model.sae.W_dec.detach().clone(), model.sae.W_enc.detach().clone()
    config = TrainConfig(steps=3, batch_size=2, lr=1e-2, warmup_steps=1, losses={'infonce': 1, 'kl': 1}, log_every=1)
    train(model, tokenizer, examples, tmp_path / 'run', config, verbose=False)
    alpha = model.alpha.item()
    assert alpha != DEFAULT_ALPHA
    assert not torch.equal(model.sae.W_enc, encoder) and torch.equal(model.sae.W_dec, decoder)  # decoder unused
    checkpoint = tmp_path / 'run' / 'checkpoint-3'
    assert json.loads((checkpoint / 'config.json').read_text())['lsr']['alpha'] == alpha
    loaded = load_model(str(checkpoint))  # the loop's checkpoint is a complete SAE-SPLADE folder
    assert isinstance(loaded, SaeSplade) and loaded.model.alpha.item() == alpha
    assert model.latent_threshold.abs().sum() > 0  # θ trains with the rest
    assert torch.equal(loaded.model.latent_threshold, model.latent_threshold)
    assert loaded.encode(TEXTS) == SaeSplade(model, tokenizer).encode(TEXTS)


def test_latent_thresholds_let_a_token_keep_fewer_than_k(sae_splade, tmp_path):
    model = sae_splade.model
    plain = sae_splade.encode(['nuclear'])[0]  # one token: its k = 4 latents
    assert len(plain) == 4
    dropped, lowered = sorted(plain, key=plain.get)[:2]
    with torch.no_grad():
        model.latent_threshold[int(dropped[1:])] = 10.  # above any activation of a unit-norm state
        model.latent_threshold[int(lowered[1:])] = 0.01
    cut = sae_splade.encode(['nuclear'])[0]
    assert set(cut) == set(plain) - {dropped}  # not refilled by the token's fifth latent
    z = math.expm1(plain[lowered] / model.alpha.item())
    assert cut[lowered] == pytest.approx(model.alpha.item() * math.log1p(z - 0.01), rel=1e-5)
    assert all(cut[t] == plain[t] for t in cut if t != lowered)
    sae_splade.save_pretrained(str(tmp_path / 'm'))
    loaded = SaeSplade.from_pretrained(str(tmp_path / 'm'), batch_size=sae_splade.batch_size)
    assert torch.equal(loaded.model.latent_threshold, model.latent_threshold) and loaded.encode(['nuclear'])[0] == cut
    # a folder written before θ existed loads as plain TopK
    config = json.loads((tmp_path / 'm' / 'config.json').read_text())
    del config['lsr']['latent_threshold'], config['lsr']['latent_weight']
    (tmp_path / 'm' / 'config.json').write_text(json.dumps(config))
    (tmp_path / 'm' / 'latent_threshold.safetensors').unlink()
    (tmp_path / 'm' / 'latent_weight.safetensors').unlink()
    old = SaeSplade.from_pretrained(str(tmp_path / 'm'))
    assert not old.model.latent_threshold.any() and old.encode(['nuclear'])[0] == pytest.approx(plain)
    assert torch.equal(old.model.latent_weight, torch.ones(64))
    with pytest.raises(ValueError, match='one value per latent'):
        SaeSpladeModel(model.backbone, model.sae, threshold=torch.zeros(3))


def test_idf_weighted_queries_weigh_latents_by_their_document_frequency(sae_splade, tmp_path):
    docs = [{'docno': str(i), 'text': t} for i, t in enumerate(TEXTS)]
    SpladeIndexer(tmp_path / 'idx', sae_splade, verbose=False).index(docs)
    index = LsrIndex(tmp_path / 'idx')
    df, n = index.document_frequencies(), index.num_docs()
    reweighed = idf_weighted_queries(sae_splade, df, n)
    assert torch.equal(sae_splade.model.latent_weight, torch.ones(64))  # the model given is not modified
    assert reweighed.encode_docs(TEXTS) == sae_splade.encode_docs(TEXTS)  # so the index stays valid
    query = ' '.join(TEXTS)
    plain, weighed = sae_splade.encode_queries([query])[0], reweighed.encode_queries([query])[0]
    common = {t for t in plain if df.get(t, 0) >= n / 2}
    assert common and plain.keys() - weighed.keys() == common  # latents in half the documents or more leave
    idf = {t: math.log((n - df.get(t, 0) + .5) / (df.get(t, 0) + .5)) for t in weighed}
    scale = sum(max(0., math.log((n - f + .5) / (f + .5))) * f for f in df.values()) / sum(df.values())
    assert all(weighed[t] == pytest.approx(plain[t] * idf[t] / scale, rel=1e-5) for t in weighed)
    reweighed.save_pretrained(str(tmp_path / 'q'))
    loaded = load_model(str(tmp_path / 'q'))
    assert loaded.encode_queries([query])[0] == pytest.approx(weighed)
    assert loaded.encode_docs(TEXTS[:1])[0] == pytest.approx(sae_splade.encode_docs(TEXTS[:1])[0])
    with pytest.raises(ValueError, match='none of the model'):
        idf_weighted_queries(sae_splade, {'l99999': 3}, n)


def test_round_trip_encodes_identically(sae_splade, tmp_path):
    with torch.no_grad():
        sae_splade.model.alpha.fill_(2.5)
    name = sae_splade.name
    sae_splade.save_pretrained(str(tmp_path / 'm'))
    sae_splade.save_pretrained(str(tmp_path / 'copy'))  # e.g. the copy an index keeps: saving never renames
    assert sae_splade.name == name
    # Same batch size, so the same batch shapes: the weights must then be bit-identical.
    loaded = SaeSplade.from_pretrained(str(tmp_path / 'm'), batch_size=sae_splade.batch_size)
    assert loaded.model.alpha.item() == 2.5 and loaded.terms == sae_splade.terms
    assert loaded.encode(TEXTS) == sae_splade.encode(TEXTS)
    assert SparseAutoencoder.from_pretrained(tmp_path / 'm' / 'sae').config == sae_splade.model.sae.config


def test_index_and_retrieve_end_to_end(sae_splade, tmp_path):
    sae_splade.save_pretrained(str(tmp_path / 'm'))
    docs = [{'docno': str(i), 'text': t} for i, t in enumerate(TEXTS)]
    SpladeIndexer(tmp_path / 'idx', sae_splade, verbose=False).index(docs)
    index = LsrIndex(tmp_path / 'idx')  # reloads the recorded model through load_model
    assert isinstance(index.model(), SaeSplade)
    assert all(re.fullmatch(r'l\d+', t) for t in index.document_frequencies())
    res = index.retriever().search('radio wave noise in a transistor amplifier circuit')
    assert len(res) and res.iloc[0]['docno'] == '2'


def test_interpretability(sae_splade):
    words = sae_splade.top_words(TEXTS, n=3)
    vocabulary = {w for t in TEXTS for w in t.split()}
    assert words and all(len(found) <= 3 for found in words.values())
    for found in words.values():
        assert all(word in vocabulary for word, _ in found)  # whole words: wordpieces merged
        assert [a for _, a in found] == sorted((a for _, a in found), reverse=True)
    latent = next(iter(words))
    assert sae_splade.top_words(TEXTS, latents=[latent], n=3) == {latent: words[latent]}
    explained = sae_splade.explain(TEXTS[3], top=4, words=words)
    vector = sae_splade.encode([TEXTS[3]])[0]
    assert [e['term'] for e in explained] == sorted(vector, key=lambda t: -vector[t])[:4]
    for entry in explained:
        assert entry['in_text'] and all(w in TEXTS[3].split() for w, _ in entry['in_text'])
        assert entry['words'] == words[entry['latent']]


def test_stage1_and_bad_inputs(tiny, tmp_path):
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    mlm.save_pretrained(tmp_path / 'backbone')
    tokenizer.save_pretrained(tmp_path / 'backbone')
    sae, log = train_token_sae(str(tmp_path / 'backbone'), TEXTS * 20, {'n_latents': 32, 'k': 2, 'batch_size': 64},
                               cache_dir=tmp_path / 'cache', verbose=False)
    assert sae.config.d_in == 32 and log[-1]['l0'] <= 2
    splade = SaeSplade.from_backbone(str(tmp_path / 'backbone'), sae)  # the MLM head is dropped
    assert all(len(v) > 0 for v in splade.encode(TEXTS))
    # the token cache is a folder of ours: a user's folder is refused, naming the argument, before any pass
    (tmp_path / 'mine').mkdir()
    (tmp_path / 'mine' / 'states.npy').write_bytes(b'mine')
    with pytest.raises(FileExistsError, match='cache_dir: .*mine is not a pyterrier-lsr embedding cache'):
        train_token_sae(str(tmp_path / 'backbone'), TEXTS, {'n_latents': 32, 'k': 2}, cache_dir=tmp_path / 'mine',
                        verbose=False)
    assert (tmp_path / 'mine' / 'states.npy').read_bytes() == b'mine'
    with pytest.raises(ValueError, match='16-d vectors but the backbone gives 32-d'):
        SaeSplade.from_backbone(str(tmp_path / 'backbone'), SparseAutoencoder(SAEConfig(d_in=16, n_latents=8, k=2)))
    with pytest.raises(ValueError, match='per-token TopK'):
        SaeSpladeModel(mlm.bert, SparseAutoencoder(SAEConfig(d_in=32, n_latents=8, k=2, batch_topk=True)))
    with pytest.raises(ValueError, match='not an SAE-SPLADE folder'):
        SaeSplade.from_pretrained(str(tmp_path / 'backbone'))


def test_builder_trains_stage1_on_extra_documents_and_records_them(tiny, tmp_path, monkeypatch):
    from pyterrier_lsr.systems import builders
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    mlm.save_pretrained(tmp_path / 'backbone')
    tokenizer.save_pretrained(tmp_path / 'backbone')
    stage1_texts, samples = [], []

    def recording(backbone, texts, *args, **kwargs):
        stage1_texts.append(list(texts))
        samples.append(kwargs['max_train_vectors'])
        return train_token_sae(backbone, texts, *args, **kwargs)
    monkeypatch.setattr(builders, 'train_token_sae', recording)
    monkeypatch.setattr(builders, 'domain_adapt', lambda start, *args, **kwargs: (start, None))  # stage 2 not run
    corpus = [{'docno': f'c{i}', 'text': t} for i, t in enumerate(TEXTS[:3])]
    extra = [{'docno': f'e{i}', 'text': t} for i, t in enumerate(TEXTS[3:])]
    stage1 = {'n_latents': 32, 'k': 2, 'batch_size': 64, 'epochs': 1}
    build = dict(backbone=str(tmp_path / 'backbone'), sae=stage1, cache_dir=tmp_path / 'cache')
    model = builders.sae_splade(corpus, tmp_path / 'mixed', stage1_extra=extra, **build)
    assert stage1_texts == [TEXTS] and isinstance(model, SaeSplade)
    system = json.loads((tmp_path / 'mixed' / builders.SYSTEM_FILE).read_text())
    assert system['stage1_extra'] and system['sae'] == stage1
    builders.sae_splade(corpus, tmp_path / 'own', **build)
    assert stage1_texts[-1] == TEXTS[:3]  # by default the corpus alone
    own = json.loads((tmp_path / 'own' / builders.SYSTEM_FILE).read_text())
    assert 'stage1_extra' not in own
    # stage 1's sample: every state up to SAE_SPLADE_STATES by default, recorded so a folder of another sample is new
    assert samples == [builders.SAE_SPLADE_STATES] * 2 and own['max_train_vectors'] == builders.SAE_SPLADE_STATES
    # a folder whose stage 1 saw other documents is never reused as if it had not
    with pytest.raises(ValueError, match='other settings \\(stage1_extra\\)'):
        builders.sae_splade(corpus, tmp_path / 'mixed', **build)
    with pytest.raises(ValueError, match='other settings \\(stage1_extra\\)'):
        builders.sae_splade(corpus, tmp_path / 'mixed', stage1_extra=extra[:1], **build)
