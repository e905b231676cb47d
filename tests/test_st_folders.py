"""sentence-transformers folders, both ways, same vectors: every kind with a sentence-transformers equivalent (SPLADE,
inference-free, asymmetric SPLADE) saves a folder that ``SparseEncoder`` encodes to our vectors, and loads a
``SparseEncoder`` folder built with sentence-transformers' own modules from the offline SPLADE-tiny encoding its
vectors: documents and queries longer than 256 tokens (where the two truncations used to differ), max |diff| <= 1e-4
and the same terms."""
import copy
import json

import pytest
import torch
from sentence_transformers import SparseEncoder
from sentence_transformers.sparse_encoder.modules import (
    MLMTransformer,
    Router,
    SparseStaticEmbedding,
    SpladePooling,
    Transformer,
)

from pyterrier_lsr import Splade, load_model
from pyterrier_lsr.core.model_files import ModelLoadError
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.kinds.asymmetric import AsymmetricSplade
from pyterrier_lsr.kinds.inference_free import InferenceFreeSplade
from pyterrier_lsr.kinds.st_format import read_layout
from pyterrier_lsr.stages.query import StaticQueryEncoder

TOLERANCE = 1e-4


@pytest.fixture(scope='module')
def tiny_path():
    return resolve_model('splade-tiny')


@pytest.fixture(scope='module')
def long_texts(vaswani_docs, splade):
    """Vaswani abstracts joined 8 to 24 at a time (past 256 tokens and past 512) and four single ones."""
    docs = [d['text'] for d in vaswani_docs[:84]]
    starts = [0, 8, 20, 36, 60]
    texts = [' '.join(docs[a:b]) for a, b in zip(starts, starts[1:])] + docs[80:84]
    lengths = [len(splade.tokenizer(t)['input_ids']) for t in texts]
    assert sum(n > 512 for n in lengths) >= 2 and sum(256 < n <= 512 for n in lengths) >= 1 and min(lengths) < 256
    return texts


@pytest.fixture(scope='module')
def long_queries(vaswani, splade):
    """Vaswani topics joined twenty at a time (past 256 tokens) and three single ones."""
    topics = vaswani.get_topics()['query'].tolist()[:63]
    queries = [' '.join(topics[i:i + 20]) for i in range(0, 60, 20)] + topics[60:63]
    assert sum(len(splade.tokenizer(q)['input_ids']) > 256 for q in queries) >= 2
    return queries


def st_vectors(st: SparseEncoder, texts: list[str], query: bool, tokenizer) -> list[dict[str, float]]:
    """sentence-transformers' sparse tensors over the vocabulary as ``{token: weight}``."""
    encode = st.encode_query if query else st.encode_document
    out = []
    for row in encode(texts, convert_to_tensor=True, batch_size=4):
        row = row.coalesce()
        ids, values = row.indices()[0].tolist(), row.values().tolist()
        out.append(dict(zip(tokenizer.convert_ids_to_tokens(ids), values)))
    return out


def assert_same(ours: list[dict], theirs: list[dict]):
    assert len(ours) == len(theirs) and all(ours)
    for a, b in zip(ours, theirs):
        assert set(a) == set(b)
        assert max(abs(a[t] - b[t]) for t in a) <= TOLERANCE


def assert_both_sides(model, st: SparseEncoder, texts, queries):
    assert_same(model.encode_docs(texts), st_vectors(st, texts, False, model.tokenizer))
    assert_same(model.encode_queries(queries), st_vectors(st, queries, True, model.tokenizer))


# -- ours -> sentence-transformers ------------------------------------------------------------------------------------
@pytest.mark.parametrize('max_length, head_scale', [(None, 1.0), (400, 2.5)])
def test_splade_folders_encode_our_vectors_in_sentence_transformers(tiny_path, tmp_path, long_texts, long_queries,
                                                                    max_length, head_scale):
    ours = Splade.from_pretrained(tiny_path, device='cpu', max_length=max_length)
    ours.model.settings['head_scale'] = head_scale  # a rescaled head: its copy for sentence-transformers folds it in
    ours.save_pretrained(tmp_path / 'm')
    modules = json.loads((tmp_path / 'm' / 'modules.json').read_text())
    transformer = tmp_path / 'm' / modules[0]['path']
    assert json.loads((transformer / 'sentence_bert_config.json').read_text())['max_seq_length'] == ours.max_length
    assert json.loads((tmp_path / 'm' / 'config_sentence_transformers.json').read_text())['model_type'] == \
        'SparseEncoder'
    st = SparseEncoder(str(tmp_path / 'm'), device='cpu')
    assert st.max_seq_length == ours.max_length == (max_length or 256)
    assert_both_sides(ours, st, long_texts, long_queries)
    again = load_model(tmp_path / 'm')  # and the folder reloads here as it was: truncation included
    assert again.max_length == ours.max_length and again.encode(long_texts) == ours.encode(long_texts)


def test_inference_free_folders_encode_our_vectors_in_sentence_transformers(splade, tmp_path, long_texts,
                                                                            long_queries):
    weight = torch.rand(splade.model.vocab_size, generator=torch.Generator().manual_seed(0))
    query_side = StaticQueryEncoder.from_tensor(splade.tokenizer, weight, max_length=300)
    ours = InferenceFreeSplade(splade.model, splade.tokenizer, query_side, device='cpu')
    ours.save_pretrained(tmp_path / 'm')
    st = SparseEncoder(str(tmp_path / 'm'), device='cpu')
    assert_both_sides(ours, st, long_texts, long_queries)
    again = load_model(tmp_path / 'm')
    assert isinstance(again, InferenceFreeSplade) and again.query_side.max_length == 300
    assert again.encode_queries(long_queries) == ours.encode_queries(long_queries)
    assert again.encode_docs(long_texts) == ours.encode_docs(long_texts)


def test_asymmetric_folders_encode_our_vectors_in_sentence_transformers(splade, tmp_path, long_texts, long_queries):
    query_model = copy.deepcopy(splade.model)
    with torch.no_grad():  # the query side differs
        query_model.mlm.get_output_embeddings().bias.add_(0.3)
    ours = AsymmetricSplade(splade.model, splade.tokenizer, query_model, device='cpu', max_length=400,
                            query_max_length=300)
    ours.save_pretrained(tmp_path / 'm')
    st = SparseEncoder(str(tmp_path / 'm'), device='cpu')
    assert_both_sides(ours, st, long_texts, long_queries)
    assert ours.encode_queries(long_queries) != ours.encode_docs(long_queries)
    again = load_model(tmp_path / 'm')
    assert isinstance(again, AsymmetricSplade) and (again.max_length, again.query_max_length) == (400, 300)
    assert again.encode_queries(long_queries) == ours.encode_queries(long_queries)


# -- sentence-transformers -> ours ------------------------------------------------------------------------------------
@pytest.mark.parametrize('module, pooling, activation, max_seq_length', [
    ('Transformer', 'max', 'relu', None), ('MLMTransformer', 'sum', 'log1p_relu', 300)])
def test_sparse_encoder_folders_load_with_their_vectors(tiny_path, tmp_path, long_texts, long_queries, module,
                                                        pooling, activation, max_seq_length):
    if module == 'Transformer':
        transformer = Transformer(tiny_path, transformer_task='fill-mask', max_seq_length=max_seq_length)
    else:  # the legacy module of folders on the hub
        transformer = MLMTransformer(tiny_path, max_seq_length=max_seq_length)
    SparseEncoder(modules=[transformer, SpladePooling(pooling, activation)], device='cpu').save(str(tmp_path / 'st'))
    st = SparseEncoder(str(tmp_path / 'st'), device='cpu')
    ours = load_model(tmp_path / 'st', device='cpu')
    assert isinstance(ours, Splade) and ours.max_length == st.max_seq_length == (max_seq_length or 512)
    assert ours.model.settings['pooling'] == pooling and ours.model.settings['activation'] == activation
    assert_both_sides(ours, st, long_texts, long_queries)
    # saved here, it stays the model sentence-transformers reads
    ours.save_pretrained(tmp_path / 'ours')
    assert_both_sides(ours, SparseEncoder(str(tmp_path / 'ours'), device='cpu'), long_texts[:2], long_queries[:2])


def test_sparse_encoder_router_folders_load_with_their_vectors(tiny_path, tmp_path, long_texts, long_queries):
    documents = Transformer(tiny_path, transformer_task='fill-mask')
    queries = Transformer(tiny_path, transformer_task='fill-mask', max_seq_length=300)
    with torch.no_grad():
        queries.auto_model.get_output_embeddings().bias.add_(0.3)
    weight = torch.rand(len(documents.tokenizer), generator=torch.Generator().manual_seed(1))
    static = SparseStaticEmbedding(tokenizer=documents.tokenizer, weight=weight, frozen=True)
    for name, query_modules, kind in [('if', [static], InferenceFreeSplade),
                                      ('asym', [queries, SpladePooling('max')], AsymmetricSplade)]:
        router = Router.for_query_document(query_modules=query_modules,
                                           document_modules=[documents, SpladePooling('max')])
        SparseEncoder(modules=[router], device='cpu').save(str(tmp_path / name))
        ours = load_model(tmp_path / name, device='cpu')
        assert type(ours) is kind
        assert_both_sides(ours, SparseEncoder(str(tmp_path / name), device='cpu'), long_texts, long_queries)


def test_folders_of_other_sentence_transformers_models(tmp_path, tiny_path):
    assert read_layout(resolve_model('all-MiniLM-L6-v2')) is None  # a dense model: its HF folder is what is read
    SparseEncoder(modules=[Transformer(tiny_path, transformer_task='fill-mask'), SpladePooling('max')],
                  device='cpu').save(str(tmp_path / 'st'))
    modules = json.loads((tmp_path / 'st' / 'modules.json').read_text())
    modules[1]['type'] = 'sentence_transformers.sparse_encoder.modules.sparse_auto_encoder.SparseAutoEncoder'
    (tmp_path / 'st' / 'modules.json').write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match=r"modules\.json: modules \['Transformer', 'SparseAutoEncoder'\]"):
        load_model(tmp_path / 'st')
    # prompts, which sentence-transformers prepends to the texts, are refused rather than silently left out
    SparseEncoder(modules=[Transformer(tiny_path, transformer_task='fill-mask'), SpladePooling('max')],
                  prompts={'query': 'query: '}, device='cpu').save(str(tmp_path / 'prompts'))
    with pytest.raises(ModelLoadError, match=r"config_sentence_transformers\.json: prompts \{'query': 'query: '\}"):
        load_model(tmp_path / 'prompts')
