"""The one model contract (pyterrier_lsr.kinds.base.SparseModel): hand-over to indexers, names, folders, name
resolution."""
import pandas as pd
import pytest
import torch
from conformance import TEXTS

from pyterrier_lsr import SSR, LatentTerms, LsrIndex, MultiVector, SaeSplade, Splade, SpladeIndexer, load_model
from pyterrier_lsr.models.multivector import MultiVectorModel
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
from pyterrier_lsr.models.sae_splade import SaeSpladeModel, structural_token_ids

DOCS = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(TEXTS)]
TOPICS = pd.DataFrame({'qid': ['1', '2'], 'query': ['nuclear reactor', 'radio noise']})


def _ssr(tiny):
    from transformers import BertConfig, BertModel
    _, tokenizer = tiny
    torch.manual_seed(0)
    backbone = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    encoder = MultiVector(MultiVectorModel(backbone, dim=8, skip_ids=[tokenizer.cls_token_id,
                                                                      tokenizer.sep_token_id]), tokenizer, device='cpu')
    return SSR(encoder, SparseAutoencoder(SAEConfig(d_in=8, n_latents=16, k=4, seed=1)))


def _sae_splade(tiny):
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    sae = SparseAutoencoder(SAEConfig(d_in=32, n_latents=64, k=4, seed=1))
    return SaeSplade(SaeSpladeModel(mlm.bert, sae, structural_token_ids(tokenizer)), tokenizer, batch_size=2)


def _latent_terms():
    return LatentTerms('all-MiniLM-L6-v2', SparseAutoencoder(SAEConfig(d_in=384, n_latents=64, k=4, seed=1)))


KINDS = {'splade': lambda tiny: Splade(*tiny), 'sae-splade': _sae_splade, 'ssr': _ssr,
         'latent-terms': lambda tiny: _latent_terms()}


@pytest.mark.parametrize('kind', list(KINDS))
def test_an_indexer_given_a_model_records_every_kind(kind, tiny, tmp_path):
    # toks from the doc encoder, the model given to the indexer: the index records it and retrieves on its own
    model = KINDS[kind](tiny)
    index = (model.doc_encoder() >> SpladeIndexer(tmp_path / 'x.lsr', model, verbose=False)).index(DOCS)
    reopened = LsrIndex(index.path)
    assert reopened.meta['model']['kind'] == kind
    got = reopened.retriever(num_results=5)(TOPICS)
    want = (model.query_encoder() >> reopened.toks_retriever(num_results=5))(TOPICS)
    pd.testing.assert_frame_equal(got[['qid', 'docno', 'score']], want[['qid', 'docno', 'score']])


@pytest.mark.parametrize('kind', list(KINDS))
def test_saving_never_renames_the_model(kind, tiny, tmp_path):
    # an unnamed model used to take the name of the folder it was saved into, so an index recorded its temporary
    # build folder (deleted afterwards) as the model's name
    model = KINDS[kind](tiny)
    model.name = None
    model.save_pretrained(tmp_path / 'copy')
    assert model.name is None
    index = SpladeIndexer(tmp_path / 'x.lsr', model, verbose=False).index(DOCS)
    assert model.name is None
    assert LsrIndex(index.path).meta['model']['name'] is None
    assert '.building' not in repr(LsrIndex(index.path).retriever())


@pytest.mark.parametrize('kind', list(KINDS))
def test_load_model_resolves_hub_names_for_every_kind(kind, tiny, tmp_path, monkeypatch):
    # SSR, Latent Terms and SAE-SPLADE used to take local folders only: a hub name reached them unresolved
    import huggingface_hub
    folder = tmp_path / 'snapshot'
    KINDS[kind](tiny).save_pretrained(folder)
    asked = []
    monkeypatch.setattr(huggingface_hub, 'snapshot_download', lambda name, **kw: asked.append(name) or str(folder))
    model = load_model('org/some-model')
    assert model.kind == kind and model.name == 'org/some-model' and asked[-1] == 'org/some-model'
    again = type(model).from_pretrained('org/some-model')
    assert again.name == 'org/some-model'
    for a, b in zip(again.encode_docs(TEXTS[:2]), model.encode_docs(TEXTS[:2])):
        assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-5 for t in a)


def test_save_pretrained_replaces_only_its_own_model_folder(tiny, tmp_path):
    model = Splade(*tiny)
    user = tmp_path / 'mine'
    user.mkdir()
    (user / 'notes.txt').write_text('keep me')
    with pytest.raises(FileExistsError, match='refusing'):
        model.save_pretrained(user)
    assert (user / 'notes.txt').read_text() == 'keep me'
    model.save_pretrained(tmp_path / 'model')
    model.save_pretrained(tmp_path / 'model')  # our own model folder: replaced
    assert load_model(tmp_path / 'model').encode(TEXTS[:1]) == model.encode(TEXTS[:1])


def test_labels_are_short_and_name_the_method(splade):
    assert splade.label == f'SPLADE ({splade.short_name})'
    assert _latent_terms().label == 'Latent Terms (all-MiniLM-L6-v2)'


@pytest.mark.parametrize('kind', [['splade'], 5, 'nonsense'])
def test_a_tampered_kind_is_one_clear_error(kind, tiny, tmp_path):
    import json
    Splade(*tiny).save_pretrained(tmp_path / 'm')
    config = json.loads((tmp_path / 'm' / 'config.json').read_text())
    config['lsr']['kind'] = kind
    (tmp_path / 'm' / 'config.json').write_text(json.dumps(config))
    with pytest.raises(ValueError, match='config.json: unknown model kind'):
        load_model(tmp_path / 'm')


def test_settings_that_would_empty_every_output_are_refused(tiny):
    from pyterrier_lsr import Prune
    from pyterrier_lsr.models.heads import rescale_head
    from pyterrier_lsr.stages.pruning import prune
    with pytest.raises(ValueError, match='max_length'):
        Splade(*tiny, max_length=2)
    for rules in [{'top_n': -1}, {'threshold': float('nan')}, {'ratio': -0.1}]:
        with pytest.raises(ValueError, match=list(rules)[0]):
            prune({'a': 1.0}, **rules)
    with pytest.raises(ValueError, match='fields'):
        Prune(top_n=1, fields=['text'])
    assert Prune(top_n=1, fields='toks').fields == ['toks']
    with pytest.raises(ValueError, match='fields must name at least one'):  # [] used to mean every field
        Prune(top_n=1, fields=[])
    with pytest.raises(ValueError, match='k must be a finite number'):
        rescale_head(Splade(*tiny).model, float('inf'))
    with pytest.raises(ValueError, match='alpha'):
        SaeSpladeModel(tiny[0].mlm.bert, SparseAutoencoder(SAEConfig(d_in=32, n_latents=8, k=2)), alpha=-1.)
    with pytest.raises(TypeError, match='SAEConfig.k must be an integer'):
        SAEConfig(d_in=32, k='4')


def test_static_query_sides_refuse_settings_and_indexes_they_cannot_serve(splade, tmp_path):
    from pyterrier_lsr import IDFQueryEncoder, StaticQueryEncoder
    with pytest.raises(ValueError, match='max_length'):
        StaticQueryEncoder(splade.tokenizer, {'nuclear': 1.0}, max_length=0)
    index = SpladeIndexer(tmp_path / 'lt.lsr', _latent_terms(), verbose=False).index(DOCS)
    with pytest.raises(ValueError, match='latent ids'):
        IDFQueryEncoder.from_index(LsrIndex(index.path))
    with pytest.raises(ValueError, match='latent ids'):
        IDFQueryEncoder.from_index(LsrIndex(index.path), tokenizer=splade.tokenizer)
    bare = SpladeIndexer(tmp_path / 'bare.lsr', verbose=False).index(
        [{'docno': 'a', 'toks': {'l1': 1.0, 'l7': 2.0}}, {'docno': 'b', 'toks': {'l3': 1.0}}])
    with pytest.raises(ValueError, match='none of its terms'):
        IDFQueryEncoder.from_index(bare, tokenizer=splade.tokenizer)


def test_tables_name_systems_shortly(splade, tmp_path):
    from pyterrier_lsr import IDFQueryEncoder
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, engines=('pisa', 'bmp'), verbose=False).index(DOCS)
    assert repr(index.retriever()) == f'SPLADE ({splade.short_name})'
    assert repr(index.retriever(engine='bmp')) == f'SPLADE ({splade.short_name}), BMP'
    assert repr(index.retriever(query_encoder=IDFQueryEncoder.from_index(index))) == 'IDF queries on x.lsr'
