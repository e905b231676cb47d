"""One tie rule for every retriever: documents are ranked by score, highest first, and documents of equal score by
docno, in ascending string order; ``rank`` counts from 0 within each query.

The rule makes a cut-off a prefix: the top ``k`` of ``retriever % k`` are the first ``k`` of the un-cut ranking, at
every ``k`` and on every engine, tied scores included.  Engines that keep their best ``n`` documents (PISA's heap,
BMP, Seismic) keep an arbitrary subset of the documents tied at the ``n``-th score, so :func:`top_k` asks a little
deeper than ``k`` (:func:`first_depth`) and, for the queries whose last returned score still equals their ``k``-th,
deeper again until every document tied with the ``k``-th is in hand; then :func:`tie_ordered` sorts and cuts.
Retrievers that score every candidate exactly (MaxSim, SSR, dense) pick their top rows with :func:`top_rows`.  A
cut-off of ``k <= 0`` (or not an integer) is left to PyTerrier's own ``RankCutoff`` (:func:`fusable_cutoff`): it
keeps no row, columns intact.
"""
from collections.abc import Callable

import numpy as np
import pandas as pd

__all__ = ['fusable_cutoff', 'tie_ordered', 'top_k', 'first_depth', 'top_rows', 'docno_ranks']


def fusable_cutoff(k, num_results: int) -> bool:
    """Whether ``retriever % k`` should become the retriever asking for ``k`` (PyTerrier's ``fuse_rank_cutoff``):
    ``k`` an integer from 1 below ``num_results``.  Otherwise PyTerrier applies its ``RankCutoff`` to the full
    ranking, which is the same for a larger ``k`` and keeps no row for ``k <= 0``, as it does for any transformer."""
    return isinstance(k, (int, np.integer)) and not isinstance(k, bool) and 1 <= k < num_results


def docno_ranks(docnos) -> np.ndarray:
    """Each docno's place in ascending string order (int64, one per docno): the tie key of :func:`top_rows`."""
    codes, _ = pd.factorize(pd.Series(docnos, dtype=object), sort=True)
    return codes.astype(np.int64)


def top_rows(scores: np.ndarray, k: int, ranks: np.ndarray, keep=None) -> np.ndarray:
    """The positions of the ``k`` best of ``scores``, best first, ties by ``ranks`` (:func:`docno_ranks` of each
    position's docno); ``keep``: a boolean mask of the positions that may be returned (e.g. positive scores)."""
    scores = np.asarray(scores)
    candidates = np.arange(len(scores)) if keep is None else np.flatnonzero(keep)
    if len(candidates) > k:
        # every position scoring at least the k-th best: the k returned are then the rule's, whatever the ties
        kth = np.partition(scores[candidates], len(candidates) - k)[len(candidates) - k]
        candidates = candidates[scores[candidates] >= kth]
    order = np.lexsort((ranks[candidates], -scores[candidates]))[:k]
    return candidates[order]


def tie_ordered(frame: pd.DataFrame, k: int, positions: np.ndarray | None = None) -> pd.DataFrame:
    """``frame`` (results of several queries) in the rule's order, at most ``k`` rows per query, ``rank`` from 0.

    ``positions``: each row's query as its position in the input (queries come out in that order); default: the
    order in which the frame's qids first appear.  Rows are sorted only when needed (engines sort by score, so only
    tied documents, and queries returned out of order, move), and taken column by column once."""
    if positions is None:
        positions = pd.factorize(frame['qid'].astype(str))[0]
    positions = np.asarray(positions, dtype=np.int64)
    scores = frame['score'].to_numpy(dtype=np.float64)
    same = positions[1:] == positions[:-1]
    ordered = bool((positions[1:] >= positions[:-1]).all() and not (same & (scores[1:] > scores[:-1])).any())
    ties = np.flatnonzero(same & (scores[1:] == scores[:-1]))
    order = None
    if ordered and len(ties):  # only the tied documents' docnos are compared
        pairs = frame['docno'].array.take(np.concatenate([ties, ties + 1])).to_numpy(dtype=str)
        ordered = bool((pairs[:len(ties)] < pairs[len(ties):]).all())
    if not ordered:
        order = np.lexsort((frame['docno'].to_numpy(dtype=str), -scores, positions))
        positions = positions[order]
    ranks = np.arange(len(positions)) - np.searchsorted(positions, positions, side='left')
    keep = ranks < k
    if order is None and 'rank' in frame.columns and isinstance(frame.index, pd.RangeIndex) and \
            frame.index.start == 0 and frame.index.step == 1 and (ranks == frame['rank'].to_numpy()).all():
        if keep.all():
            return frame  # as the engine gave it
        if positions[0] == positions[-1]:  # one query: a prefix
            return frame.iloc[:k]
    rows = np.flatnonzero(keep) if order is None else order[keep]
    # one take of each column: cheaper than taking whole rows and assigning the ranks into the copy
    dtype = frame['rank'].dtype if 'rank' in frame.columns else np.int64
    columns = {c: frame[c].array.take(rows) for c in frame.columns if c != 'rank'}
    columns['rank'] = ranks[keep].astype(dtype)
    names = list(frame.columns) if 'rank' in frame.columns else list(columns)
    return pd.DataFrame({c: columns[c] for c in names}, copy=False)


def _positions(found: pd.DataFrame, keys: dict, single: bool) -> np.ndarray:
    """Each result row's query as its input position: engines return each query's rows together, so one look-up a
    run of rows (one query asked: no look-up at all)."""
    if single or not len(found):
        return np.zeros(len(found), np.int64)
    qids = found['qid'].to_numpy(dtype=object)
    starts = np.flatnonzero(np.concatenate([[True], qids[1:] != qids[:-1]]))
    return np.repeat([keys[str(qids[s])] for s in starts.tolist()], np.diff(np.append(starts, len(qids))))


def top_k(search: Callable[[np.ndarray | None, int], pd.DataFrame], inp: pd.DataFrame, k: int,
          limit: int) -> pd.DataFrame:
    """The top ``k`` results of each query of ``inp`` (one row per qid) under the rule, from an engine that returns
    its best ``depth`` documents per query (ties among them arbitrary).

    ``search(rows, depth)`` returns the results (``qid, docno, score``, ...) of the input rows ``rows`` (positions;
    ``None``: every row, the frame as it is) at ``depth``; ``limit``: the depth at which the engine returns every
    matching document (the number of documents).  First asked a little deeper than ``k`` (:func:`first_depth`); a
    query whose last score still equals its ``k``-th is asked again, twice as deep, alone, until it is not or the
    depth reaches ``limit``."""
    keys = {qid: row for row, qid in enumerate(inp['qid'].astype(str).tolist())}
    depth, rows, parts = first_depth(k, limit), None, []
    while True:
        found = search(rows, depth)
        positions = _positions(found, keys, len(keys) == 1)
        if depth >= limit or not len(found):
            parts.append((found, positions))
            break
        scores = found['score'].to_numpy(dtype=np.float64)
        starts = np.flatnonzero(np.concatenate([[True], positions[1:] != positions[:-1]]))
        ends = np.append(starts[1:], len(positions))
        deeper = [int(positions[s]) for s, e in zip(starts.tolist(), ends.tolist())
                  if e - s >= depth and scores[s + k - 1] == scores[e - 1]]
        if not deeper:
            parts.append((found, positions))
            break
        done = ~np.isin(positions, deeper)
        parts.append((found[done], positions[done]))
        rows, depth = np.asarray(deeper, dtype=np.int64), min(limit, depth * 2)
    if len(parts) == 1:
        return tie_ordered(parts[0][0], k, parts[0][1])
    frame = pd.concat([f for f, _ in parts], ignore_index=True)
    return tie_ordered(frame, k, np.concatenate([p for _, p in parts]))


def first_depth(k: int, limit: int) -> int:
    """The depth an engine is first asked for to rank ``k`` (at most ``limit``): a sixteenth more than ``k``, and one
    at least, so that the usual ties across the cut (quantized scores tie often deep in a ranking) are seen in the
    same call."""
    return min(k + 1 + k // 16, limit)
