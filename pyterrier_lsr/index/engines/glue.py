"""What the in-process engines (BMP, Seismic) share: importing an optional package, reading the stored vectors as
quantized arrays, and a retriever that searches one query at a time."""
import importlib
import json
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from ...storage import write_json

__all__ = ['require', 'quantized_csr', 'ToksSearcher', 'write_terms', 'read_terms', 'check_threads']

TERMS_FILE = 'terms.json'


def require(module: str, package: str, extra: str = 'engines'):
    """Imports ``module`` or raises an ImportError that names the pip extra installing it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'this engine needs the {package} package: pip install "pyterrier-lsr[{extra}]" '
                          f'(or pip install {package})') from e


def check_threads(threads: int) -> int:
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f'threads must be an integer >= 1, got {threads!r}')
    return threads


def quantized_csr(index) -> Tuple[List[str], List[str], np.ndarray, np.ndarray, np.ndarray]:
    """The index's vectors as ``(docnos, terms, indptr, term_ids, impacts)`` with PISA's impacts ``int(w * scale)``
    (int64); postings whose impact is 0 are removed, so every engine stores exactly the terms PISA stores."""
    docnos, terms, indptr, ids, weights = index.vectors().to_csr()
    impacts = (weights.astype(np.float64) * index.scale).astype(np.int64)
    keep = impacts > 0
    if not keep.all():
        # Rows shrink by the number of dropped postings before each row end.
        dropped = np.concatenate([[0], np.cumsum(~keep)])
        indptr = indptr - dropped[indptr]
        ids, impacts = ids[keep], impacts[keep]
    return docnos, terms, indptr, ids, impacts


def write_terms(folder: Path, terms: Sequence[str]) -> None:
    write_json(Path(folder) / TERMS_FILE, list(terms))


def read_terms(folder: Path) -> Dict[str, int]:
    return {t: i for i, t in enumerate(json.loads((Path(folder) / TERMS_FILE).read_text()))}


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


class ToksSearcher(pt.Transformer):
    """Runs ``search(list of query_toks) -> [(docnos, scores), ...]`` (best first) over a frame's non-empty queries and
    returns ``qid, docno, score, rank`` (rank from 0, as PISA) with the input's other columns; an empty
    ``query_toks`` retrieves no rows."""

    def __init__(self, search: Callable[[List[Dict[str, float]]], List[Tuple[Sequence[str], Sequence[float]]]],
                 name: str):
        self.search = search
        self.name = name

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        asked = [row for row, toks in enumerate(inp['query_toks']) if toks]
        found = self.search([inp['query_toks'].iloc[row] for row in asked]) if asked else []
        rows, docnos, scores, ranks = [], [], [], []
        for row, (row_docnos, row_scores) in zip(asked, found):
            rows.extend([row] * len(row_docnos))
            docnos.extend(row_docnos)
            scores.extend(row_scores)
            ranks.extend(range(len(row_docnos)))
        out = inp.iloc[rows].reset_index(drop=True)
        return out.assign(docno=pd.Series(docnos, dtype=object), score=np.asarray(scores, dtype=np.float64),
                          rank=np.asarray(ranks, dtype=np.int64))

    def __repr__(self):
        return self.name
