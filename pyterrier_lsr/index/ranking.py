"""One tie rule for every retriever: documents are ranked by score, highest first, and documents of equal score by
docno, in ascending string order; ``rank`` counts from 0 within each query.

The rule makes a cut-off a prefix: the top ``k`` of ``retriever % k`` are the first ``k`` of the un-cut ranking, at
every ``k`` and on every engine, tied scores included.  Engines that keep their best ``n`` documents (PISA's heap,
BMP, Seismic) keep an arbitrary subset of the documents tied at the ``n``-th score, so :func:`top_hits` asks a
little deeper than ``k`` (:func:`first_depth`) and, for the queries whose last returned score still equals their
``k``-th, deeper again until every document tied with the ``k``-th is in hand; then :func:`ranked` sorts and cuts.
All of it works on the engines' arrays (:class:`Hits`): a retriever builds one frame, at the end.
Retrievers that score every candidate exactly (MaxSim, SSR, dense) pick their top rows with :func:`top_rows`.  A
cut-off of ``k <= 0`` (or not an integer) is left to PyTerrier's own ``RankCutoff`` (:func:`fusable_cutoff`): it
keeps no row, columns intact.
"""
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = ['Hits', 'fusable_cutoff', 'ranked', 'tie_ordered', 'top_hits', 'first_depth', 'top_rows', 'docno_ranks']


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


class Hits(NamedTuple):
    """An engine's results for a list of queries, as arrays: each hit's query (its position in the list, int64), its
    docno (a numpy array of ``str``, or a pandas string array) and its score; a query's hits together and best first
    (ties among them in any order)."""
    queries: np.ndarray
    docnos: np.ndarray
    scores: np.ndarray

    def take(self, rows: np.ndarray) -> 'Hits':
        return Hits(self.queries[rows], self.docnos[rows], self.scores[rows])

    @staticmethod
    def of_frame(frame: pd.DataFrame) -> 'Hits':
        """The hits of a result frame whose qids are the queries' positions (as strings)."""
        return Hits(frame['qid'].astype(np.int64).to_numpy(), frame['docno'].to_numpy(dtype=object),
                    frame['score'].to_numpy())

    @staticmethod
    def concat(parts: list['Hits']) -> 'Hits':
        return Hits(*(np.concatenate([np.asarray(getattr(p, f), dtype=object if f == 'docnos' else None)
                                      for p in parts]) for f in Hits._fields))


def ranked(queries: np.ndarray, docnos, scores: np.ndarray, k: int) -> tuple[np.ndarray | None, np.ndarray]:
    """The rule applied to hits (``queries``: each hit's query as a position): the positions of the hits kept, in the
    rule's order, at most ``k`` a query (``None``: every hit, in the order given), and their ranks from 0.

    Queries come out in ascending position.  Hits are sorted only when needed (engines sort by score, so only tied
    documents, and queries returned out of order, move), and only tied docnos are compared."""
    queries = np.asarray(queries, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    same = queries[1:] == queries[:-1]
    ordered = bool((queries[1:] >= queries[:-1]).all() and not (same & (scores[1:] > scores[:-1])).any())
    ties = np.flatnonzero(same & (scores[1:] == scores[:-1]))
    order = None
    if ordered and len(ties):
        pairs = np.asarray(docnos[np.concatenate([ties, ties + 1])], dtype=str)
        ordered = bool((pairs[:len(ties)] < pairs[len(ties):]).all())
    if not ordered:
        order = np.lexsort((np.asarray(docnos, dtype=str), -scores, queries))
        queries = queries[order]
    ranks = np.arange(len(queries)) - np.searchsorted(queries, queries, side='left')
    keep = ranks < k
    if order is None and keep.all():
        return None, ranks
    return (np.flatnonzero(keep) if order is None else order[keep]), ranks[keep]


def tie_ordered(frame: pd.DataFrame, k: int, positions: np.ndarray | None = None) -> pd.DataFrame:
    """``frame`` (results of several queries) in the rule's order, at most ``k`` rows per query, ``rank`` from 0.

    ``positions``: each row's query as its position in the input (queries come out in that order); default: the
    order in which the frame's qids first appear."""
    if positions is None:
        positions = pd.factorize(frame['qid'].astype(str))[0]
    rows, ranks = ranked(positions, frame['docno'].array, frame['score'].to_numpy(), k)
    dtype = frame['rank'].dtype if 'rank' in frame.columns else np.int64
    if rows is None:
        if 'rank' in frame.columns and (ranks == frame['rank'].to_numpy()).all() and \
                isinstance(frame.index, pd.RangeIndex) and frame.index.start == 0 and frame.index.step == 1:
            return frame  # as the engine gave it
        rows = np.arange(len(frame))
    # one take of each column: cheaper than taking whole rows and assigning the ranks into the copy
    columns = {c: frame[c].array.take(rows) for c in frame.columns if c != 'rank'}
    columns['rank'] = ranks.astype(dtype)
    names = list(frame.columns) if 'rank' in frame.columns else list(columns)
    return pd.DataFrame({c: columns[c] for c in names}, copy=False)


def top_hits(search: Callable[[np.ndarray | None, int], Hits], k: int, limit: int) -> tuple[Hits, np.ndarray]:
    """The top ``k`` hits of each query under the rule, and their ranks, from an engine that returns its best
    ``depth`` documents per query (ties among them arbitrary).

    ``search(rows, depth)`` returns the :class:`Hits` of the queries at positions ``rows`` (``None``: all of them),
    numbered by their place in ``rows``, at ``depth``; ``limit``: the depth at which the engine returns every
    matching document (the number of documents).  First asked a little deeper than ``k`` (:func:`first_depth`); a
    query whose last score still equals its ``k``-th is asked again, twice as deep, alone, until it is not or the
    depth reaches ``limit``."""
    depth, rows, parts = first_depth(k, limit), None, []
    while True:
        found = search(rows, depth)
        queries = np.asarray(found.queries if rows is None else rows[found.queries], dtype=np.int64)
        found = found._replace(queries=queries)
        if depth >= limit or not len(queries):
            parts.append(found)
            break
        scores = np.asarray(found.scores, dtype=np.float64)
        starts = np.flatnonzero(np.concatenate([[True], queries[1:] != queries[:-1]]))
        ends = np.append(starts[1:], len(queries))
        deeper = [int(queries[s]) for s, e in zip(starts.tolist(), ends.tolist())
                  if e - s >= depth and scores[s + k - 1] == scores[e - 1]]
        if not deeper:
            parts.append(found)
            break
        parts.append(found.take(np.flatnonzero(~np.isin(queries, deeper))))
        rows, depth = np.asarray(deeper, dtype=np.int64), min(limit, depth * 2)
    hits = parts[0] if len(parts) == 1 else Hits.concat(parts)
    kept, ranks = ranked(hits.queries, hits.docnos, hits.scores, k)
    return (hits if kept is None else hits.take(kept)), ranks


def first_depth(k: int, limit: int) -> int:
    """The depth an engine is first asked for to rank ``k`` (at most ``limit``): a sixteenth more than ``k``, and one
    at least, so that the usual ties across the cut (quantized scores tie often deep in a ranking) are seen in the
    same call."""
    return min(k + 1 + k // 16, limit)
