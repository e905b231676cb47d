"""Test-time pruning of sparse vectors (ESPLADE-style), the same rules for documents and queries.

``Prune(top_n=64)`` keeps a vector's 64 largest weights; ``Prune(ratio=0.1)`` keeps weights >= 0.1 x the vector's
maximum; ``Prune(threshold=0.5)`` keeps weights >= 0.5. Rules combine (a term must pass all). Zero and negative
weights are always dropped; pruning never adds or changes a weight. Ties at the ``top_n`` cut are broken by term
string so results are deterministic.

Rules are validated when a :class:`Prune` is made or :func:`prune` is called (``top_n`` an int >= 0, ``ratio`` in
[0, 1], ``threshold`` a finite number >= 0), and vectors when pruned: a NaN or infinite weight, a non-number weight
or a non-dict vector raises an error naming the term or row (a missing vector, None/NaN, counts as empty).
"""
import math
import numbers
from collections.abc import Sequence

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from ..core.checks import check_choice, check_float, check_int, is_missing

FIELDS = ('toks', 'query_toks')


def check_rules(top_n: int | None, ratio: float | None, threshold: float | None):
    """The rules, checked (one error naming the bad one); at least one must be given."""
    if top_n is None and ratio is None and threshold is None:
        raise ValueError('give at least one of top_n, ratio, threshold')
    return (None if top_n is None else check_int('top_n', top_n, 0),
            None if ratio is None else check_float('ratio', ratio, 0, 1),
            None if threshold is None else check_float('threshold', threshold, 0))


def prune(vector: dict[str, float], top_n: int | None = None, ratio: float | None = None,
          threshold: float | None = None) -> dict[str, float]:
    """One vector, pruned by the rules given (see the module docs)."""
    top_n, ratio, threshold = check_rules(top_n, ratio, threshold)
    for term, weight in vector.items():
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ValueError(f'cannot prune the weight {weight!r} of term {term!r}: weights must be finite numbers')
    kept = {t: w for t, w in vector.items() if w > 0}
    if not kept:
        return {}
    if threshold is not None:
        kept = {t: w for t, w in kept.items() if w >= threshold}
    if ratio is not None and kept:
        cut = ratio * max(vector.values())
        kept = {t: w for t, w in kept.items() if w >= cut}
    if top_n is not None and len(kept) > top_n:
        kept = dict(sorted(kept.items(), key=lambda tw: (-tw[1], tw[0]))[:top_n])
    return kept


class Prune(pt.Transformer):
    """Prunes ``toks`` and/or ``query_toks`` (``fields``; default: whichever the frame has).

    Args:
        top_n: keep a vector's ``top_n`` largest weights (ties at the cut broken by term).
        ratio: keep the weights at least ``ratio`` times the vector's largest.
        threshold: keep the weights at least ``threshold``.
        fields: ``'toks'``, ``'query_toks'`` or both; default: whichever the frame has.

    Returns:
        A transformer that returns its input frame with the fields pruned (a weight is never added or changed).

    Raises:
        ValueError: no rule given, a rule out of range, or an unknown field (naming it).
        pyterrier.validate.InputValidationError: a frame without the fields.

    Example::

        (splade.doc_encoder() >> Prune(top_n=64) >> index).index(corpus)
        splade.query_encoder() >> Prune(ratio=0.1) >> index.toks_retriever()
    """

    def __init__(self, top_n: int | None = None, ratio: float | None = None, threshold: float | None = None,
                 fields: Sequence[str] | None = None):
        self.top_n, self.ratio, self.threshold = check_rules(top_n, ratio, threshold)
        if isinstance(fields, str):  # a list of the string's characters is never meant
            fields = [fields]
        self.fields = None if fields is None else [check_choice('fields', f, FIELDS) for f in fields]
        if self.fields == []:  # else it would mean the default, whichever fields the frame has
            raise ValueError(f'fields must name at least one of {", ".join(map(repr, FIELDS))}, or be None')

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        fields = self.fields or [f for f in FIELDS if f in inp.columns]
        if not fields:
            pta.validate.columns(inp, includes=['toks'])  # raises, naming the column it needs
        pta.validate.columns(inp, includes=fields)
        return inp.assign(**{f: [self._prune(v, f, row) for row, v in enumerate(inp[f])] for f in fields})

    def _prune(self, vector, field: str, row: int) -> dict[str, float]:
        if is_missing(vector):
            return {}
        if not isinstance(vector, dict):
            raise TypeError(f'{field} at row {row} is {type(vector).__name__}, not a {{term: weight}} dict')
        try:
            return prune(vector, self.top_n, self.ratio, self.threshold)
        except ValueError as e:
            raise ValueError(f'{field} at row {row}: {e}') from None

    def __repr__(self):
        rules = ', '.join(f'{k}={v}' for k, v in [('top_n', self.top_n), ('ratio', self.ratio),
                                                  ('threshold', self.threshold)] if v is not None)
        return f'Prune({rules})'
