"""PyTerrier's index idioms on LsrIndex (get_corpus_iter, scorer, % k as a retriever), encoders and retrievers that
compare equal when they compute the same thing, retrievers that keep their name inside pipelines, and one vocabulary
across the public API."""
import importlib
import inspect
import pkgutil

import pandas as pd
import pyterrier as pt
import pytest
from pyterrier.measures import nDCG

import pyterrier_lsr
from pyterrier_lsr import IDFQueryEncoder, LsrIndex, SpladeIndexer
from pyterrier_lsr.index.quantization import quantize
from pyterrier_lsr.index.retrievers import DefaultRetriever, QueryRetriever

TEXTS = ['the nuclear reactor physics', 'electron density in the ionosphere', 'transistor amplifier circuit noise',
         'dielectric constant of liquids', 'radio wave measurement', 'the cat sat on the dog',
         'nuclear physics of the reactor core', 'noise in radio circuits']
DOCS = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(TEXTS)]
TOPICS = pd.DataFrame({'qid': ['1', '2'], 'query': ['reactor physics', 'radio noise']})
QRELS = pd.DataFrame({'qid': ['1', '2'], 'docno': ['d0', 'd7'], 'label': [1, 1]})


@pytest.fixture(scope='module')
def index(splade, tmp_path_factory):
    return SpladeIndexer(tmp_path_factory.mktemp('idioms') / 'x.lsr', splade, verbose=False).index(DOCS)


def test_get_corpus_iter_streams_the_stored_vectors(index, splade, tmp_path):
    docs = list(index.get_corpus_iter(verbose=False))
    assert [d['docno'] for d in docs] == [d['docno'] for d in DOCS]
    for doc, vector in zip(docs, splade.encode_docs(TEXTS)):
        assert doc['toks'].keys() == vector.keys()
        assert all(abs(doc['toks'][t] - w) < 1e-6 for t, w in vector.items())
    # what an indexer takes: the same index again, from the stored vectors alone
    again = LsrIndex(tmp_path / 'again.lsr', splade, verbose=False).index(index.get_corpus_iter(verbose=False))
    pd.testing.assert_frame_equal(again.retriever()(TOPICS), index.retriever()(TOPICS))


def test_scorer_is_the_dot_product_of_the_stored_vectors(index, splade):
    queries = splade.query_encoder()(TOPICS)
    candidates = queries.merge(pd.DataFrame({'docno': ['d6', 'd0', 'd3', 'd7']}), how='cross')
    scored = index.scorer()(candidates)
    stored = dict((d['docno'], d['toks']) for d in index.get_corpus_iter(verbose=False))
    for row in scored.itertuples():
        query = quantize(dict(queries.set_index('qid').loc[row.qid, 'query_toks']), index.scale)
        doc = quantize(stored[row.docno], index.scale)
        assert row.score == sum(w * doc.get(t, 0) for t, w in query.items())  # brute force, PISA's integers
    # in the retrievers' units: the scores the engine gives the same documents
    retrieved = index.toks_retriever()(queries).set_index(['qid', 'docno'])['score']
    for row in scored.itertuples():
        if (row.qid, row.docno) in retrieved.index:
            assert row.score == pytest.approx(retrieved.loc[(row.qid, row.docno)])
    for qid, group in scored.groupby('qid'):
        assert list(group.sort_values('rank')['score']) == sorted(group['score'], reverse=True)
        assert list(group.sort_values('rank')['rank']) == list(range(len(group)))


def test_scorer_names_an_unknown_docno(index, splade):
    candidates = splade.query_encoder()(TOPICS[:1]).assign(docno='nope')
    with pytest.raises(KeyError, match="'nope'"):
        index.scorer()(candidates)


def test_scorer_keeps_its_columns_on_an_empty_frame(index):
    empty = pd.DataFrame(columns=['qid', 'query_toks', 'docno'])
    assert {'qid', 'docno', 'score', 'rank'} <= set(index.scorer()(empty).columns)


def test_rank_cutoff_on_an_index_is_a_retriever_asking_the_engine(index):
    cut = (index % 3).compile()  # PyTerrier fuses the cutoff into the index's retriever
    assert isinstance(cut, DefaultRetriever) and cut.num_results == 3
    full = index(TOPICS)
    got = cut(TOPICS)
    assert got.groupby('qid').size().max() == 3
    for qid, group in got.groupby('qid'):
        top = full[full['qid'] == qid].sort_values('rank').head(3)
        assert list(group.sort_values('rank')['score']) == list(top['score'])


def test_encoders_of_one_model_compare_equal(splade, tiny):
    from pyterrier_lsr import Splade
    assert splade.query_encoder() == splade.query_encoder()
    assert hash(splade.query_encoder()) == hash(splade.query_encoder())
    assert splade.query_encoder() != splade.doc_encoder()
    assert splade.query_encoder() != splade.query_encoder(batch_size=3)
    assert splade.query_encoder() != Splade(*tiny).query_encoder()


def test_idf_encoders_of_one_table_compare_equal(index):
    assert IDFQueryEncoder.from_index(index) == IDFQueryEncoder.from_index(index)
    assert IDFQueryEncoder.from_index(index) != IDFQueryEncoder.from_index(index, max_length=4)


def test_experiment_encodes_the_queries_once_for_systems_sharing_an_encoder(index, splade, monkeypatch):
    calls = []
    original = type(splade).encode_queries

    def counting(self, texts, *args, **kwargs):
        calls.append(len(texts))
        return original(self, texts, *args, **kwargs)
    monkeypatch.setattr(type(splade), 'encode_queries', counting)
    systems = [splade.query_encoder() >> index.toks_retriever(), splade.query_encoder() >> index.toks_retriever(5)]
    pt.Experiment(systems, TOPICS, QRELS, [nDCG @ 10], precompute_prefix=True)
    assert calls == [len(TOPICS)]
    calls.clear()
    pt.Experiment(systems, TOPICS, QRELS, [nDCG @ 10])
    assert calls == [len(TOPICS), len(TOPICS)]  # the spy counts: without precomputation each system encodes


def test_retrievers_keep_their_name_inside_pipelines(index):
    retriever = index.retriever()
    pipeline = retriever >> pt.Transformer.identity()
    assert isinstance(retriever, QueryRetriever) and pipeline[0] is retriever
    assert retriever.label in str(pipeline) and len(pipeline) == 2
    pt.inspect.transformer_outputs(retriever, ['qid', 'query'])  # inspectable: it says what it returns
    assert index.retriever() == index.retriever() and index.retriever() != index.retriever(5)
    cut = (retriever % 5).compile()
    assert isinstance(cut, QueryRetriever) and cut.label == retriever.label
    assert cut(TOPICS).groupby('qid').size().max() <= 5


# -- one vocabulary ---------------------------------------------------------------------------------------------------
# Names the package no longer uses for its concepts (docs/model-kinds.md, "The words"): precision is `precision`,
# truncation `max_length` (+ `query_max_length`), texts per forward pass `batch_size`, an index's model `model`.
RETIRED = {'bf16', 'texts_per_batch', 'rows_per_batch', 'doc_max_length', 'chunk_size'}
INDEX_RETIRED = {'encoder', 'ssr'}
# names of PyTerrier's or sentence-transformers' own classes, which would read as theirs
BORROWED = {'SparseEncoder', 'Retriever', 'Indexer', 'Transformer', 'SentenceTransformer', 'Router'}
# per-call work (a batch of queries or texts, a transformer in a pipeline): silent by default; the rest shows progress
PER_CALL = {'encode', 'encode_docs', 'encode_queries', 'embed', 'encode_vectors', 'query_encoder', 'doc_encoder',
            'retriever', 'toks_retriever', 'scorer', 'transform'}


def public_objects():
    modules = [pyterrier_lsr] + [importlib.import_module(m.name) for m in
                                 pkgutil.walk_packages(pyterrier_lsr.__path__, 'pyterrier_lsr.')
                                 if 'pt_docs' not in m.name]
    seen = {}
    for module in modules:
        for name in getattr(module, '__all__', []):
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith('pyterrier_lsr'):
                seen[f'{obj.__module__}.{obj.__qualname__}'] = obj
    return seen


def callables_of(obj):
    if inspect.isfunction(obj):
        yield obj.__name__, obj
    else:
        for name, member in vars(obj).items():
            if isinstance(member, (classmethod, staticmethod)):
                member = member.__func__
            if (not name.startswith('_') or name == '__init__') and inspect.isfunction(member):
                yield name, member


PUBLIC = public_objects()


def test_the_exports_are_found():
    assert 'pyterrier_lsr.index.artifact.LsrIndex' in PUBLIC and len(PUBLIC) > 40


@pytest.mark.parametrize('qualname', sorted(PUBLIC))
def test_one_vocabulary(qualname):
    obj = PUBLIC[qualname]
    assert obj.__name__ not in BORROWED, f'{qualname} takes the name of a PyTerrier or sentence-transformers class'
    is_index = obj is SpladeIndexer or inspect.isclass(obj) and issubclass(obj, pt.Indexer)
    transformer = inspect.isclass(obj) and issubclass(obj, pt.Transformer) and not is_index
    for name, function in callables_of(obj):
        parameters = inspect.signature(function).parameters
        retired = set(parameters) & (RETIRED | (INDEX_RETIRED if is_index else set()))
        assert not retired, f'{qualname}.{name} takes {sorted(retired)}: see the words in docs/model-kinds.md'
        verbose = parameters.get('verbose')
        if verbose is not None and verbose.default is not inspect.Parameter.empty:
            per_call = inspect.isclass(obj) and (name in PER_CALL or name == '__init__' and transformer)
            assert verbose.default is not per_call, \
                f'{qualname}.{name}: verbose defaults to {verbose.default}; progress is on by default for long work ' \
                'only (docs/model-kinds.md)'


def test_every_index_takes_and_gives_its_model_one_way():
    from pyterrier_lsr import MaxSimIndex, SSRIndex
    for cls in (LsrIndex, MaxSimIndex, SSRIndex):
        assert list(inspect.signature(cls).parameters)[:2] == ['path', 'model'], cls
        assert inspect.isfunction(getattr(cls, 'model')), cls  # a method, as every reader of the folder is
    for cls in (LsrIndex, MaxSimIndex):  # the indexes that store vectors (SSR's holds codes)
        assert inspect.isfunction(getattr(cls, 'vectors')), cls
    assert list(inspect.signature(SpladeIndexer).parameters)[:2] == ['path', 'model']
