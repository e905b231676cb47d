"""BMP and Seismic next to PISA on one small real index (200 Vaswani documents encoded by the offline SPLADE-tiny)."""
import sys

import numpy as np
import pandas as pd
import pytest

from pyterrier_lsr import LsrIndex, SpladeIndexer
from pyterrier_lsr.index import VectorStore, VectorWriter, get_engine
from pyterrier_lsr.index.engines.native import require

NUM_DOCS = 200


@pytest.fixture(scope='module')
def engine_docs(vaswani_docs):
    return [dict(d) for d in vaswani_docs[:NUM_DOCS]] + [{'docno': 'blank', 'text': ''}]


@pytest.fixture(scope='module')
def engine_index(splade, engine_docs, tmp_path_factory):
    return SpladeIndexer(tmp_path_factory.mktemp('engines') / 'e.lsr', splade, verbose=False,
                         engines=('pisa', 'bmp', 'seismic')).index(engine_docs)


@pytest.fixture(scope='module')
def queries(splade, vaswani):
    return splade.query_encoder()(vaswani.get_topics().head(60))  # enough for Seismic to reorder a batch


def top(results, qid, n=10):
    got = results[results.qid == qid].sort_values('rank')
    return list(got.docno[:n]), list(got.score[:n])


def same_ranking(got, expected):
    """Equal top lists up to the order of equal scores: the same scores, and the same documents at each score."""
    assert list(got[1]) == list(expected[1])
    by_score = lambda docnos, scores: sorted(zip(scores, docnos))  # noqa: E731
    # A tie at the cut may keep different documents of the last score; every other score holds the same ones.
    last = expected[1][-1] if len(expected[1]) else None
    assert [p for p in by_score(*got) if p[0] != last] == [p for p in by_score(*expected) if p[0] != last]


@pytest.mark.parametrize('engine, params', [('seismic', {'exact': True}), ('bmp', {})])
@pytest.mark.parametrize('depth', [10, 1000])
def test_exact_modes_are_pisa(engine_index, queries, engine, params, depth):
    """Exact BMP and Seismic return PISA's scores and ranking (BMP ranks with 8-bit levels and Seismic with float16:
    both re-score their candidates with PISA's integers and deepen until the top is certain)."""
    pisa = engine_index.toks_retriever(num_results=depth)(queries)
    got = engine_index.toks_retriever(num_results=depth, engine=engine, **params)(queries)
    assert list(got.columns) == list(pisa.columns) and got.docno.dtype == pisa.docno.dtype
    for qid in queries.qid:
        same_ranking(top(got, qid, depth), top(pisa, qid, depth))


@pytest.mark.parametrize('engine, params', [('pisa', dict(threads=2)), ('bmp', {}), ('bmp', dict(alpha=0.8)),
                                            ('seismic', dict(threads=2)), ('seismic', dict(exact=True, threads=2))])
def test_a_batch_equals_one_query_at_a_time(engine_index, queries, engine, params):
    """A frame of many queries takes the engines' own batch paths (PISA's and Seismic's threads, Seismic's exact
    queries deepened together): the results are those of one-query calls, row for row."""
    some = queries.head(30)
    alone = engine_index.toks_retriever(num_results=20, engine=engine, **dict(params, threads=1))
    expected = pd.concat([alone(some.iloc[[i]]) for i in range(len(some))], ignore_index=True)
    got = engine_index.toks_retriever(num_results=20, engine=engine, **params)(some)
    order = lambda frame: frame.sort_values(['qid', 'rank'], kind='stable').reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(order(got), order(expected))
    assert len(got) > 20 * 25


def test_approximate_settings_run_and_stay_close(engine_index, queries):
    pisa = engine_index.toks_retriever(num_results=10)(queries)
    every = engine_index.toks_retriever(num_results=NUM_DOCS + 1)(queries)[['qid', 'docno', 'score']]
    for engine, params in [('bmp', dict(alpha=0.8, beta=0.8)), ('seismic', dict(query_cut=5, heap_factor=0.7))]:
        res = engine_index.toks_retriever(num_results=10, engine=engine, **params)(queries)
        assert res.groupby('qid').size().eq(10).all()
        recall = np.mean([len(set(top(res, q)[0]) & set(top(pisa, q)[0])) / 10 for q in queries.qid])
        assert 0.5 <= recall <= 1
        # Candidates come back with PISA's scores (Seismic's own where its arithmetic is exact): never above PISA's
        # best, and each document's score is the one PISA gives it.
        assert all(top(res, q)[1][0] <= top(pisa, q)[1][0] for q in queries.qid)
        merged = res.merge(every, on=['qid', 'docno'], suffixes=('', '_pisa'), validate='one_to_one')
        assert len(merged) == len(res) and (merged.score == merged.score_pisa).all(), engine


def test_empty_and_unknown_query_toks(engine_index):
    inp = pd.DataFrame({'qid': ['empty', 'unknown', 'real'], 'query_toks': [{}, {'zzzz-never-seen': 1.0},
                                                                            {'reactor': 1.5, 'nuclear': 0.5}]})
    for engine, params in [('pisa', {}), ('bmp', {}), ('seismic', {}), ('seismic', {'exact': True})]:
        retriever = engine_index.toks_retriever(num_results=5, engine=engine, **params)
        res = retriever(inp)
        assert set(res.qid) == {'real'} and len(res) == 5 and list(res['rank']) == list(range(5)), engine
        empty = retriever(inp.iloc[:0])
        assert len(empty) == 0 and {'qid', 'docno', 'score', 'rank'} <= set(empty.columns)


def test_threads(engine_index, queries):
    one = engine_index.toks_retriever(num_results=10, engine='seismic')(queries)
    two = engine_index.toks_retriever(num_results=10, engine='seismic', threads=2)(queries)
    pd.testing.assert_frame_equal(one, two)
    with pytest.raises(ValueError, match='threads=1'):
        engine_index.toks_retriever(engine='bmp', threads=2)
    with pytest.raises(ValueError, match='threads'):
        engine_index.toks_retriever(engine='seismic', threads=0)


def test_vectors_round_trip_through_csr(splade, engine_docs, tmp_path):
    vectors = splade.encode([d['text'] for d in engine_docs[:30]]) + [{}]
    docnos = [d['docno'] for d in engine_docs[:30]] + ['empty']
    writer = VectorWriter(tmp_path / 'v', shard_size=7)  # several shards, one ending with the empty vector
    for docno, vector in zip(docnos, vectors):
        writer.add(docno, vector)
    store = writer.close()
    assert len(store.manifest['shards']) == 5
    got_docnos, terms, indptr, ids, weights = VectorStore(tmp_path / 'v').to_csr()
    assert got_docnos == docnos and len(set(terms)) == len(terms)
    rebuilt = [{terms[t]: w for t, w in zip(ids[a:b], weights[a:b])} for a, b in zip(indptr[:-1], indptr[1:])]
    expected = [{t: np.float32(w) for t, w in v.items()} for v in vectors]
    assert rebuilt == expected
    assert [dict(v) for _, v in store] == expected
    # A conversion applies shard by shard (each shard's weights at once) and gives the values' type.
    seen = []
    *_, impacts = store.to_csr(lambda w: seen.append(len(w)) or (w * 100).astype(np.int32))
    assert impacts.dtype == np.int32 and (impacts == (weights * 100).astype(np.int32)).all()
    assert seen == [int(indptr[min(b, len(docnos))] - indptr[a]) for a, b in zip(range(0, 31, 7), range(7, 38, 7))]


def test_build_engine_on_existing_index(splade, engine_docs, queries, tmp_path):
    index = SpladeIndexer(tmp_path / 'p.lsr', splade, verbose=False).index(engine_docs[:60])
    with pytest.raises(ValueError, match="build_engine\\('bmp'\\)"):
        index.toks_retriever(engine='bmp')
    index.build_engine('bmp', block_size=16)
    reopened = LsrIndex(tmp_path / 'p.lsr')
    assert reopened.meta['engines']['bmp']['block_size'] == 16 and 'bmp/index.bmp' in reopened.meta['files']
    res = reopened.toks_retriever(num_results=5, engine='bmp')(queries)
    assert len(res) > 0 and set(res.docno) <= {d['docno'] for d in engine_docs[:60]}
    with pytest.raises(FileExistsError, match='overwrite'):
        index.build_engine('bmp')
    index.build_engine('bmp', overwrite=True, block_size=8).build_engine('seismic', n_postings=50)
    reopened = LsrIndex(tmp_path / 'p.lsr')
    assert reopened.meta['engines']['bmp']['block_size'] == 8 and set(reopened.meta['engines']) == {
        'pisa', 'bmp', 'seismic'}
    with pytest.raises(ValueError, match='block_size'):
        index.build_engine('bmp', overwrite=True, block_size=300)
    assert LsrIndex(tmp_path / 'p.lsr').meta['engines']['bmp']['block_size'] == 8  # a failed rebuild changes nothing


def test_unknown_and_missing_engines(engine_index, monkeypatch):
    with pytest.raises(ValueError, match='unknown engine'):
        get_engine('faiss')
    with monkeypatch.context() as m:
        m.setitem(sys.modules, 'seismic', None)  # as if pyseismic-lsr were not installed
        with pytest.raises(ImportError, match=r'pyterrier-lsr\[engines\]'):
            require('seismic', 'pyseismic-lsr')
    with pytest.raises(ValueError, match='has no .* engine'):  # checked before the retriever is labelled
        engine_index.retriever(engine='faiss')
    assert engine_index.retriever(engine=None).toks_retriever.engine == 'pisa'  # untuned: PISA
    monkeypatch.setitem(sys.modules, 'bmp', None)  # as if bmp were not installed
    with pytest.raises(ImportError, match=r'bmp.*pyterrier-lsr\[engines\]'):
        engine_index.toks_retriever(engine='bmp')


def test_report_engine_columns(engine_index, queries):
    from pyterrier_lsr.report import engine_costs, engine_footprint
    sizes = {name: engine_footprint(engine_index.path, name)['engine_mb'] for name in ('pisa', 'bmp', 'seismic')}
    files = {name: record['bytes'] for name, record in engine_index.meta['files'].items()}
    assert sizes['bmp'] * 2 ** 20 == sum(size for name, size in files.items() if name.startswith('bmp/'))
    vectors = sum(size for name, size in files.items() if name.startswith('vectors/'))
    assert all(mb > 0 for mb in sizes.values()) and sizes['pisa'] * 2 ** 20 < sum(files.values()) - vectors
    costs, results = engine_costs(engine_index, 'seismic', queries.head(5), num_results=10, query_cut=5)
    assert costs['engine'] == 'seismic' and costs['engine_build_s'] > 0
    assert 0 < costs['ms_median'] <= costs['ms_p99'] and costs['ms_batch'] > 0
    assert results.groupby('qid').size().eq(10).all() and set(results.qid) == set(queries.qid[:5])


@pytest.mark.parametrize('engine', ['pisa', 'bmp', 'seismic'])
def test_query_side_results_equal_the_composed_pipeline(engine_index, vaswani, engine):
    """index.retriever() encodes (and prunes) the queries without the frames of the composed pipeline: same results,
    columns and dtypes, an extra input column kept; a frame with a toks column takes the composed path (Prune's
    default prunes that column too)."""
    from pyterrier_lsr import IDFQueryEncoder, Prune
    topics = vaswani.get_topics().head(20).assign(extra=range(20))
    idf = IDFQueryEncoder.from_index(engine_index)
    for side in (idf, idf >> Prune(top_n=3), engine_index.model().query_encoder() >> Prune(ratio=0.3)):
        retriever = engine_index.retriever(10, engine, query_encoder=side)
        composed = side >> engine_index.toks_retriever(10, engine)
        pd.testing.assert_frame_equal(retriever(topics), composed(topics))
        pd.testing.assert_frame_equal(retriever(topics.head(0)), composed(topics.head(0)))
    with_toks = topics.assign(toks=[{'radio': 2.0, 'wave': 0.5}] * 20)
    pruned = engine_index.retriever(10, engine, query_encoder=idf >> Prune(top_n=1))(with_toks)
    assert all(len(t) == 1 for t in pruned['toks'])
