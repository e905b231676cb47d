"""Engines under hostile input: every parameter checked before native code sees it, no silent wrong result.

Probes that hang or abort the process on a faulty engine (PISA's negative threads, Rust allocating ``num_results`` up
front) run in a subprocess with a timeout, so a regression fails the test instead of the test run.
"""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyterrier_lsr import SpladeIndexer
from pyterrier_lsr.core.checks import MAX_WEIGHT, WeightError
from pyterrier_lsr.index import pisa_term, quantize

ENGINES = ('pisa', 'bmp', 'seismic')
EXACT = [('bmp', {}), ('seismic', {'exact': True})]
ALL_RETRIEVERS = [('pisa', {})] + EXACT + [('bmp', {'alpha': 0.8}), ('bmp', {'beta': 0.5}), ('seismic', {})]


def build(path, vectors, **kwargs):
    docs = [{'docno': f'd{i}', 'toks': v} for i, v in enumerate(vectors)]
    return SpladeIndexer(path, verbose=False, engines=ENGINES, **kwargs).index(docs)


def ask(index, queries, engine, num_results=10, **params):
    frame = pd.DataFrame({'qid': [str(i) for i in range(len(queries))], 'query_toks': queries})
    return index.toks_retriever(num_results=num_results, engine=engine, **params)(frame)


def ranking(results, qid):
    got = results[results.qid == qid].sort_values('rank')
    return list(got.score), sorted(zip(got.score, got.docno))


def exact_top(docs, query, scale, k):
    """PISA's integer scores by brute force: ``[(score, docno)]``, best first, at most ``k``."""
    q = quantize(query, scale)
    scores = [(sum(q[t] * i for t, i in quantize(d, scale).items() if t in q), f'd{n}') for n, d in enumerate(docs)]
    return sorted([p for p in scores if p[0] > 0], key=lambda p: -p[0])[:k]


def assert_exact(got, docs, queries, scale, k):
    """Each query's results are the exact top-``k``: the same scores, and the same documents at every score but a
    tie at the cut (which may keep other documents of that score)."""
    for qid, query in zip(map(str, range(len(queries))), queries):
        expected = exact_top(docs, query, scale, k)
        scores, pairs = ranking(got, qid)
        assert scores == [float(s) for s, _ in expected], qid
        last = expected[-1][0] if expected else None
        assert [p for p in pairs if p[0] != last] == sorted((float(s), d) for s, d in expected if s != last), qid


def assert_pisa_agrees(pisa, docs, queries, scale, k):
    """PISA returns the same top-``k`` scores, rounded to float32 (its score type)."""
    for qid, query in zip(map(str, range(len(queries))), queries):
        expected = [s for s, _ in exact_top(docs, query, scale, k)]
        assert ranking(pisa, qid)[0] == pytest.approx(expected, rel=2 ** -22), qid


@pytest.fixture(scope='module')
def small(tmp_path_factory):
    rng = np.random.default_rng(0)
    vectors = [{f't{j}': float(rng.uniform(0.05, 3)) for j in rng.choice(40, 8, replace=False)} for _ in range(30)]
    return build(tmp_path_factory.mktemp('small') / 's.lsr', vectors)


def run_probe(code: str, timeout: int = 120) -> dict:
    """Runs ``code`` (which prints one JSON line last) in a fresh interpreter; a hang or an abort fails the test."""
    done = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_negative_threads_refused_without_hanging(small):
    got = run_probe(f'''
        import json
        from pyterrier_lsr import LsrIndex
        index = LsrIndex({str(small.path)!r})
        out = {{}}
        for engine in ('pisa', 'bmp', 'seismic'):
            try:
                index.toks_retriever(engine=engine, threads=-1)
                out[engine] = 'accepted'
            except ValueError as e:
                out[engine] = str(e)
        print(json.dumps(out))
    ''', timeout=60)
    assert all(message == 'threads must be >= 1, got -1' for message in got.values()), got


def test_huge_num_results_returns_at_most_every_document(small):
    got = run_probe(f'''
        import json
        import pandas as pd
        from pyterrier_lsr import LsrIndex
        index = LsrIndex({str(small.path)!r})
        query = pd.DataFrame({{'qid': ['q'], 'query_toks': [{{'t1': 1.0, 't2': 2.0, 't3': 0.5}}]}})
        out = {{}}
        for engine, params in {[(e, p) for e, p in ALL_RETRIEVERS]!r}:
            res = index.toks_retriever(num_results=2 ** 31, engine=engine, **params)(query)
            out[engine + str(params)] = [len(res), len(set(res.docno))]
        print(json.dumps(out))
    ''')
    matching = len(ask(small, [{'t1': 1.0, 't2': 2.0, 't3': 0.5}], 'pisa', num_results=30))
    assert 0 < matching <= 30
    for name, (rows, distinct) in got.items():
        assert rows == distinct and rows <= 30, name
    assert got["pisa{}"][0] == got["bmp{}"][0] == got["seismic{'exact': True}"][0] == matching


BAD_PARAMETERS = [
    ('pisa', dict(threads=0), ValueError, 'threads must be >= 1'),
    ('pisa', dict(threads=1.5), TypeError, 'threads must be an integer'),
    ('pisa', dict(query_algorithm='fastest'), ValueError, 'query_algorithm must be one of'),
    ('pisa', dict(verbose='yes'), TypeError, 'verbose must be True or False'),
    ('pisa', dict(num_results='10'), TypeError, 'num_results must be an integer'),
    ('pisa', dict(num_results=0), ValueError, 'num_results must be >= 1'),
    ('pisa', dict(k1=1.0), TypeError, 'k1 and b apply to BM25-scored indexes only'),
    ('bmp', dict(alpha=0), ValueError, 'alpha must be a finite number > 0 and <= 1'),
    ('bmp', dict(beta=float('nan')), ValueError, 'beta must be a finite number'),
    ('bmp', dict(alpha='1'), TypeError, 'alpha must be a number'),
    ('bmp', dict(num_results=True), TypeError, 'num_results must be an integer'),
    ('seismic', dict(query_cut=0), ValueError, 'query_cut must be >= 1'),
    ('seismic', dict(heap_factor=0.), ValueError, 'heap_factor must be a finite number > 0'),
    ('seismic', dict(exact=1), TypeError, 'exact must be True or False'),
    ('seismic', dict(threads=-1), ValueError, 'threads must be >= 1'),
]


@pytest.mark.parametrize('engine, params, error, message', BAD_PARAMETERS)
def test_retriever_parameters_are_checked(small, engine, params, error, message):
    num_results = params.pop('num_results', 10)
    with pytest.raises(error, match=message) as raised:
        small.toks_retriever(num_results=num_results, engine=engine, **params)
    assert '\n' not in str(raised.value)


@pytest.mark.parametrize('engine, params, error, message', [
    ('seismic', dict(n_postings=0), ValueError, 'n_postings must be >= 1'),
    ('seismic', dict(centroid_fraction=0.), ValueError, 'centroid_fraction must be a finite number > 0'),
    ('seismic', dict(summary_energy=0.), ValueError, 'summary_energy must be'),
    ('seismic', dict(max_fraction=0.), ValueError, 'max_fraction must be'),
    ('seismic', dict(min_cluster_size=0), ValueError, 'min_cluster_size must be >= 1'),
    ('seismic', dict(doc_cut=0), ValueError, 'doc_cut must be >= 1'),
    ('seismic', dict(threads=0), ValueError, 'threads must be >= 1'),
    ('bmp', dict(block_size=0), ValueError, 'block_size must be >= 1 and <= 256'),
    ('bmp', dict(max_impact=256), ValueError, 'max_impact must be >= 1 and <= 255'),
    ('bmp', dict(compress_range='no'), TypeError, 'compress_range must be True or False'),
])
def test_build_parameters_are_checked(small, engine, params, error, message):
    with pytest.raises(error, match=message):
        small.build_engine(engine, overwrite=True, **params)


def test_kelvin_sign_and_k_are_distinct_terms(tmp_path):
    # str.lower() maps the Kelvin sign (U+212A) to 'k': the old escape stored both as '^k'.
    index = build(tmp_path / 'k.lsr', [{'K': 1.0}, {'\u212a': 1.0}, {'k': 1.0}])
    for engine, params in ALL_RETRIEVERS:
        res = ask(index, [{'K': 1.0}, {'\u212a': 1.0}, {'k': 1.0}], engine, **params)
        assert dict(zip(res.qid, res.docno)) == {'0': 'd0', '1': 'd1', '2': 'd2'} and len(res) == 3, engine


def decode(stored: str) -> str:
    """The inverse of pisa_term, so that the property below proves it injective."""
    out, i = [], 0
    while i < len(stored):
        c = stored[i]
        if c != '^':
            out.append(c)
            i += 1
        elif stored[i + 1] == '^':
            out.append('^')
            i += 2
        elif stored[i + 1] == '{':
            end = stored.index('}', i)
            out.append(chr(int(stored[i + 2:end], 16)))
            i = end + 1
        else:
            assert 'a' <= stored[i + 1] <= 'z'
            out.append(stored[i + 1].upper())
            i += 2
    return ''.join(out)


terms = st.text(st.characters(blacklist_categories=('Cs',), blacklist_characters='\x00'), min_size=1).filter(
    lambda t: not any(c.isspace() for c in t))


@settings(max_examples=2000, deadline=None)
@given(terms)
def test_pisa_term_is_injective_and_lowercase_stable(term):
    stored = pisa_term(term)
    assert stored.lower() == stored  # PISA lowercases query terms
    assert decode(stored) == term  # so no two terms share a stored form
    assert pisa_term('\u212a') != pisa_term('K')


def test_nul_in_a_term_is_refused(small):
    with pytest.raises(WeightError, match='NUL'):
        pisa_term('a\x00b')
    for engine, params in ALL_RETRIEVERS:
        with pytest.raises(WeightError, match='NUL'):
            ask(small, [{'t1\x00x': 1.0}], engine, **params)


def test_seismic_exact_does_not_pad_with_non_matching_documents(small):
    res = ask(small, [{'t1': 1.0}], 'seismic', num_results=30, exact=True)
    pisa = ask(small, [{'t1': 1.0}], 'pisa', num_results=30)
    assert 0 < len(res) == len(pisa) < 30 and (res.score > 0).all()
    assert set(res.docno) == set(pisa.docno)


@pytest.mark.parametrize('weight', [25., 700., MAX_WEIGHT])
def test_seismic_weights_above_float16_exact_integers(tmp_path, weight):
    # With scale 100: impacts of 2,500 (not a float16 integer), 70,000 and 100,000 (float16 infinity).
    vectors = [{'a': weight, 'b': 0.01}, {'a': weight - 0.01, 'b': 0.02}, {'a': weight - 0.02}, {'b': 0.5}]
    index = build(tmp_path / 'w.lsr', vectors)
    queries = [{'a': 1.0}, {'a': MAX_WEIGHT, 'b': 3.0}]
    assert_pisa_agrees(ask(index, queries, 'pisa'), vectors, queries, 100., 10)
    for engine, params in [('seismic', {'exact': True}), ('seismic', {}), ('bmp', {})]:
        got = ask(index, queries, engine, **params)
        assert np.isfinite(got.score).all()
        assert_exact(got, vectors, queries, 100., 10)


def test_bmp_scores_never_wrap(tmp_path):
    # Documents of 200 terms near the largest weight: BMP's 16-bit sums of 8-bit levels wrapped past 65,535 (the
    # heaviest document then ranked last).
    heavy = {f't{j}': 3.0 for j in range(200)}
    vectors = [heavy, {f't{j}': 2.9 for j in range(100)}, {'t0': 3.0, 't1': 3.0}, {'x': 1.0}]
    index = build(tmp_path / 'wrap.lsr', vectors)
    queries = [{f't{j}': 1.0 for j in range(200)}]
    assert list(ask(index, queries, 'pisa').docno) == ['d0', 'd1', 'd2']
    assert_exact(ask(index, queries, 'bmp'), vectors, queries, 100., 10)


def test_bmp_long_documents_and_queries_stay_exact(tmp_path, monkeypatch):
    # A document of 2,100 terms was refused (its levels could pass BMP's 16-bit sums), then kept aside and re-scored
    # for every query, with coarser levels for all: now the levels stay fine (the largest impact at 127) and each query
    # gets the most levels that cannot wrap; the 2,100-term query on the 2,100-term document is scored exhaustively.
    from pyterrier_lsr.index.engines import bmp
    vectors = [{f't{j}': 3.0 for j in range(2100)}, {f't{j}': 2.9 for j in range(300)}, {'t0': 3.0, 't1': 3.0},
               {'t5': 0.5, 'x': 1.0}] + [{f't{j}': 0.3 for j in range(i, i + 30)} for i in range(40)]
    index = build(tmp_path / 'long.lsr', vectors)
    assert index.meta['engines']['bmp']['impact_factor'] == 127 / 300
    asked = []
    search = bmp._query_levels
    monkeypatch.setattr(bmp, '_query_levels', lambda *a: asked.append(search(*a)) or asked[-1])
    queries = [{f't{j}': 1.0 for j in range(300)}, {f't{j}': 0.5 + j / 300 for j in range(300)},
               {f't{j}': 1.0 for j in range(2100)}, {'t0': 1.0, 't5': 0.2, 'x': 0.01}, {'t35': 1.0, 't40': 0.5}]
    assert_exact(ask(index, queries, 'bmp'), vectors, queries, 100., 10)
    # the first ask of each query (a query whose results are tied at the cut is asked again, deeper)
    most = [chosen and chosen[0] for chosen in asked[:len(queries)]]
    assert most[2] is None and most[3:] == [32, 32] and 1 <= most[0] < 32 and 1 <= most[1] < 32


def test_bmp_query_levels_cannot_wrap():
    # Every document, scored by BMP at the levels chosen, stays within 16 bits; one level more would not be safe.
    from pyterrier_lsr.index.engines import bmp
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 900, 60)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    levels = rng.integers(1, 128, indptr[-1]).astype(np.uint8)
    ids = np.concatenate([rng.choice(1000, n, replace=False) for n in lengths]).astype(np.int64)
    frontier = bmp._wrap_frontier(indptr, levels)
    matrix = np.zeros((len(lengths), 1000))
    for row in range(len(lengths)):
        matrix[row, ids[indptr[row]:indptr[row + 1]]] = levels[indptr[row]:indptr[row + 1]]
    for size in (5, 50, 400, 1000):
        terms = rng.choice(1000, size, replace=False)
        weights = rng.integers(1, 5000, size)
        most, query = bmp._query_levels(weights, frontier)
        dense = np.zeros(1000)
        dense[terms] = query
        assert (matrix @ dense).max() <= bmp.MAX_SCORE and query.max() == most
        if most < bmp.MAX_QUERY_LEVEL:  # one level more: some document's bound passes 16 bits
            wider = -(-weights * (most + 1) // weights.max())
            bounds = np.minimum((most + 1) * matrix.sum(axis=1), matrix.max(axis=1) * wider.sum())
            assert bounds.max() > bmp.MAX_SCORE


def test_bmp_kth_levels_match_a_sort():
    # BMP's initial thresholds come from each term's 10th / 100th / 1000th largest level, counted in a histogram.
    from pyterrier_lsr.index.engines import bmp
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 40, 60_000).astype(np.int32)
    ids[:5_000] = 0  # one term of more than 1,000 postings, others of fewer than 10
    ids[-3:] = 41
    levels = rng.integers(1, 256, len(ids)).astype(np.uint8)
    got = bmp._kth_levels(ids, levels, 42)
    for term in range(42):
        ranked = np.sort(levels[ids == term])[::-1]
        assert list(got[term]) == [int(ranked[k - 1]) if len(ranked) >= k else 0 for k in bmp.KTH]
    assert got[41].tolist() == [0, 0, 0] and got[0].min() > 0


def test_bmp_reordered_serves_the_same_results(tmp_path, capfd):
    # Documents of two term families in random order: bisection numbers each family's documents together.
    rng = np.random.default_rng(0)
    families = rng.integers(0, 2, 96)
    vectors = [{f'{"ab"[f]}{j}': float(rng.uniform(0.1, 2)) for j in rng.choice(12, 6, replace=False)}
               for f in families]
    index = build(tmp_path / 'r.lsr', vectors)
    queries = [{'a1': 1., 'a2': 0.5}, {'b3': 2.}, {'a0': 1., 'b0': 1.}]
    before = ask(index, queries, 'bmp', num_results=40)
    capfd.readouterr()
    index.build_engine('bmp', overwrite=True, reorder=True, block_size=8, verbose=True)
    assert 'graph bisection' in capfd.readouterr().err  # the progress shows (engine builds are silenced otherwise)
    assert index.meta['engines']['bmp']['reorder'] is True
    from pyterrier_lsr.index.engines.topk import Forward
    order = [families[int(docno[1:])] for docno in Forward(index.path / 'bmp').docnos]
    changes = lambda seq: sum(a != b for a, b in zip(seq, seq[1:]))  # noqa: E731
    assert changes(families) > 30 and changes(order) <= 8  # grouped (family borders fall inside some leaves)
    after = ask(index, queries, 'bmp', num_results=40)
    assert after.score.tolist() == before.score.tolist()  # equal scores may change places: rows are renumbered
    assert_exact(after, vectors, queries, 100., 40)


def test_bmp_approximate_on_a_single_block_returns_rows(tmp_path):
    index = build(tmp_path / 'one.lsr', [{'a': 1.0}, {'a': 2.0, 'b': 1.0}, {'b': 1.0}])  # fewer than one block
    for params in [dict(alpha=0.9), dict(beta=0.5), dict(alpha=0.5, beta=0.5), {}]:
        res = ask(index, [{'a': 1.0, 'b': 0.5}], 'bmp', **params)
        assert len(res) >= 2 and res.docno.iloc[0] == 'd1', params


# Weights near the documented limits: MAX_WEIGHT, the quantization step 1/scale, and values whose impacts straddle
# BMP's level steps and float16's exact integers.
weights = st.one_of(st.floats(0.005, 3.), st.floats(19., 21.), st.floats(MAX_WEIGHT - 1, MAX_WEIGHT),
                    st.sampled_from([0.01, 0.015, 20.48, 20.49, 655.04, MAX_WEIGHT]))
vectors = st.dictionaries(st.sampled_from([f't{j}' for j in range(25)]), weights, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(docs=st.lists(vectors, min_size=1, max_size=60).filter(lambda d: any(quantize(v, 100.) for v in d)),
       queries=st.lists(vectors.filter(bool), min_size=1, max_size=6), block_size=st.sampled_from([1, 4, 32]),
       num_results=st.sampled_from([1, 3, 10]), reorder=st.booleans())
def test_exact_engines_rank_as_pisa(tmp_path_factory, docs, queries, block_size, num_results, reorder):
    index = build(tmp_path_factory.mktemp('prop') / 'p.lsr', docs)
    index.build_engine('bmp', overwrite=True, block_size=block_size, reorder=reorder)
    assert_pisa_agrees(ask(index, queries, 'pisa', num_results=num_results), docs, queries, 100., num_results)
    for engine, params in EXACT:
        assert_exact(ask(index, queries, engine, num_results=num_results, **params), docs, queries, 100., num_results)


@pytest.mark.parametrize('engine', ['bmp', 'seismic'])
@pytest.mark.parametrize('damage', ['term id', 'offset'])
def test_a_forward_index_altered_in_place_is_refused_before_it_is_read(tmp_path, monkeypatch, engine, damage):
    # Large engine files are digested by verify() only, and candidates are re-scored by scipy's row gathers, which
    # trust the offsets and term ids: a same-size edit must be a clear error, not a read out of bounds.
    from pyterrier_lsr.core import storage
    monkeypatch.setattr(storage, 'CHEAP_DIGEST_BYTES', 0)  # as if every file were large
    index = build(tmp_path / 'x.lsr', [{'a': 1.0, 'b': 2.0}, {'b': 1.0}, {'c': 3.0}])
    name = 'forward-ids.npy' if damage == 'term id' else 'forward-indptr.npy'
    path = index.path / engine / name
    array = np.load(path)
    array[-1] = 10 ** 6
    np.save(path, array)
    with pytest.raises(ValueError, match='forward index .* inconsistent'):
        ask(index, [{'a': 1.0}], engine)


def test_bounded_rescore_skips_only_candidates_that_cannot_reach_the_kth():
    from pyterrier_lsr.index.engines.topk import bounded_rescore, ranked
    exact = np.array([50., 40., 45., 10., 30., 5.])
    bounds = np.array([60., 55., 50., 40., 31., 20.])  # descending, each at least its row's exact score
    asked = []

    def rescore(rows):
        asked.extend(rows.tolist())
        return exact[rows]

    scores = bounded_rescore(rescore, np.arange(6), bounds, 2)
    assert asked == [0, 1, 2, 3]  # the k-th of the first two is 40: rows 2 and 3 may reach it (3 exactly), 4, 5 not
    rows, top = ranked(np.arange(6), scores, 2)
    assert rows.tolist() == [0, 2] and top.tolist() == [50., 45.]


def test_forward_rescore_equals_the_dense_product_for_any_rows(tmp_path):
    # The exact scores every engine returns: the dot product, for empty documents, repeated and unsorted rows, and
    # terms the query lacks.
    from pyterrier_lsr.index.engines.topk import Forward
    rng = np.random.default_rng(0)
    num_docs, num_terms = 400, 50
    lengths = rng.integers(0, 12, num_docs) * (rng.random(num_docs) < 0.8)
    ids = np.concatenate([np.sort(rng.choice(num_terms, n, replace=False)) for n in lengths])
    impacts = rng.integers(1, 2 ** 20, len(ids))
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    Forward.write(tmp_path, [f'd{i}' for i in range(num_docs)], [f't{i}' for i in range(num_terms)], indptr, ids,
                  impacts)
    forward = Forward(tmp_path)
    dense = np.zeros((num_docs, num_terms))
    dense[np.repeat(np.arange(num_docs), lengths), ids] = impacts
    query = {3: 7, 10: 1, 49: 2 ** 20}
    weights = np.zeros(num_terms)
    weights[list(query)] = list(query.values())
    for count in (0, 1, 5, 1000):
        rows = rng.integers(0, num_docs, count)
        assert np.array_equal(forward.rescore(query, rows), dense[rows] @ weights)
    empty = np.flatnonzero(lengths == 0)[:3]
    assert np.array_equal(forward.rescore(query, empty), np.zeros(len(empty)))
    assert np.array_equal(forward.rescore(query), dense @ weights)
    assert np.array_equal(forward.rescore({}, np.arange(3)), np.zeros(3))
