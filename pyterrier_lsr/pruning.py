"""Test-time pruning of sparse vectors (ESPLADE-style), the same rules for documents and queries.

``Prune(top_n=64)`` keeps a vector's 64 largest weights; ``Prune(ratio=0.1)`` keeps weights >= 0.1 x the vector's
maximum; ``Prune(threshold=0.5)`` keeps weights >= 0.5. Rules combine (a term must pass all). Zero and negative
weights are always dropped; pruning never adds or changes a weight. Ties at the ``top_n`` cut are broken by term
string so results are deterministic.

Rules are validated when a :class:`Prune` is made (``top_n`` an int >= 0, ``ratio`` in [0, 1], ``threshold`` a
finite number >= 0), and vectors when pruned: a NaN or infinite weight, a non-number weight or a non-dict vector
raises an error naming the term or row (a missing vector, None/NaN, counts as empty).
"""
import math
import numbers
from typing import Dict, Optional, Sequence

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from .encoding import is_missing

FIELDS = ('toks', 'query_toks')


def prune(vector: Dict[str, float], top_n: Optional[int] = None, ratio: Optional[float] = None,
          threshold: Optional[float] = None) -> Dict[str, float]:
    """One vector, pruned by the rules given (see the module docs)."""
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

    Compose after any encoder: ``splade.doc_encoder() >> Prune(top_n=64)``,
    ``Prune(ratio=0.1, fields=['query_toks'])``.
    """

    def __init__(self, top_n: Optional[int] = None, ratio: Optional[float] = None, threshold: Optional[float] = None,
                 fields: Optional[Sequence[str]] = None):
        if top_n is None and ratio is None and threshold is None:
            raise ValueError('give at least one of top_n, ratio, threshold')
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, numbers.Integral) or top_n < 0):
            raise ValueError(f'top_n must be an int >= 0, got {top_n!r}')
        for name, value, high, bounds in (('ratio', ratio, 1., 'in [0, 1]'),
                                          ('threshold', threshold, math.inf, '>= 0')):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not 0 <= value <= high or not math.isfinite(value)):
                raise ValueError(f'{name} must be a finite number {bounds}, got {value!r}')
        self.top_n, self.ratio, self.threshold = top_n, ratio, threshold
        self.fields = list(fields) if fields is not None else None

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        fields = self.fields or [f for f in FIELDS if f in inp.columns]
        if not fields:
            pta.validate.columns(inp, includes=['toks'])  # raises, naming the column it needs
        pta.validate.columns(inp, includes=fields)
        return inp.assign(**{f: [self._prune(v, f, row) for row, v in enumerate(inp[f])] for f in fields})

    def _prune(self, vector, field: str, row: int) -> Dict[str, float]:
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
