"""Document reordering by recursive graph bisection (BP; Dhulipala et al., KDD 2016, as reproduced by Mackenzie et al.,
ECIR 2019, and run by PISA's ``reorder-docids --recursive-graph-bisection``): an order that puts documents sharing
terms next to each other, so a block-based engine (BMP) gets tighter per-block maxima and skips more blocks.

No maintained implementation is installable here (pyterrier-pisa links PISA's but exposes no call; bmp ships none), so
this is one in numpy.  The documents are split in two halves, documents are swapped between the halves while a swap
lowers the estimated cost of coding the gaps of every term's postings in both halves (``d log2(n / (d + 1))`` for ``d``
of a half's ``n`` documents holding the term), then each half is split again, down to ``leaf_size`` documents.  Every
segment of one level of the recursion is processed at once: one sort of the postings by (segment, term) per level,
then three sparse products over all postings per swap round, so time and memory grow with the number of postings.
"""
import math

import numpy as np
from tqdm.auto import tqdm

from ..core.checks import check_int
from ..core.extras import import_extra

__all__ = ['bisection_order', 'permute_rows']


def _cost(degree: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The log-gap cost estimate of ``degree`` postings among ``size`` documents (float32, as its inputs: these
    arrays have an entry per (segment, term) group, as many as postings at the deep levels)."""
    return degree * np.log2(size / (degree + np.float32(1)))


def bisection_order(indptr: np.ndarray, ids: np.ndarray, num_terms: int, leaf_size: int = 16,
                    iterations: int = 20, verbose: bool = True) -> np.ndarray:
    """The new document order (``order[i]`` is the row placed at position ``i``) of a CSR corpus (``indptr``, term
    ``ids`` of each row), by recursive graph bisection down to segments of at most ``leaf_size`` documents, with at
    most ``iterations`` swap rounds per level."""
    leaf_size = check_int('leaf_size', leaf_size, 2)
    # imported here: the BMP engine imports this module, and without scipy it must fail naming its extra
    sparse = import_extra('engines', 'scipy.sparse', needed_for='reordering documents')
    iterations = check_int('iterations', iterations, 1)
    indptr, ids = np.asarray(indptr, dtype=np.int64), np.asarray(ids)
    n = len(indptr) - 1
    if n < 0 or indptr[0] != 0 or indptr[-1] != len(ids) or (np.diff(indptr) < 0).any():
        raise ValueError(f'indptr must rise from 0 to the {len(ids)} term ids')
    num_terms = check_int('num_terms', num_terms, 0)
    # term ids index the per-term arrays of every level: one out of range would count into another term, or fail deep
    # inside scipy
    if not np.issubdtype(ids.dtype, np.integer) and len(ids):
        raise ValueError(f'term ids must be integers, got {ids.dtype}')
    if len(ids) and (ids.min() < 0 or ids.max() >= num_terms):
        raise ValueError(f'term ids must lie in [0, {num_terms}) (num_terms), got {ids.min()}..{ids.max()}')
    if n == 0 or len(ids) == 0:
        return np.arange(n)
    if len(ids) >= 2 ** 31:
        raise ValueError(f'{len(ids)} postings: graph bisection handles fewer than 2**31')
    lengths = np.diff(indptr)
    indptr32 = indptr.astype(np.int32)
    order = np.arange(n)
    bounds = np.array([0, n], dtype=np.int64)  # the segments of the current level: positions bounds[j]:bounds[j + 1]
    levels = max(0, math.ceil(math.log2(n / leaf_size)))
    for _ in tqdm(range(levels), desc='reordering (graph bisection)', unit='level', disable=not verbose):
        sizes = np.diff(bounds)
        split = sizes > leaf_size
        if not split.any():
            break
        position = np.empty(n, dtype=np.int64)
        position[order] = np.arange(n)
        segment = np.searchsorted(bounds, position, side='right') - 1  # each document's segment
        middle = bounds[:-1] + sizes // 2
        left_size, right_size = (sizes // 2).astype(np.float32), (sizes - sizes // 2).astype(np.float32)
        # Documents of segments too small to split keep their side fixed (they are never paired).
        right = (position >= middle[segment]) & split[segment]
        # Postings grouped by (segment, term), once per level; `incidence` (documents x groups) turns the degrees of
        # each half and the documents' move gains into sparse products (one pass over the postings each).
        key = np.repeat(segment, lengths) * num_terms + ids  # postings are in row order, as `indptr` says
        sort = np.argsort(key, kind='stable')
        key = key[sort]
        first = np.concatenate([[True], key[1:] != key[:-1]])
        group_segment = key[first] // num_terms
        del key
        group = np.empty(len(sort), dtype=np.int32)
        group[sort] = np.cumsum(first, dtype=np.int32)
        group -= 1
        del sort, first
        # 32-bit indices (scipy keeps them when indptr is 32-bit too): half the memory of the two sparse matrices.
        incidence = sparse.csr_matrix((np.ones(len(group), np.float32), group, indptr32),
                                      shape=(n, len(group_segment)))
        del group
        by_group = incidence.T.tocsr()
        degree = np.asarray(by_group.sum(axis=1), dtype=np.float32).ravel()
        n_left, n_right = left_size[group_segment], right_size[group_segment]
        for _ in range(iterations):
            d_right = by_group @ right.astype(np.float32)
            d_left = degree - d_right
            one = np.float32(1)
            with np.errstate(divide='ignore', invalid='ignore'):
                base = _cost(d_left, n_left) + _cost(d_right, n_right)
                to_right = base - _cost(d_left - one, n_left) - _cost(d_right + one, n_right)
                to_left = base - _cost(d_right - one, n_right) - _cost(d_left + one, n_left)
                del base
                # A side's gains are finite for its own documents (their terms have a degree >= 1 there).
                gain = np.where(right, incidence @ to_left, incidence @ to_right)
                del to_left, to_right
            if not _swap(segment, right, np.nan_to_num(gain), split):
                break
        del incidence, by_group
        # The halves become the next level's segments (a stable sort keeps the order within each half).
        order = np.lexsort((position, right, segment))
        halves = np.where(split, middle, bounds[:-1])
        bounds = np.unique(np.concatenate([bounds, halves]))
    return order


def _swap(segment: np.ndarray, right: np.ndarray, gain: np.ndarray, split: np.ndarray) -> int:
    """Pairs, in every segment, the left documents by decreasing gain with the right ones by decreasing gain and
    swaps the pairs whose gains sum above 0 (flips ``right`` in place); returns how many documents moved."""
    movable = split[segment]
    stride = len(segment) + 1
    ranked = []
    for side in (False, True):
        docs = np.flatnonzero((right == side) & movable)
        docs = docs[np.lexsort((-gain[docs], segment[docs]))]
        segments = segment[docs]
        starts = np.flatnonzero(np.concatenate([[True], segments[1:] != segments[:-1]]))
        rank = np.arange(len(docs)) - np.repeat(starts, np.diff(np.append(starts, len(docs))))
        ranked.append((docs, segments * stride + rank))  # ascending: by segment, then rank
    (left, left_keys), (right_docs, right_keys) = ranked
    if not len(left) or not len(right_docs):
        return 0
    # Rank r of a segment's left half meets rank r of its right half (the right half is never the smaller one).
    at = np.minimum(np.searchsorted(right_keys, left_keys), len(right_keys) - 1)
    move = (right_keys[at] == left_keys) & (gain[left] + gain[right_docs[at]] > 0)
    right[left[move]] = True
    right[right_docs[at][move]] = False
    return 2 * int(move.sum())


def permute_rows(order: np.ndarray, docnos, indptr: np.ndarray, *columns: np.ndarray):
    """A CSR corpus with its rows in ``order``: ``(docnos, indptr, *columns)``."""
    order = np.asarray(order, dtype=np.int64)
    lengths = np.diff(indptr)[order]
    new_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(indptr.dtype)
    starts = np.asarray(indptr)[order]
    positions = np.arange(int(new_indptr[-1])) + np.repeat(starts - new_indptr[:-1], lengths)
    return ([docnos[i] for i in order], new_indptr, *(np.asarray(c)[positions] for c in columns))
