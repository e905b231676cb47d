import json
from pathlib import Path

import pandas as pd
import pytest

from pyterrier_lsr import LsrIndex, SpladeIndexer
from pyterrier_lsr.index import quantize

QUERIES = pd.DataFrame(
    {
        'qid': ['1', '2', '3'],
        'query': [
            'MEASUREMENT OF DIELECTRIC CONSTANT OF LIQUIDS',
            'electron density in the ionosphere',
            'transistor amplifier',
        ],
    }
)


@pytest.fixture(scope='module')
def small_corpus(vaswani_docs):
    docs = [dict(d) for d in vaswani_docs[:300]]
    return docs + [{'docno': 'blank', 'text': ''}, {'docno': 'none', 'text': None}]


@pytest.fixture(scope='module')
def small_index(splade, small_corpus, tmp_path_factory):
    return SpladeIndexer(tmp_path_factory.mktemp('idx') / 'small.lsr', splade, verbose=False).index(small_corpus)


def test_no_document_dropped(small_index, small_corpus):
    assert small_index.num_docs() == len(small_corpus) == small_index.pisa().num_docs()


def test_pisa_ranks_as_brute_force_dot_product(small_index, small_corpus, splade):
    scale = small_index.scale
    docs = {
        d['docno']: quantize(v, scale) for d, v in zip(small_corpus, splade.encode([d['text'] for d in small_corpus]))
    }
    results = small_index.retriever(num_results=len(small_corpus))(QUERIES)
    for (qid, query), qvec in zip(QUERIES.itertuples(index=False), splade.encode(QUERIES['query'].tolist())):
        q = quantize(qvec, scale)
        brute = {docno: sum(w * d.get(t, 0) for t, w in q.items()) for docno, d in docs.items()}
        brute = {docno: s for docno, s in brute.items() if s > 0}
        got = results[results.qid == qid]
        assert len(brute) > 10
        assert dict(zip(got.docno, got.score)) == pytest.approx(brute, rel=0, abs=0)
        assert list(got.sort_values('rank').score) == sorted(brute.values(), reverse=True)
    assert 'blank' not in set(results.docno) and 'none' not in set(results.docno)


def test_existing_index_needs_overwrite(small_index, splade, small_corpus):
    with pytest.raises(FileExistsError, match='overwrite'):
        SpladeIndexer(small_index.path, splade, verbose=False).index(small_corpus[:5])
    again = SpladeIndexer(small_index.path.parent / 'other.lsr', splade, verbose=False).index(small_corpus[:5])
    again = SpladeIndexer(again.path, splade, overwrite=True, verbose=False).index(small_corpus[:7])
    assert again.num_docs() == 7


def test_pipeline_indexing_and_reopen(splade, small_corpus, tmp_path):
    path = tmp_path / 'pipe.lsr'
    index = (splade.doc_encoder() >> SpladeIndexer(path, splade, verbose=False)).index(small_corpus[:50])
    assert index.num_docs() == 50
    # The doc encoder hands its model to the indexer, so the index reopens alone and retrieves like the model.
    res = LsrIndex(path).retriever(num_results=5)(QUERIES)
    assert len(res) == 15 and res.groupby('qid')['rank'].min().eq(0).all()
    pd.testing.assert_frame_equal(res, LsrIndex(path, splade).retriever(num_results=5)(QUERIES))
    # Built from toks alone, an index records no model and says so.
    toks = splade.doc_encoder()(pd.DataFrame(small_corpus[:5]))
    bare = SpladeIndexer(tmp_path / 'bare.lsr', verbose=False).index(toks.to_dict('records'))
    with pytest.raises(ValueError, match='records no model'):
        LsrIndex(bare.path).retriever()


def test_reopen_reloads_recorded_model(small_index, splade):
    recorded = json.loads((small_index.path / 'lsr.json').read_text())['model']
    assert recorded == {'path': 'model', 'kind': 'splade', 'name': splade.name}
    reopened = LsrIndex(small_index.path)
    res = reopened.retriever(num_results=10)(QUERIES)
    pd.testing.assert_frame_equal(res, small_index.retriever(num_results=10)(QUERIES))


def test_default_experiment_name_is_short_and_save_dir_accepts_it(small_index, splade, tmp_path):
    import pyterrier as pt
    from pyterrier.measures import nDCG
    retriever = LsrIndex(small_index.path).retriever()
    name = f"SPLADE ({Path(splade.name).name})"
    assert repr(retriever) == name  # the recorded model's name, not the folder of its copy
    qrels = pd.DataFrame({'qid': QUERIES['qid'], 'docno': ['d0'] * len(QUERIES), 'label': 1})
    table = pt.Experiment([retriever], QUERIES, qrels, [nDCG @ 10], save_dir=str(tmp_path))
    assert table['name'].tolist() == [name] and (tmp_path / f'{name}.res.gz').exists()
    assert pt.inspect.transformer_outputs(retriever, ['qid', 'query']) == ['qid', 'query', 'docno', 'score', 'rank']


def test_empty_query_toks_retrieve_nothing(small_index):
    frame = pd.DataFrame({'qid': ['1', '2'], 'query': ['', 'x'], 'query_toks': [{}, {'nonexistentterm': 1.0}]})
    res = small_index.toks_retriever()(frame)
    assert len(res) == 0 and 'docno' in res.columns


def test_bad_inputs(splade, tmp_path):
    with pytest.raises(ValueError, match='empty collection'):
        SpladeIndexer(tmp_path / 'empty.lsr', splade, verbose=False).index([])
    with pytest.raises(KeyError, match='text'):
        SpladeIndexer(tmp_path / 'bad.lsr', splade, verbose=False).index([{'docno': '1', 'body': 'x'}])
    with pytest.raises(ValueError, match='scale'):
        SpladeIndexer(tmp_path / 'bad2.lsr', splade, scale=0)
    # Impacts int(w * scale) of the largest weight must fit the engines' 32 bits.
    with pytest.raises(ValueError, match='scale'):
        SpladeIndexer(tmp_path / 'bad3.lsr', splade, scale=3e6)
    missing = LsrIndex(tmp_path / 'nothing')  # an artifact that is not built yet: reading it is the error
    assert not missing.built()
    with pytest.raises(FileNotFoundError, match='no pyterrier-lsr index'):
        missing.num_docs()
    with pytest.raises(FileNotFoundError, match='no pyterrier-lsr index'):
        missing.retriever()


def test_quantize():
    assert quantize({'a': 1.239, 'b': 0.004, 'c': 0.0, 'd': 2.0}, 100) == {'a': 123, 'd': 200}
    assert quantize({}, 100) == {}


def test_cased_terms_survive_pisa_lowercasing(tmp_path):
    from pyterrier_lsr.index import pisa_term

    docs = [
        {'docno': 'lower', 'toks': {'cd': 1.0}},
        {'docno': 'upper', 'toks': {'Cd': 2.0}},
        {'docno': 'caret', 'toks': {'^cd': 3.0, 'ÉTÉ': 1.0}},
    ]
    index = SpladeIndexer(tmp_path / 'cased.lsr', verbose=False).index(docs)
    queries = pd.DataFrame(
        {
            'qid': ['1', '2', '3', '4'],
            'query': ['', '', '', ''],
            'query_toks': [{'cd': 1.0}, {'Cd': 1.0}, {'^cd': 1.0}, {'ÉTÉ': 1.0}],
        }
    )
    res = index.toks_retriever()(queries)
    assert dict(zip(res.qid, res.docno)) == {'1': 'lower', '2': 'upper', '3': 'caret', '4': 'caret'}
    assert len({pisa_term(t) for t in ['cd', 'Cd', '^cd', 'cD']}) == 4
    assert index.document_frequencies() == {'cd': 1, 'Cd': 1, '^cd': 1, 'ÉTÉ': 1}


def test_progress_bar_counts_whole_encoded_chunks(tmp_path, monkeypatch):
    # Per-document updates after a chunk was encoded made the first one report a chunk's time per document.
    import pyterrier_lsr.index.artifact as artifact
    updates = []

    class Recorder(artifact.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(artifact, 'tqdm', Recorder)
    docs = [{'docno': f'd{i}', 'toks': {'a': 1.0 + i}} for i in range(12)]
    index = LsrIndex(tmp_path / 'x.lsr', shard_size=5, verbose=True).index(docs)
    assert updates == [5, 5, 2] and index.num_docs() == 12


def test_building_and_querying_print_nothing(tmp_path, capfd):
    # PISA's C++ log lines and progress fragments go to the file descriptors, past Python's sys.stdout.
    docs = [{'docno': f'd{i}', 'toks': {'a': 1.0 + i, f't{i}': 2.0}} for i in range(20)]
    index = LsrIndex(tmp_path / 'x.lsr', verbose=False).index(docs)
    index.toks_retriever()(pd.DataFrame({'qid': ['q'], 'query_toks': [{'a': 1.0}]}))
    out, err = capfd.readouterr()
    assert out == '' and err == '', (out, err)
