"""Recursive graph bisection: a permutation that puts documents sharing terms together, and BMP built on it serves the
same results (docnos mapped back)."""
import numpy as np
import pytest

from pyterrier_lsr.index.reorder import bisection_order, permute_rows


def clustered(n=2000, clusters=25, vocabulary=60, terms=12, seed=0):
    """Documents drawn from disjoint per-cluster vocabularies, in random order: ``(cluster of each, indptr, ids)``."""
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, clusters, n)
    rows = [np.sort(rng.choice(vocabulary, terms, replace=False) + c * vocabulary) for c in cluster]
    return cluster, np.concatenate([[0], np.cumsum([len(r) for r in rows])]), np.concatenate(rows)


def clusters_per_block(cluster, order, block=32):
    return np.mean([len(set(cluster[order[i:i + block]])) for i in range(0, len(order), block)])


def test_bisection_groups_documents_that_share_terms():
    cluster, indptr, ids = clustered()
    order = bisection_order(indptr, ids, int(ids.max()) + 1)
    assert sorted(order.tolist()) == list(range(len(cluster)))
    # In the given (random) order a block of 32 holds ~18 of the 25 clusters; grouped, about 2 (each block can
    # straddle a border).
    assert clusters_per_block(cluster, np.arange(len(cluster))) > 15
    assert clusters_per_block(cluster, order) < 3
    assert np.array_equal(order, bisection_order(indptr, ids, int(ids.max()) + 1))  # deterministic


def test_bisection_of_degenerate_corpora():
    assert bisection_order(np.array([0]), np.array([], dtype=np.int64), 5).tolist() == []
    assert sorted(bisection_order(np.array([0, 0, 0, 1]), np.array([3]), 5).tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match='indptr'):
        bisection_order(np.array([1, 2]), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match='leaf_size'):
        bisection_order(np.array([0, 1]), np.array([0]), 1, leaf_size=1)


def test_permute_rows_moves_whole_rows():
    docnos, indptr = ['a', 'b', 'c'], np.array([0, 2, 2, 5])
    ids, values = np.array([1, 2, 3, 4, 5]), np.array([10, 20, 30, 40, 50])
    got_docnos, got_indptr, got_ids, got_values = permute_rows(np.array([2, 0, 1]), docnos, indptr, ids, values)
    assert got_docnos == ['c', 'a', 'b'] and got_indptr.tolist() == [0, 3, 5, 5]
    assert got_ids.tolist() == [3, 4, 5, 1, 2] and got_values.tolist() == [30, 40, 50, 10, 20]


@pytest.mark.parametrize('ids, num_terms', [(np.array([0, 5]), 5), (np.array([-1, 2]), 5), (np.array([0, 1]), 0)])
def test_bisection_refuses_term_ids_out_of_range(ids, num_terms):
    # they were accepted: a negative id counted into the last term, one past num_terms failed inside scipy or not at all
    with pytest.raises(ValueError, match=r'term ids must lie in \[0, '):
        bisection_order(np.array([0, 1, 2]), ids, num_terms)


def test_bisection_refuses_non_integer_term_ids():
    with pytest.raises(ValueError, match='term ids must be integers'):
        bisection_order(np.array([0, 1, 2]), np.array([0., 1.]), 5)
