"""The compiled top-k of positive entries (``selection.top_k_positive``) against torch.topk."""
import numpy as np
import pytest
import torch

from pyterrier_lsr.core.selection import top_k_positive


def kept(indices, values, row):
    return {(int(i), float(v)) for i, v in zip(indices[row], values[row]) if v > 0}


@pytest.mark.parametrize('shift', [0., -1., -2.5, -6.])
@pytest.mark.parametrize('n, k', [(4096, 16), (4096, 96), (300, 1), (300, 300), (37, 5), (9, 8)])
def test_keeps_the_positive_entries_of_torch_topk(shift, n, k):
    scores = (np.random.default_rng(n + k).standard_normal((64, n)) + shift).astype(np.float32)
    indices, values = top_k_positive(scores, k)
    assert indices.shape == values.shape == (64, k) and indices.dtype == np.int64 and values.dtype == np.float32
    top = torch.from_numpy(scores).topk(k, dim=-1)
    expected_i, expected_v = top.indices.numpy(), top.values.relu().numpy()
    for row in range(64):
        assert kept(indices, values, row) == kept(expected_i, expected_v, row)
    assert (values > 0).sum() == (expected_v > 0).sum()
    assert np.all(indices[values == 0] == 0)


def test_ties_keep_lower_columns_and_short_rows_are_padded():
    scores = np.full((3, 50), -1., np.float32)
    scores[0] = 2.
    scores[0, [7, 30]] = 3.
    scores[1, [4, 9]] = [0.5, 0.25]
    scores[2, [3, 8]] = [np.nan, 1.]
    indices, values = top_k_positive(scores, 5)
    assert sorted(indices[0].tolist()) == [0, 1, 2, 7, 30] and sorted(values[0].tolist()) == [2., 2., 2., 3., 3.]
    assert kept(indices, values, 1) == {(4, 0.5), (9, 0.25)} and indices[1].tolist().count(0) == 3
    assert kept(indices, values, 2) == {(8, 1.)}  # NaN is never kept
    assert top_k_positive(np.zeros((0, 4), np.float32), 2)[0].shape == (0, 2)


@pytest.mark.parametrize('scores, k, match', [
    (np.zeros((2, 4), np.float64), 2, 'float32 matrix'),
    (np.zeros(4, np.float32), 2, 'float32 matrix'),
    (np.zeros((2, 4), np.float32), 5, 'k must be'),
    (np.zeros((2, 4), np.float32), 0, 'k must be'),
])
def test_refuses_bad_input(scores, k, match):
    with pytest.raises(ValueError, match=match):
        top_k_positive(scores, k)
    with pytest.raises(TypeError, match='k must be an integer'):
        top_k_positive(np.zeros((2, 4), np.float32), True)
