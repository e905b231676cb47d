"""Pseudo-queries from documents: sentence windows (:func:`~pyterrier_lsr.train.pseudo_query`) or high-idf keywords
(:func:`keyword_query`), ``per_doc`` of them per document."""
import math
import random
import re
from collections import Counter
from collections.abc import Sequence

from ...core.encoding import is_blank
from ..data import pseudo_query

_WORD = re.compile(r'[a-z][a-z0-9-]{2,}')


def document_frequencies(texts: Sequence[str]) -> Counter:
    return Counter(w for text in texts for w in set(_WORD.findall(text.lower())))


def keyword_query(text: str, df: Counter, num_docs: int, rng: random.Random, min_words: int = 2,
                  max_words: int = 5) -> str:
    """A keyword pseudo-query: ``min_words..max_words`` distinct words of ``text`` drawn with probability proportional
    to tf x idf², kept in document order (so frequent, uninformative words are rarely drawn)."""
    words = _WORD.findall(text.lower())
    tf = Counter(words)
    if not tf:
        return pseudo_query(text, rng)
    vocab = list(tf)
    weights = [tf[w] * math.log(1 + num_docs / df.get(w, 1)) ** 2 for w in vocab]
    k = min(len(vocab), rng.randint(min_words, max_words))
    chosen = set()
    while len(chosen) < k:
        chosen.add(rng.choices(vocab, weights)[0])
    first = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)
    return ' '.join(sorted(chosen, key=first.get))


def make_queries(docs: dict[str, str], docnos: Sequence[str], kind: str, per_doc: int, rng: random.Random,
                 df: Counter) -> list[dict]:
    """``per_doc`` pseudo-queries for each of ``docnos`` (``mixed`` alternates sentence and keyword queries)."""
    out = []
    for docno in docnos:
        for i in range(per_doc):
            style = kind if kind != 'mixed' else ('sentence', 'keywords')[(len(out)) % 2]
            text = (pseudo_query(docs[docno], rng) if style == 'sentence'
                    else keyword_query(docs[docno], df, len(docs), rng))
            if not is_blank(text):
                out.append({'qid': f'{docno}/{i}', 'query': text, 'pos': docno})
    return out
