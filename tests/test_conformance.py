"""Every public transformer that can be built from the offline models passes :func:`conformance.check_transformer`."""
import copy

import pandas as pd
import pyterrier as pt
import pytest
from conformance import TEXTS, check_retriever, check_transformer

from pyterrier_lsr import (
    SSR,
    AsymmetricSplade,
    IDFQueryEncoder,
    InferenceFreeSplade,
    LatentTerms,
    LsrIndex,
    MultiVector,
    Prune,
    SaeSplade,
    SparseModel,
    Splade,
    SpladeIndexer,
    StaticQueryEncoder,
)
from pyterrier_lsr.index.bm25 import bm25_index
from pyterrier_lsr.index.engines import ENGINES, get_engine
from pyterrier_lsr.index.maxsim import MaxSimIndex
from pyterrier_lsr.index.ssr import SSRIndex
from pyterrier_lsr.kinds.loading import MODEL_KINDS, model_class
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
from pyterrier_lsr.models.sae_splade import SaeSpladeModel, structural_token_ids
from pyterrier_lsr.systems.dense import dense_retriever
from pyterrier_lsr.train import DenseScorer, RetrieverScorer, ZScoreFusion


def idf(splade):
    return IDFQueryEncoder.from_corpus(splade.tokenizer, TEXTS * 2 + ['nuclear physics'])


def asymmetric(splade):
    return AsymmetricSplade(splade.model, splade.tokenizer, copy.deepcopy(splade.model), batch_size=2)


def sae_splade(tiny):
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    sae = SparseAutoencoder(SAEConfig(d_in=32, n_latents=64, k=4, seed=1))
    return SaeSplade(SaeSpladeModel(mlm.bert, sae, structural_token_ids(tokenizer)), tokenizer, batch_size=2)


def ssr():
    encoder = MultiVector.from_backbone('all-MiniLM-L6-v2', dim=16, device='cpu', batch_size=2)
    return SSR(encoder, SparseAutoencoder(SAEConfig(d_in=16, n_latents=32, k=4, seed=1)))


def retriever_scorer(folder):
    # BM25 over the conformance corpus, candidates matched by text (each text is in the corpus, so scores are real)
    corpus = [{'docno': f'd{i}', 'text': text} for i, text in enumerate(TEXTS)]
    return RetrieverScorer(bm25_index(folder / 'bm25.pisa', corpus).bm25(), {d['docno']: d['text'] for d in corpus})


def latent_terms():
    return LatentTerms('all-MiniLM-L6-v2', SparseAutoencoder(SAEConfig(d_in=384, n_latents=64, k=4, seed=1)),
                       mode='multi', batch_size=2)


CASES = {  # name -> (fixtures, factory, inputs kind)
    'splade.doc_encoder': ('splade', lambda s: s.doc_encoder(), 'doc'),
    'splade.query_encoder': ('splade', lambda s: s.query_encoder(), 'query'),
    'splade.scorer': ('splade', lambda s: s.scorer(), 'result'),
    'Splade as a query encoder': ('splade', lambda s: s, 'query'),
    'Splade as a doc encoder': ('splade', lambda s: s, 'doc'),
    'random BERT Splade.doc_encoder': ('tiny', lambda t: Splade(*t, batch_size=2).doc_encoder(), 'doc'),
    'IDFQueryEncoder': ('splade', idf, 'query'),
    'StaticQueryEncoder.binary': ('splade', lambda s: StaticQueryEncoder.binary(s.tokenizer), 'query'),
    'InferenceFreeSplade.query_encoder':
        ('splade', lambda s: InferenceFreeSplade(s.model, s.tokenizer, idf(s)).query_encoder(), 'query'),
    'InferenceFreeSplade.doc_encoder':
        ('splade', lambda s: InferenceFreeSplade(s.model, s.tokenizer, idf(s)).doc_encoder(), 'doc'),
    'AsymmetricSplade.query_encoder': ('splade', lambda s: asymmetric(s).query_encoder(), 'query'),
    'AsymmetricSplade.doc_encoder': ('splade', lambda s: asymmetric(s).doc_encoder(), 'doc'),
    'Prune toks': (None, lambda: Prune(top_n=2), 'toks'),
    'Prune query_toks': (None, lambda: Prune(ratio=0.5, threshold=0.2, fields=['query_toks']), 'query_toks'),
    'query_encoder >> Prune': ('splade', lambda s: s.query_encoder() >> Prune(top_n=3), 'query'),
    'SaeSplade.doc_encoder': ('tiny', lambda t: sae_splade(t).doc_encoder(), 'doc'),
    'SaeSplade.query_encoder': ('tiny', lambda t: sae_splade(t).query_encoder(), 'query'),
    'LatentTerms.doc_encoder': (None, lambda: latent_terms().doc_encoder(), 'doc'),
    'LatentTerms.query_encoder': (None, lambda: latent_terms().query_encoder(), 'query'),
    'SSR.doc_encoder': (None, lambda: ssr().doc_encoder(), 'doc'),
    'SSR.query_encoder': (None, lambda: ssr().query_encoder(), 'query'),
    'SSR.scorer': (None, lambda: ssr().scorer(), 'result'),
    'MaxSimScorer': (None, lambda: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=16, device='cpu').scorer(),
                     'result'),
    'DenseScorer (teacher)': (None, lambda: DenseScorer('all-MiniLM-L6-v2', batch_size=2, device='cpu'), 'result'),
    'RetrieverScorer (teacher)': ('tmp_path', retriever_scorer, 'result'),
    'ZScoreFusion (teacher)': ('tmp_path', lambda folder: ZScoreFusion(
        [retriever_scorer(folder), DenseScorer('all-MiniLM-L6-v2', batch_size=2, device='cpu')], [1., 0.5]), 'result'),
    'MaxSimIndex.scorer': ('token_stores', lambda stores: stores[1].scorer(), 'stored_result'),
}


@pytest.mark.parametrize('case', list(CASES))
def test_conformance(case, request):
    fixture, factory, kind = CASES[case]
    transformer = factory(request.getfixturevalue(fixture)) if fixture else factory()
    check_transformer(transformer, kind)


def test_splade_is_a_transformer_that_encodes_or_scores_by_columns(splade):
    # a result frame with query and text is re-ranked; dropping query leaves a doc frame (encoded), as in pyterrier_dr
    frame = pd.DataFrame({'qid': ['1', '1'], 'query': ['radio waves'] * 2, 'docno': ['a', 'b'],
                          'text': ['radio waves in the ionosphere', 'transistor amplifiers'], 'score': 0., 'rank': 0})
    pd.testing.assert_frame_equal(splade(frame), splade.scorer()(frame))
    assert 'toks' in splade(frame.drop(columns=['query'])).columns
    with pytest.raises(pt.validate.InputValidationError):
        splade(frame.drop(columns=['query', 'text']))


def test_every_registered_kind_implements_the_one_contract():
    for kind in MODEL_KINDS:
        cls = model_class(kind)
        assert issubclass(cls, SparseModel) and cls.kind == kind, kind
        assert not cls.__abstractmethods__, f'{kind} leaves {sorted(cls.__abstractmethods__)} unimplemented'


CORPUS = [{'docno': f'd{i}', 'text': text} for i, text in enumerate(TEXTS * 3)]


@pytest.fixture(scope='module')
def indexes(splade, tmp_path_factory):
    """One SPLADE index with every engine, and a Latent Terms (BM25-scored) index."""
    folder = tmp_path_factory.mktemp('conformance')
    dot = SpladeIndexer(folder / 'dot.lsr', splade, engines=sorted(ENGINES), verbose=False).index(CORPUS)
    bm25 = SpladeIndexer(folder / 'bm25.lsr', latent_terms(), verbose=False).index(CORPUS)
    return {'dot': dot, 'bm25': bm25}


RETRIEVERS = [(scoring, engine, side) for scoring in ('dot', 'bm25') for engine in sorted(ENGINES)
              for side in ('query', 'query_toks') if scoring in get_engine(engine).scorings]


@pytest.mark.parametrize('scoring, engine, side', RETRIEVERS)
def test_retriever_conformance(scoring, engine, side, indexes):
    index = LsrIndex(indexes[scoring].path)  # reopened: the model comes from the index's own copy
    if side == 'query':
        check_retriever(index.retriever(num_results=3, engine=engine), 'query', 3)
    else:  # the conformance vectors' words are no latent ids: real query vectors of this model keep it meaningful
        toks = list(index.model().query_encoder()(pd.DataFrame({'qid': 'q', 'query': TEXTS[:4]}))['query_toks'])
        check_retriever(index.toks_retriever(num_results=3, engine=engine), 'query_toks', 3, samples=toks)


@pytest.fixture(scope='module')
def token_stores(tmp_path_factory):
    """An SSR index and a MaxSim store of the same (MiniLM, 16-d) encoder over the conformance corpus."""
    folder = tmp_path_factory.mktemp('token_stores')
    model = ssr()
    return (model >> SSRIndex(folder / 'ssr', verbose=False).indexer()).index(CORPUS), \
        (model.encoder >> MaxSimIndex(folder / 'store', verbose=False).indexer()).index(CORPUS)


TOKEN_RETRIEVERS = {
    'MaxSimIndex.retriever': lambda index, store: store.retriever(num_results=3),
    'SSRIndex.retriever': lambda index, store: index.retriever(num_results=3),
    'SSR.reranked': lambda index, store: index.ssr.reranked(index, store, depth=3),
}


@pytest.mark.parametrize('case', list(TOKEN_RETRIEVERS))
def test_token_retriever_conformance(case, token_stores):
    check_retriever(TOKEN_RETRIEVERS[case](*token_stores), 'query', 3)


def test_dense_retriever_conformance(tmp_path):
    # the dense base of Latent Terms, a baseline of its own (systems.dense)
    check_retriever(dense_retriever(CORPUS, cache_dir=tmp_path, num_results=3, batch_size=2), 'query', 3)


@pytest.mark.parametrize('make, match', [
    (lambda s: Splade(s.model, s.tokenizer, max_length=513), 'max_length must be >= 3 and <= 512'),
    (lambda s: LatentTerms('all-MiniLM-L6-v2', max_length=10 ** 9), 'max_length must be >= 3 and <= 512'),
    (lambda s: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=8, doc_max_length=600), 'doc_max_length must be'),
    (lambda s: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=8, query_max_length=2), 'query_max_length must be'),
    (lambda s: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=0), 'dim must be >= 1'),
    (lambda s: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=8, batch_size=0), 'batch_size must be >= 1'),
    (lambda s: LatentTerms('all-MiniLM-L6-v2', sqrt_tf='no'), 'sqrt_tf must be True or False'),
    (lambda s: LatentTerms('all-MiniLM-L6-v2', include_dense='no'), 'include_dense must be True or False'),
])
def test_every_kind_refuses_settings_its_model_cannot_serve(make, match, splade):
    # a max_length past the model's positions used to crash inside transformers on the first long text, at encoding
    # time; dim=0 and string flags were accepted and scored everything alike
    with pytest.raises((ValueError, TypeError), match=match):
        make(splade)
