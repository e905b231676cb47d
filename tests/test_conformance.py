"""Every public transformer that can be built from the offline models passes :func:`conformance.check_transformer`."""

import pandas as pd
import pyterrier as pt
import pytest
from conformance import TEXTS, check_retriever, check_transformer

from pyterrier_lsr import (
    IDFQueryEncoder,
    LatentTerms,
    LsrIndex,
    MultiVector,
    Prune,
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
from pyterrier_lsr.systems.dense import dense_retriever
from pyterrier_lsr.train import DenseScorer, RetrieverScorer, ZScoreFusion


def idf(splade):
    return IDFQueryEncoder.from_corpus(splade.tokenizer, TEXTS * 2 + ['nuclear physics'])


def retriever_scorer(folder):
    # BM25 over the conformance corpus, candidates matched by text (each text is in the corpus, so scores are real)
    corpus = [{'docno': f'd{i}', 'text': text} for i, text in enumerate(TEXTS)]
    return RetrieverScorer(bm25_index(folder / 'bm25.pisa', corpus).bm25(), {d['docno']: d['text'] for d in corpus})


@pytest.fixture(scope='module')
def examples():
    """Each registered kind's :meth:`~pyterrier_lsr.SparseModel.example`, made once per module."""
    made = {}

    def example(kind):
        if kind not in made:
            made[kind] = model_class(kind).example()
        return made[kind]
    return example


# every registered kind, from the registry: its two encoders, its scorer, and the model itself on either input
KIND_CASES = {  # name -> (make from the model, inputs kind)
    'doc_encoder': (lambda m: m.doc_encoder(), 'doc'),
    'query_encoder': (lambda m: m.query_encoder(), 'query'),
    'scorer': (lambda m: m.scorer(), 'result'),
    'model on queries': (lambda m: m, 'query'),
    'model on documents': (lambda m: m, 'doc'),
}


@pytest.mark.parametrize('kind, case', [(kind, case) for kind in MODEL_KINDS for case in KIND_CASES])
def test_kind_conformance(kind, case, examples):
    make, inputs = KIND_CASES[case]
    check_transformer(make(examples(kind)), inputs)


def test_every_registered_kind_has_an_offline_example(examples):
    for kind in MODEL_KINDS:
        assert type(examples(kind)) is model_class(kind), f'{kind}: example() gives {type(examples(kind))}'


CASES = {  # transformers that are no model kind: name -> (fixtures, factory, inputs kind)
    'random BERT Splade.doc_encoder': ('tiny', lambda t: Splade(*t, batch_size=2).doc_encoder(), 'doc'),
    'IDFQueryEncoder': ('splade', idf, 'query'),
    'StaticQueryEncoder.binary': ('splade', lambda s: StaticQueryEncoder.binary(s.tokenizer), 'query'),
    'Prune toks': (None, lambda: Prune(top_n=2), 'toks'),
    'Prune query_toks': (None, lambda: Prune(ratio=0.5, threshold=0.2, fields=['query_toks']), 'query_toks'),
    'query_encoder >> Prune': ('splade', lambda s: s.query_encoder() >> Prune(top_n=3), 'query'),
    'MaxSimScorer': (None, lambda: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=16, device='cpu').scorer(),
                     'result'),
    'MultiVector (its MaxSim scorer)': (None, lambda: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=16,
                                                                                device='cpu'), 'result'),
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


def test_a_kind_without_an_example_fails_the_contract():
    # what test_every_registered_kind_implements_the_one_contract then reports, naming example
    class Abstract(SparseModel):
        kind = 'abstract'
        encode_docs = encode_queries = write_folder = load_folder = None
    assert Abstract.__abstractmethods__ == {'example'}


CORPUS = [{'docno': f'd{i}', 'text': text} for i, text in enumerate(TEXTS * 3)]


@pytest.fixture(scope='module')
def indexes(examples, tmp_path_factory):
    """One index of each scoring: SPLADE's (dot) with every engine, and Latent Terms' (BM25-scored)."""
    folder = tmp_path_factory.mktemp('conformance')
    dot = SpladeIndexer(folder / 'dot.lsr', examples('splade'), engines=sorted(ENGINES), verbose=False).index(CORPUS)
    bm25 = SpladeIndexer(folder / 'bm25.lsr', examples('latent-terms'), verbose=False).index(CORPUS)
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
def token_stores(examples, tmp_path_factory):
    """An SSR index and a MaxSim store of the same (MiniLM, 16-d) encoder over the conformance corpus."""
    folder = tmp_path_factory.mktemp('token_stores')
    model = examples('ssr')
    return SSRIndex(folder / 'ssr', verbose=False).indexer(model).index(CORPUS), \
        MaxSimIndex(folder / 'store', verbose=False).indexer(model.encoder).index(CORPUS)


TOKEN_RETRIEVERS = {
    'MaxSimIndex.retriever': lambda index, store: store.retriever(num_results=3),
    'MaxSimIndex % 3': lambda index, store: (store % 3).compile(),
    'SSRIndex.retriever': lambda index, store: index.retriever(num_results=3),
    'SSRIndex % 3': lambda index, store: (index % 3).compile(),
    'SSR.reranked': lambda index, store: index.model().reranked(index, store, depth=3),
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
    (lambda s: MultiVector.from_backbone('all-MiniLM-L6-v2', dim=8, max_length=600), 'max_length must be'),
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
