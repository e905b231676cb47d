"""The one quantization convention, and the checks every vector passes before it reaches an engine.

Encoders emit float weights in the model's own units (SPLADE: ``log(1 + relu(logit))``, roughly 0-5).
An index has one ``scale`` (default 100), stored in its ``lsr.json``:

* document impact  = ``int(weight * scale)``; terms whose impact is 0 are not indexed;
* query weight     = ``int(weight * scale)`` (PISA repeats a query term that many times);
* score            = ``sum_t int(q_t * scale) * int(d_t * scale)``, i.e. ``scale**2`` times the dot product
  up to rounding.

Encoders never scale; the indexer and the retrievers read the same ``scale``.

Weights must be finite, non-negative and at most :data:`MAX_WEIGHT` (document and query side): PISA repeats a query
term ``int(w * scale)`` times, so an unbounded weight hangs or exhausts memory, and impacts are 32-bit integers (so
``scale`` is at most :data:`~pyterrier_lsr.core.checks.MAX_SCALE`, about 2.1 million).

PISA lowercases query terms (pre-tokenized ones too), so a term that lowercasing would change (cased vocabularies) is
stored and queried in an escaped form (:func:`pisa_term`); other terms are stored as they are.
"""
from collections.abc import Mapping

from ..core.checks import MAX_WEIGHT, check_term

__all__ = ['MAX_WEIGHT', 'quantize', 'pisa_term']


def quantize(vector: Mapping[str, float], scale: float) -> dict[str, int]:
    """``{term: int(weight * scale)}`` without the zeros, exactly as PISA stores document impacts."""
    out = {}
    for term, weight in vector.items():
        impact = int(weight * scale)
        if impact > 0:
            out[term] = impact
    return out


def _escape(c: str) -> str:
    if c == '^':
        return '^^'
    if 'A' <= c <= 'Z':
        return '^' + c.lower()
    if c.lower() != c:
        return '^{' + format(ord(c), 'x') + '}'
    return c


def pisa_term(term: str) -> str:
    """The form of ``term`` PISA stores, unchanged by lowercasing and distinct for distinct terms (a NUL, which PISA
    would truncate at, is refused): ``^`` becomes ``^^``, an ASCII capital ``^`` + its lowercase, and any other
    character that lowercasing changes ``^{<hex code point>}`` (the Kelvin sign is ``^{212a}``, ``K`` is ``^k``).
    Every ``^`` starts an escape and escapes are told apart by their second character, so the form decodes uniquely;
    lowercase terms are stored as they are."""
    if '^' not in term and '\x00' not in term and term.lower() == term:
        return term
    return ''.join(map(_escape, check_term(term)))
