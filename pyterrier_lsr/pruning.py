"""Test-time pruning of sparse vectors (ESPLADE-style), the same rules for documents and queries.

``Prune(top_n=64)`` keeps a vector's 64 largest weights; ``Prune(ratio=0.1)`` keeps weights >= 0.1 x the vector's
maximum; ``Prune(threshold=0.5)`` keeps weights >= 0.5. Rules combine (a term must pass all). Zero and negative
weights are always dropped; pruning never adds or changes a weight. Ties at the ``top_n`` cut are broken by term
string so results are deterministic.
"""
from typing import Dict, Optional, Sequence

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

FIELDS = ('toks', 'query_toks')


def prune(vector: Dict[str, float], top_n: Optional[int] = None, ratio: Optional[float] = None,
          threshold: Optional[float] = None) -> Dict[str, float]:
    """One vector, pruned by the rules given (see the module docs)."""
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
        if top_n is not None and top_n < 0:
            raise ValueError(f'top_n must be >= 0, got {top_n}')
        if ratio is not None and not 0 <= ratio <= 1:
            raise ValueError(f'ratio must be in [0, 1], got {ratio}')
        self.top_n, self.ratio, self.threshold = top_n, ratio, threshold
        self.fields = list(fields) if fields is not None else None

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        fields = self.fields or [f for f in FIELDS if f in inp.columns]
        if not fields:
            pta.validate.columns(inp, includes=['toks'])  # raises, naming the column it needs
        pta.validate.columns(inp, includes=fields)
        return inp.assign(**{f: [prune(v if isinstance(v, dict) else {}, self.top_n, self.ratio, self.threshold)
                                 for v in inp[f]] for f in fields})

    def __repr__(self):
        rules = ', '.join(f'{k}={v}' for k, v in [('top_n', self.top_n), ('ratio', self.ratio),
                                                  ('threshold', self.threshold)] if v is not None)
        return f'Prune({rules})'
