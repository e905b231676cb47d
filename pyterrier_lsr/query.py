"""Inference-free query encoders: a query is its tokens, each weighted by a static per-term table.

No transformer runs at query time: the cost is a tokenizer call and a dictionary look-up.  The table is
saved as ``idf.json`` (``{token: weight}``), the file OpenSearch's doc-only sparse models ship.
"""
import json
import math
import os
from collections import Counter
from typing import Dict, Iterable, List, Mapping, Sequence

from .encoders import SparseTextEncoder
from .encoding import is_blank

WEIGHTS_FILE = 'idf.json'


def idf(df: int, num_docs: int) -> float:
    """BM25's idf, ``log(1 + (N - df + 0.5) / (df + 0.5))``: positive even for terms in every document."""
    return math.log(1. + (num_docs - df + 0.5) / (df + 0.5))


class StaticQueryEncoder(SparseTextEncoder):
    """``query_toks`` = each distinct query token weighted by ``weights[token]``.

    Tokens are produced by the document model's tokenizer (without special tokens, truncated to
    ``max_length``); a token repeated in the query counts once; tokens absent from ``weights`` or with a
    weight of 0 are dropped, so a query of unknown tokens has empty ``query_toks`` (and retrieves nothing).
    """
    text_field = 'query'
    out_field = 'query_toks'

    def __init__(self, tokenizer, weights: Mapping[str, float], max_length: int = 256):
        self.tokenizer = tokenizer
        self.weights = dict(weights)
        self.max_length = max_length
        self._special = set(tokenizer.all_special_tokens)

    def encode(self, texts: Sequence) -> List[Dict[str, float]]:
        texts = ['' if is_blank(t) else str(t) for t in texts]
        ids = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.max_length,
                             return_attention_mask=False)['input_ids'] if texts else []
        out = []
        for row in ids:
            vec = {}
            for token in self.tokenizer.convert_ids_to_tokens(row):
                weight = self.weights.get(token, 0.)
                if weight and token not in self._special:
                    vec[token] = weight
            out.append(vec)
        return out

    def save_pretrained(self, path: str):
        """Writes the tokenizer and ``idf.json`` into ``path`` (the OpenSearch doc-only layout)."""
        os.makedirs(path, exist_ok=True)
        self.tokenizer.save_pretrained(path)
        with open(os.path.join(path, WEIGHTS_FILE), 'wt', encoding='utf8') as fout:
            json.dump(self.weights, fout, ensure_ascii=False)

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs) -> 'StaticQueryEncoder':
        """Loads a tokenizer and its ``idf.json`` from a local folder or a hub model name."""
        from transformers import AutoTokenizer
        if os.path.isdir(name_or_path):
            weights_path = os.path.join(name_or_path, WEIGHTS_FILE)
        else:
            from huggingface_hub import hf_hub_download
            weights_path = hf_hub_download(name_or_path, WEIGHTS_FILE)
        with open(weights_path, encoding='utf8') as fin:
            weights = json.load(fin)
        return cls(AutoTokenizer.from_pretrained(name_or_path), weights, **kwargs)

    def __repr__(self):
        return f'{type(self).__name__}({len(self.weights)} terms)'


class IDFQueryEncoder(StaticQueryEncoder):
    """Static query weights = :func:`idf` of each token, from an index's or a corpus' document frequencies."""

    @classmethod
    def from_document_frequencies(cls, tokenizer, df: Mapping[str, int], num_docs: int, **kwargs) -> 'IDFQueryEncoder':
        return cls(tokenizer, {term: idf(n, num_docs) for term, n in df.items() if n > 0}, **kwargs)

    @classmethod
    def from_index(cls, index, tokenizer=None, **kwargs) -> 'IDFQueryEncoder':
        """Document frequencies of the index's (quantized) document vectors; the index model's tokenizer."""
        if tokenizer is None:
            tokenizer = index.model().tokenizer
        return cls.from_document_frequencies(tokenizer, index.document_frequencies(), index.num_docs(), **kwargs)

    @classmethod
    def from_corpus(cls, tokenizer, texts: Iterable[str], max_length: int = 256, **kwargs) -> 'IDFQueryEncoder':
        """Document frequencies of the tokens of ``texts`` (each text truncated to ``max_length`` tokens)."""
        df, num_docs = Counter(), 0
        for text in texts:
            num_docs += 1
            if not is_blank(text):
                ids = tokenizer(str(text), add_special_tokens=False, truncation=True, max_length=max_length)['input_ids']
                df.update(set(tokenizer.convert_ids_to_tokens(ids)))
        return cls.from_document_frequencies(tokenizer, df, num_docs, max_length=max_length, **kwargs)
