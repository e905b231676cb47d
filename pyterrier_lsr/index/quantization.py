"""The one quantization convention, and the checks every vector passes before it reaches an engine.

Encoders emit float weights in the model's own units (SPLADE: ``log(1 + relu(logit))``, roughly 0-5).
An index has one ``scale`` (default 100), stored in its ``lsr.json``:

* document impact  = ``int(weight * scale)``; terms whose impact is 0 are not indexed;
* query weight     = ``int(weight * scale)`` (PISA repeats a query term that many times);
* score            = ``sum_t int(q_t * scale) * int(d_t * scale)``, i.e. ``scale**2`` times the dot product
  up to rounding.

Encoders never scale; the indexer and the retrievers read the same ``scale``.

Weights must be finite, non-negative and at most :data:`MAX_WEIGHT` (document and query side): PISA repeats a query
term ``int(w * scale)`` times, so an unbounded weight hangs or exhausts memory, and impacts are 32-bit integers.

PISA lowercases query terms (pre-tokenized ones too), so a term with uppercase letters (cased vocabularies) is stored
and queried in an escaped form (:func:`pisa_term`); lowercase terms are stored as they are.
"""
import math
from typing import Dict, Mapping

from ..checks import MAX_WEIGHT, check_weights

__all__ = ['MAX_WEIGHT', 'quantize', 'pisa_term', 'check_vector', 'check_docno']


def quantize(vector: Mapping[str, float], scale: float) -> Dict[str, int]:
    """``{term: int(weight * scale)}`` without the zeros, exactly as PISA stores document impacts."""
    out = {}
    for term, weight in vector.items():
        impact = int(weight * scale)
        if impact > 0:
            out[term] = impact
    return out


def pisa_term(term: str) -> str:
    """The form of ``term`` PISA stores: each uppercase letter becomes ``^`` + its lowercase and ``^`` becomes ``^^``,
    so distinct terms stay distinct after PISA lowercases queries."""
    if '^' not in term and not any(c.isupper() for c in term):
        return term
    return ''.join('^^' if c == '^' else '^' + c.lower() if c.isupper() else c for c in term)


def check_docno(docno) -> str:
    """``docno`` as a string PISA can store (one per line), or a ValueError naming it."""
    if docno is None or (isinstance(docno, float) and math.isnan(docno)):
        raise ValueError(f'docno {docno!r} is missing')
    docno = str(docno)
    if not docno or docno != docno.strip() or any(c in docno for c in '\n\r\x00'):
        raise ValueError(f'docno {docno!r} is empty, has surrounding whitespace or contains a line break or NUL, '
                         'which PISA cannot store')
    return docno


def check_vector(vector, what: str) -> Dict[str, float]:
    """``vector`` checked (:func:`~pyterrier_lsr.encoding.check_weights`); ``what`` names it in the error
    (``"document 'd1'"``, ``"query '3'"``).  None/NaN (a missing vector) is an empty one."""
    if vector is None or (isinstance(vector, float) and math.isnan(vector)):
        return {}
    return check_weights(vector, what)
