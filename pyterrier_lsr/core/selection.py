"""Each row's ``k`` largest positive entries, compiled: the selection behind the SSR index's sparse codes.

``torch.topk`` on a CPU orders index/value pairs of the whole row (a partial sort for small ``k``, ``nth_element``
beyond ``k = n / 64``), which for 96 of 4,096 latents cost about 3x the encoder product that computed the row; this
kernel makes the codes 1.8-2.4x faster there and is level with torch at k = 16 (2026-12-03, measured with
benchmarks/ssr_indexing.py: docs/results.md, SSR). A code keeps only positive activations, and few entries can be among
the largest, so it estimates the threshold from every 8th entry, gathers the entries above it in one pass and selects
among those few with a heap.
"""

import numba
import numpy as np

from .checks import check_int

# Every SAMPLE_STEP-th entry estimates the threshold; the sample's rank keeps about 2k entries of the row above it.
SAMPLE_STEP = 8


def top_k_positive(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, values)``, both ``rows x k`` (int64 column ids, float32 values): each row's ``k`` largest positive
    entries of ``scores`` (``rows x n`` float32), in no particular order.  A row with fewer than ``k`` positive entries
    is padded with value 0 at column 0; among equal values at the ``k``-th place the lower column ids are kept; NaN is
    never kept.  The positive entries equal those of ``torch.topk(scores, k)`` relu'd, up to the choice among ties."""
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.dtype != np.float32:
        raise ValueError(f'scores must be a float32 matrix (rows x columns), got {scores.dtype} {scores.shape}')
    k = check_int('k', k, 1, scores.shape[1])
    indices, values = np.empty((len(scores), k), np.int64), np.empty((len(scores), k), np.float32)
    _top_k_positive(np.ascontiguousarray(scores), k, indices, values)
    return indices, values


@numba.njit(nogil=True, inline='always')
def _sift_down(heap_v, heap_i, c, size, v, ix):
    # A min-heap of the kept entries; among equal values the higher column id sits nearer the root (goes first).
    while True:
        child = 2 * c + 1
        if child >= size:
            break
        if child + 1 < size and (heap_v[child + 1] < heap_v[child]
                                 or (heap_v[child + 1] == heap_v[child] and heap_i[child + 1] > heap_i[child])):
            child += 1
        if heap_v[child] > v or (heap_v[child] == v and heap_i[child] < ix):
            break
        heap_v[c], heap_i[c] = heap_v[child], heap_i[child]
        c = child
    heap_v[c], heap_i[c] = v, ix


@numba.njit(nogil=True)
def _heap_select(values, ids, n, k, heap_v, heap_i):
    """The ``min(k, n)`` largest of ``values[:n]`` (``ids`` ascending) into the heap; returns how many."""
    size = min(k, n)
    heap_v[:size] = values[:size]
    heap_i[:size] = ids[:size]
    for c in range(size // 2 - 1, -1, -1):
        _sift_down(heap_v, heap_i, c, size, heap_v[c], heap_i[c])
    for j in range(size, n):
        if values[j] > heap_v[0]:  # ids ascend, so an equal value never displaces a lower id
            _sift_down(heap_v, heap_i, 0, size, values[j], ids[j])
    return size


@numba.njit(nogil=True)
def _top_k_positive(scores, k, indices, values):
    n_rows, n = scores.shape
    n_sample = (n + SAMPLE_STEP - 1) // SAMPLE_STEP
    sample_k = min(n_sample, 2 * k // SAMPLE_STEP + 1)
    sample_v, sample_i = np.empty(n_sample, np.float32), np.arange(0, n, SAMPLE_STEP)
    top_v, top_i = np.empty(sample_k, np.float32), np.empty(sample_k, np.int64)
    cand_v, cand_i = np.empty(n, np.float32), np.empty(n, np.int64)
    for r in range(n_rows):
        row = scores[r]
        for s in range(n_sample):
            sample_v[s] = row[s * SAMPLE_STEP]
        _heap_select(sample_v, sample_i, n_sample, sample_k, top_v, top_i)
        threshold, c = top_v[0], 0
        if threshold > 0:
            for j in range(n):  # branch-free gather: the slot is overwritten unless the entry qualifies
                cand_v[c], cand_i[c] = row[j], j
                c += row[j] >= threshold
        if c < k:  # fewer than k above the estimate: every positive entry is a candidate
            c = 0
            for j in range(n):
                cand_v[c], cand_i[c] = row[j], j
                c += row[j] > 0
        kept = _heap_select(cand_v, cand_i, c, k, values[r], indices[r])
        values[r, kept:] = 0
        indices[r, kept:] = 0
