"""BM25 over a PISA text index of a corpus, built once into a folder and reopened afterwards, quietly: PISA's
``[info]`` lines and progress bars (C++ writes to the file descriptors) are silenced unless ``verbose=True``."""
from collections.abc import Iterable

import pandas as pd
import pyterrier as pt

from ..core.quiet import quiet_native


class BM25(pt.Transformer):
    """BM25 retrieval from a PISA text index (``pyterrier_pisa``'s, ``params`` go to its ``bm25()``), named by its
    folder in experiment tables."""

    def __init__(self, index, **params):
        self.index = index
        with quiet_native(params.get('verbose', False)):  # PISA prepares its BM25 files on first use, loudly
            self.retriever = index.bm25(**params)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        return self.retriever(inp)

    def __repr__(self):
        return 'BM25'


def bm25_index(path, corpus: Iterable[dict], verbose: bool = False):
    """A ``pyterrier_pisa.PisaIndex`` of ``corpus``'s ``text`` (``docno, text`` dicts) at ``path``, built if absent."""
    import pyterrier_pisa
    index = pyterrier_pisa.PisaIndex(str(path), text_field='text')
    if not index.built():
        with quiet_native(verbose):
            index.index(iter(corpus))
    return index


def bm25(path, corpus: Iterable[dict], verbose: bool = False, **params) -> BM25:
    """:class:`BM25` over a PISA index of ``corpus``'s text at ``path``, built if absent."""
    return BM25(bm25_index(path, corpus, verbose), verbose=verbose, **params)
