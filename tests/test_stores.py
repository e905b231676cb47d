"""The index artifacts as PyTerrier artifacts, indexers and retrievers: the token stores (MaxSimIndex, SSRIndex) built
by streaming validated documents through a handed-over model, opened lazily and tied to one build; every index its own
default retriever; rank cutoffs pushed into the engines."""
import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
import pytest
import torch

from pyterrier_lsr import LsrIndex, MaxSimIndex, MultiVector, SpladeIndexer, SSRIndex
from pyterrier_lsr.index.engines import ENGINES, get_engine
from pyterrier_lsr.kinds.ssr import SSR
from pyterrier_lsr.models.multivector import MultiVectorModel
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder

TEXTS = ['the nuclear reactor physics', 'electron density in the ionosphere', 'transistor amplifier circuit noise',
         'dielectric constant of liquids', 'radio wave measurement', 'the cat sat on the dog']
DOCS = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(TEXTS)]
TOPICS = pd.DataFrame({'qid': ['1', '2'], 'query': ['reactor physics', 'radio noise']})


@pytest.fixture
def encoder(tiny):
    from transformers import BertConfig, BertModel
    _, tokenizer = tiny
    torch.manual_seed(0)
    backbone = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    model = MultiVectorModel(backbone, dim=8, skip_ids=[tokenizer.cls_token_id, tokenizer.sep_token_id])
    return MultiVector(model, tokenizer, device='cpu', batch_size=4, name='tiny-mv')


@pytest.fixture
def ssr(encoder):
    return SSR(encoder, SparseAutoencoder(SAEConfig(d_in=8, n_latents=32, k=4, seed=1)))


def build(kind, path, encoder, ssr, docs=DOCS, **settings):
    store = MaxSimIndex(path, encoder, verbose=False, **settings) if kind == 'maxsim' else \
        SSRIndex(path, ssr, verbose=False, **settings)
    return store.indexer().index(docs)


@pytest.mark.parametrize('kind, type_format', [('maxsim', 'multivector_index.maxsim'), ('ssr', 'sparse_index.ssr')])
def test_token_stores_are_artifacts_built_from_an_unbuilt_path(kind, type_format, encoder, ssr, tmp_path):
    cls = MaxSimIndex if kind == 'maxsim' else SSRIndex
    (tmp_path / 'empty').mkdir()
    for path in (tmp_path / 'missing', tmp_path / 'empty'):
        store = cls(path)  # an unbuilt artifact (this raised FileNotFoundError)
        assert isinstance(store, pta.Artifact) and not store.built()
        with pytest.raises(FileNotFoundError, match='indexer'):
            store.num_docs()
        built = build(kind, path, encoder, ssr)
        assert built.built() and built.num_docs() == len(DOCS)
    meta = pd.read_json(tmp_path / 'missing' / 'pt_meta.json', typ='series')
    assert f'{meta["type"]}.{meta["format"]}' == type_format
    loaded = pt.Artifact.load(str(tmp_path / 'missing'))
    assert type(loaded) is cls and loaded.docnos == [d['docno'] for d in DOCS]


def test_lsr_index_loads_as_an_artifact_too(tmp_path):
    index = SpladeIndexer(tmp_path / 'x.lsr', verbose=False).index([{'docno': 'a', 'toks': {'x': 1.0}}])
    assert type(pt.Artifact.load(str(index.path))) is LsrIndex


@pytest.mark.parametrize('kind', ['maxsim', 'ssr'])
def test_token_indexers_take_dataframes_and_check_every_document(kind, encoder, ssr, tmp_path):
    frame = pd.DataFrame(DOCS)
    store = build(kind, tmp_path / 'frame', encoder, ssr, frame)  # a KeyError "got ['c','d','n','o','o']" before
    assert store.docnos == list(frame['docno'])
    with pytest.raises(KeyError, match=r"documents must have columns \['text'\]"):
        build(kind, tmp_path / 'bad', encoder, ssr, frame.rename(columns={'text': 'body'}))
    assert build(kind, tmp_path / 'body', encoder, ssr, frame.rename(columns={'text': 'body'}),
                 text_field='body').num_docs() == len(DOCS)
    # the first document alone was checked before: later ones failed with a raw KeyError, or were stored
    for bad, error, match in [(DOCS[:3] + [{'docno': 'x'}], KeyError, "document 3 has \\['docno'\\]"),
                              (DOCS[:3] + ['text'], TypeError, 'document 3 is a str'),
                              (DOCS[:3] + [DOCS[1]], ValueError, "'d1' occurs twice"),
                              (DOCS[:3] + [{'docno': 'y', 'text': b'bytes'}], TypeError, 'text')]:
        with pytest.raises(error, match=match):
            build(kind, tmp_path / 'bad', encoder, ssr, bad, shard_size=2)
        assert not (tmp_path / 'bad').exists()
    with pytest.raises(TypeError, match='iterable of documents'):
        build(kind, tmp_path / 'bad', encoder, ssr, DOCS[0])


@pytest.mark.parametrize('kind', ['maxsim', 'ssr'])
def test_token_indexers_stream_the_documents(kind, encoder, ssr, tmp_path, monkeypatch):
    pulled, seen = [], []

    def docs():
        for doc in DOCS:
            pulled.append(doc['docno'])
            yield doc
    original = MultiVector.embed

    def embed(self, texts, *args, **kwargs):
        seen.append((len(pulled), len(texts)))
        return original(self, texts, *args, **kwargs)
    monkeypatch.setattr(MultiVector, 'embed', embed)
    store = build(kind, tmp_path / 's', encoder, ssr, docs(), shard_size=2)
    # encoded 2 by 2, each chunk as soon as it was read (the whole corpus was listed first)
    assert seen == [(2, 2), (4, 2), (6, 2)]
    whole = build(kind, tmp_path / 'whole', encoder, ssr)
    assert store.docnos == whole.docnos and np.array_equal(store.offsets, whole.offsets)
    for name in [n for n in store.files if n.endswith('.npy') and '/' not in n]:  # padding moves the last bits
        assert np.allclose(np.load(store.path / name), np.load(whole.path / name), atol=1e-3), name


def test_token_indexers_take_their_model_as_every_index_does(encoder, ssr, tmp_path):
    indexer = MaxSimIndex(tmp_path / 'mv', verbose=False).indexer(encoder)
    assert isinstance(indexer, MaxSimIndex) and indexer.model() is encoder
    assert SSRIndex(tmp_path / 'ssr', ssr, verbose=False).indexer().index(DOCS).model() is ssr
    store = indexer.index(DOCS)
    assert store.meta['model'] == 'tiny-mv'
    with pytest.raises(ValueError, match='no model to encode the documents'):
        MaxSimIndex(tmp_path / 'none').indexer().index(DOCS)
    # the encoder is a transformer of its own: its exact MaxSim scorer
    frame = TOPICS.iloc[:1].merge(pd.DataFrame(DOCS[:3]), how='cross')
    pd.testing.assert_frame_equal(encoder(frame), encoder.scorer()(frame))


@pytest.mark.parametrize('kind', ['maxsim', 'ssr'])
def test_token_stores_are_their_default_retrievers(kind, encoder, ssr, tmp_path):
    store = build(kind, tmp_path / 's', encoder, ssr)
    expected = store.retriever()(TOPICS)
    assert len(expected)
    pd.testing.assert_frame_equal(type(store)(store.path, encoder if kind == 'maxsim' else None)(TOPICS), expected)
    # search() is pt.Transformer's (the MaxSim retriever hid it behind its own attribute)
    single = store.retriever().search('reactor physics')
    assert list(single['docno']) == list(expected[expected['qid'] == '1']['docno'])


def test_lsr_index_is_its_default_retriever(splade, tmp_path):
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)
    expected = index.retriever()(TOPICS)
    pd.testing.assert_frame_equal(LsrIndex(index.path)(TOPICS), expected)
    toks = splade.query_encoder()(TOPICS)
    pd.testing.assert_frame_equal(LsrIndex(index.path)(toks), index.toks_retriever()(toks))


def test_spladeindexer_is_the_index_s_indexer(splade, tmp_path):
    indexer = SpladeIndexer(tmp_path / 'x.lsr', splade, scale=50., verbose=False)
    assert isinstance(indexer, LsrIndex) and not indexer.built()
    pipeline = splade.doc_encoder() >> indexer  # plain PyTerrier composition: the indexer is the one given
    assert isinstance(pipeline, pt.Compose) and pipeline[-1] is indexer and indexer._scale == 50.
    index = pipeline.index(DOCS)
    assert index.scale == 50. and LsrIndex(index.path).model().name == splade.name
    again = LsrIndex(index.path).indexer(overwrite=True, scale=20.).index([{'docno': 'a', 'toks': {'x': 1.0}}])
    assert again.scale == 20. and again.num_docs() == 1


def _spy(monkeypatch, cls, name, argument):
    """Records the ``argument`` each call of ``cls.name`` gets."""
    import inspect
    calls, original = [], getattr(cls, name)
    position = list(inspect.signature(original).parameters).index(argument)

    def spy(*args, **kwargs):
        calls.append(kwargs[argument] if argument in kwargs else args[position])
        return original(*args, **kwargs)
    monkeypatch.setattr(cls, name, spy)
    return calls


@pytest.mark.parametrize('engine', sorted(ENGINES))
def test_a_rank_cutoff_asks_the_engine_for_k(engine, tmp_path, monkeypatch):
    docs = [{'docno': f'd{i}', 'toks': {'a': 1.0 + i, f't{i % 3}': 2.0}} for i in range(30)]
    index = SpladeIndexer(tmp_path / 'x.lsr', engines=sorted(ENGINES), verbose=False).index(docs)
    calls = _spy(monkeypatch, type(get_engine(engine)), 'retriever', 'num_results')
    queries = pd.DataFrame({'qid': ['1', '2'], 'query_toks': [{'a': 1.0}, {'t1': 1.0, 'a': 0.5}]})
    full = index.toks_retriever(engine=engine)(queries)
    cut = (index.toks_retriever(engine=engine) % 10).compile()
    # one deeper than asked (capped at the 30 documents), so that ties across the cut are seen (index/ranking.py)
    assert calls == [30, 30, 11]
    res = cut(queries)
    assert res.groupby('qid').size().tolist() == [10, 10]
    pd.testing.assert_frame_equal(res, full[full['rank'] < 10].reset_index(drop=True))
    assert (index.toks_retriever(num_results=5, engine=engine) % 10).compile() is not None  # k past num_results
    assert calls[-1] == 6


def test_a_rank_cutoff_of_the_text_retriever_reaches_the_engine(splade, tmp_path, monkeypatch):
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)
    calls = _spy(monkeypatch, type(get_engine('pisa')), 'retriever', 'num_results')
    res = (index.retriever() % 2).compile()(TOPICS)
    assert calls[-1] == 3 and res.groupby('qid').size().max() <= 2


def test_a_rank_cutoff_of_the_index_itself_reaches_the_engine(splade, tmp_path, monkeypatch):
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)
    calls = _spy(monkeypatch, type(get_engine('pisa')), 'retriever', 'num_results')
    for queries in (TOPICS, splade.query_encoder()(TOPICS)):  # text, and query_toks
        full = index(queries)
        res = (index % 2).compile()(queries)
        assert calls[-2:] == [len(DOCS), 3]  # one deeper than asked, capped at the number of documents
        pd.testing.assert_frame_equal(res, full[full['rank'] < 2].reset_index(drop=True))
    assert list((index % 2).compile()(TOPICS.iloc[:0]).columns) == list(full.columns)  # columns kept when empty
    assert index.fuse_rank_cutoff(1000) is None  # the default depth: nothing to fuse


@pytest.mark.parametrize('kind', ['maxsim', 'maxsim-ivf', 'ssr'])
def test_a_rank_cutoff_asks_the_token_stores_for_k(kind, encoder, ssr, tmp_path, monkeypatch):
    store = build('ssr' if kind == 'ssr' else 'maxsim', tmp_path / 's', encoder, ssr)
    if kind == 'ssr':
        calls = _spy(monkeypatch, SSRIndex, 'search_embeddings', 'num_results')
        retriever = store.retriever()
    else:
        calls = _spy(monkeypatch, MaxSimIndex, '_top', 'k')
        if kind == 'maxsim-ivf':
            store.build_ivf(n_centroids=2)
        retriever = store.retriever() if kind == 'maxsim' else store.ivf_retriever(ncells=2, ndocs=100)
    full = retriever(TOPICS)
    cut = (retriever % 2).compile()(TOPICS)
    assert set(calls[:len(calls) // 2]) == {1000} and set(calls[len(calls) // 2:]) == {2}
    pd.testing.assert_frame_equal(cut, full[full['rank'] < 2].reset_index(drop=True))


def test_a_stale_maxsim_store_never_mixes_two_builds(encoder, tmp_path):
    store = build('maxsim', tmp_path / 's', encoder, None)
    assert store.docnos[0] == 'd0'
    before = store.retriever()
    others = [{'docno': f'new{i}', 'text': t} for i, t in enumerate(reversed(TEXTS))]
    build('maxsim', tmp_path / 's', encoder, None, others, overwrite=True)
    # the old docnos ranked with the new vectors before: now the object follows the folder's build
    expected = MaxSimIndex(tmp_path / 's', encoder).retriever()(TOPICS)
    assert set(expected['docno']) <= {d['docno'] for d in others}
    pd.testing.assert_frame_equal(store.retriever()(TOPICS), expected)
    with pytest.raises(RuntimeError, match='rebuilt after this retriever was made'):
        before(TOPICS)


def test_a_lazily_read_array_of_another_build_is_refused(encoder, tmp_path, monkeypatch):
    store = build('maxsim', tmp_path / 's', encoder, None)
    state = store._state()  # opened: docnos and offsets read, the vectors not yet
    build('maxsim', tmp_path / 's', encoder, None, DOCS[::-1], overwrite=True)
    with pytest.raises(RuntimeError, match='rebuilt while it was being read'):
        store._vectors(state)


@pytest.mark.parametrize('make, error, match', [
    (lambda s: s.retriever(num_results=2.5), TypeError, 'num_results must be an integer'),
    (lambda s: s.retriever(num_results=-1), ValueError, 'num_results must be >= 1'),
    (lambda s: s.ivf_retriever(ncells=0), ValueError, 'ncells must be >= 1'),
    (lambda s: s.ivf_retriever(ndocs=0), ValueError, 'ndocs must be >= 1'),
    (lambda s: s.ivf_retriever(num_results=0), ValueError, 'num_results must be >= 1'),
])
def test_maxsim_retrievers_check_their_parameters(make, error, match, encoder, tmp_path):
    store = build('maxsim', tmp_path / 's', encoder, None)
    store.build_ivf(n_centroids=2)
    with pytest.raises(error, match=match):  # raw torch and numpy errors, at query time, before
        make(store)(TOPICS)


def test_ssr_encodes_in_the_batches_it_is_asked_for(ssr):
    sizes = []
    hook = ssr.encoder.model.register_forward_hook(lambda module, args, out: sizes.append(len(args[0])))
    try:
        ssr.encode_docs(TEXTS, batch_size=2)
        ssr.encode_queries(TEXTS[:3], batch_size=1)
        ssr.encode_docs(TEXTS)
    finally:
        hook.remove()
    assert sizes == [2, 2, 2, 1, 1, 1, 4, 2]  # the batch_size was ignored: always the encoder's 4
    with pytest.raises(ValueError, match='batch_size must be >= 1'):
        ssr.encode_docs(TEXTS, batch_size=0)


def test_transformers_holding_models_name_them_as_subtransformers(encoder, ssr, splade, tmp_path):
    store = build('ssr', tmp_path / 's', encoder, ssr)
    assert pt.inspect.subtransformers(encoder.scorer()) == {'encoder': encoder}
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)
    toks = index.toks_retriever()
    assert pt.inspect.subtransformers(toks) == {'engine': toks.engine_retriever}
    maxsim = build('maxsim', tmp_path / 'm', encoder, None)
    two = ssr.reranked(store, maxsim, depth=3)
    assert list(pt.inspect.subtransformers(two)) == ['first']
    for transformer in (store, maxsim.retriever(), store.retriever(), index):
        pt.inspect.subtransformers(transformer)  # an InspectError before for some


def test_a_store_written_before_build_ids_opens_by_its_files(encoder, tmp_path):
    from pyterrier_lsr.core import storage
    store = build('maxsim', tmp_path / 's', encoder, None)
    expected = store.retriever()(TOPICS)
    storage.mark(store.path, 'maxsim_store', files=storage.read_marker(store.path)['files'])  # no build id
    reopened = MaxSimIndex(store.path, encoder)
    assert len(reopened.build_id()) == 64
    pd.testing.assert_frame_equal(reopened.retriever()(TOPICS), expected)


def test_nothing_shadows_the_transformer_methods(encoder, ssr, tmp_path):
    docs = [{'docno': f'd{i}', 'toks': {'a': 1.0 + i, f't{i % 3}': 2.0}} for i in range(10)]
    index = SpladeIndexer(tmp_path / 'x.lsr', engines=sorted(ENGINES), verbose=False).index(docs)
    stores = [build('maxsim', tmp_path / 'm', encoder, None), build('ssr', tmp_path / 's', encoder, ssr)]
    toks = [index.toks_retriever(engine=engine) for engine in sorted(ENGINES)]
    objects = [index, *stores, *(s.retriever() for s in stores), *toks, *(t.engine_retriever for t in toks)]
    methods = [m for m in dir(pt.Transformer) if not m.startswith('_') and callable(getattr(pt.Transformer, m))]
    for obj in objects:
        # the MaxSim retriever and the BMP/Seismic searchers assigned self.search; SSRIndex.search took embeddings
        # (pt.Transformer binds transform/transform_iter to the instance itself: those are its own methods)
        assigned = {name for name, value in vars(obj).items() if getattr(value, '__self__', None) is not obj}
        assert not set(methods) & assigned, f'{obj!r} shadows {set(methods) & assigned}'
        for method in ('search', 'compile', 'parallel'):
            assert getattr(type(obj), method) is getattr(pt.Transformer, method), f'{obj!r}.{method}'
    for store in stores:
        expected = store.retriever()(TOPICS.iloc[:1])
        assert list(type(store)(store.path, encoder if store is stores[0] else None).search('reactor physics')[
            'docno']) == list(expected['docno'])
