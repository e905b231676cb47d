"""Inference-free query encoders: a query is its tokens, each weighted by a static per-term table.

No transformer runs at query time: the cost is a tokenizer call and a dictionary look-up.  The table is
saved as ``idf.json`` (``{token: weight}``), the file OpenSearch's doc-only sparse models ship.  IDF,
learned and binary query sides are all a :class:`StaticQueryEncoder` with a different table;
:class:`StaticQueryWeights` is the trainable form of the table used by doc-only training.
"""
import itertools
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from ..core import storage
from ..core.checks import check_int, check_weights
from ..core.encoding import as_text, is_blank
from ..core.folders import local_folder, model_settings
from ..core.model_files import load_tokenizer, read_tensors
from .encoders import SparseTextEncoder

WEIGHTS_FILE = 'idf.json'


def idf(df: int, num_docs: int) -> float:
    """BM25's idf, ``log(1 + (N - df + 0.5) / (df + 0.5))``: positive even for terms in every document."""
    return math.log(1. + (num_docs - df + 0.5) / (df + 0.5))


class StaticQueryEncoder(SparseTextEncoder):
    """``query_toks`` = each distinct query token weighted by ``weights[token]``.

    Tokens are produced by the document model's tokenizer (without special tokens, truncated to
    ``max_length``); a token repeated in the query counts once; tokens absent from ``weights`` or with a
    weight of 0 are dropped, so a query of unknown tokens has empty ``query_toks`` (and retrieves nothing).

    Args:
        tokenizer: the document model's tokenizer.
        weights: ``{token: weight}``, numbers in ``[0, MAX_WEIGHT]``.
        max_length: a query's tokens beyond this many are dropped.

    Raises:
        WeightError: (a ``ValueError``) a weight that is not a number in ``[0, MAX_WEIGHT]``, naming its token.
        ValueError: a ``max_length`` below 1.
        TypeError: a query that is not a ``str`` (naming its row).

    Example::

        static = StaticQueryEncoder.from_pretrained("opensearch-project/opensearch-neural-sparse-encoding-doc-v2-mini")
        pipeline = static >> index.toks_retriever()     # query_toks from the table, then PISA
        StaticQueryEncoder.binary(splade.tokenizer)      # every token weighs 1
    """
    text_field = 'query'
    out_field = 'query_toks'
    label = 'static queries'

    def __init__(self, tokenizer, weights: Mapping[str, float], max_length: int = 256):
        self.tokenizer = tokenizer
        self.weights = check_weights(weights)
        self.max_length = check_int('max_length', max_length, 1)
        self._special = set(tokenizer.all_special_tokens)
        self._backend = None
        if tokenizer.is_fast:
            # The Rust tokenizer directly (half the per-query cost of the Python wrapper), as a copy of our own: the
            # shared one keeps the truncation its last caller set (a document encoder's 256 tokens, special tokens
            # included), which would cut long queries short of max_length.
            from tokenizers import Tokenizer
            self._backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            self._backend.no_truncation()
            self._backend.no_padding()

    def _tokens(self, texts: list[str]) -> list[list[str]]:
        if self._backend is not None:
            rows = self._backend.encode_batch(texts, add_special_tokens=False)
            return [row.tokens[:self.max_length] for row in rows]
        ids = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.max_length)['input_ids']
        return [self.tokenizer.convert_ids_to_tokens(row) for row in ids]

    def encode(self, texts: Sequence) -> list[dict[str, float]]:
        texts = [as_text(t, i) for i, t in enumerate(texts)]
        out = []
        for tokens in (self._tokens(texts) if texts else []):
            vec = {}
            for token in tokens:
                weight = self.weights.get(token, 0.)
                if weight and token not in self._special:
                    vec[token] = weight
            out.append(vec)
        return out

    @classmethod
    def binary(cls, tokenizer, **kwargs) -> 'StaticQueryEncoder':
        """Every non-special token of the vocabulary weighs 1."""
        special = set(tokenizer.all_special_tokens)
        return cls(tokenizer, {t: 1. for t in tokenizer.get_vocab() if t not in special}, **kwargs)

    def save_pretrained(self, path: str):
        """Writes the tokenizer and ``idf.json`` into ``path`` (the OpenSearch doc-only layout)."""
        os.makedirs(path, exist_ok=True)
        self.tokenizer.save_pretrained(path)
        storage.write_json(Path(path) / WEIGHTS_FILE, self.weights, indent=None)  # a reader never sees half a table

    @classmethod
    def from_pretrained(cls, name_or_path: str, **kwargs) -> 'StaticQueryEncoder':
        """Loads a query side from a local folder or hub name holding either a tokenizer and ``idf.json`` (OpenSearch
        layout) or a sentence-transformers sparse model whose query route is a ``SparseStaticEmbedding``
        (read without importing sentence-transformers)."""
        folder = local_folder(name_or_path)
        static = static_module_folder(folder)
        if static is not None:
            weight = read_tensors(static / 'model.safetensors', ['weight'])['weight']
            tokenizer = load_tokenizer(static)
            # the module truncates at its tokenizer's limit, as sentence-transformers does (none where it sets none)
            limit = tokenizer.model_max_length
            kwargs.setdefault('max_length', limit if isinstance(limit, int) and limit < 1_000_000 else 1_000_000)
            return cls.from_tensor(tokenizer, weight, where=str(static / 'model.safetensors'), **kwargs)
        weights = check_weights(storage.read_json(folder / WEIGHTS_FILE, 'query weights'), str(folder / WEIGHTS_FILE))
        return cls(load_tokenizer(folder), weights, **kwargs)

    @classmethod
    def from_tensor(cls, tokenizer, weight: torch.Tensor, where: str = 'weight', **kwargs) -> 'StaticQueryEncoder':
        """A table from a weight per token id (zeros are dropped); ``where`` names the tensor in errors."""
        if weight.dim() != 1:  # a 2-D table (embeddings, say) is some other module's: one weight per token id here
            raise ValueError(f'{where}: a static query side holds one weight per token id (a 1-D tensor), got shape '
                             f'{tuple(weight.shape)}')
        weight = weight.detach().double().cpu()  # a table saved in float64 (ours) reads back exactly
        vocab = tokenizer.get_vocab()
        table = {t: weight[i].item() for t, i in vocab.items() if i < len(weight) and weight[i] != 0}
        return cls(tokenizer, table, **kwargs)

    def __eq__(self, other):
        """Encoders of the same table, tokenizer and length limit are equal (``pt.Experiment(precompute_prefix=True)``
        then encodes the queries once for every system they start)."""
        return type(other) is type(self) and (other.max_length, other.weights) == (self.max_length, self.weights) and \
            (other.tokenizer is self.tokenizer or other.tokenizer.get_vocab() == self.tokenizer.get_vocab())

    def __hash__(self):
        return hash((type(self).__name__, self.max_length, len(self.weights)))

    def __repr__(self):
        return f'{type(self).__name__}({len(self.weights)} terms)'


class IDFQueryEncoder(StaticQueryEncoder):
    """Static query weights = :func:`idf` of each token, from an index's or a corpus' document frequencies.

    Build it with :meth:`from_index` (document frequencies of an index's quantized vectors), :meth:`from_corpus`
    (of a corpus's tokens) or :meth:`from_document_frequencies`; the arguments of the constructor are
    :class:`StaticQueryEncoder`'s.

    Raises:
        ValueError: from :meth:`from_index`, for an index whose terms are not the tokenizer's tokens (latent ids).

    Example::

        idf = IDFQueryEncoder.from_index(index)             # an LsrIndex of a SPLADE model
        index.retriever(query_encoder=idf).search("radio waves")
        idf.save_pretrained("idf-queries")                  # tokenizer + idf.json
    """
    label = 'IDF queries'

    @classmethod
    def from_document_frequencies(cls, tokenizer, df: Mapping[str, int], num_docs: int, **kwargs) -> 'IDFQueryEncoder':
        return cls(tokenizer, {term: idf(n, num_docs) for term, n in df.items() if n > 0}, **kwargs)

    @classmethod
    def from_index(cls, index, tokenizer=None, **kwargs) -> 'IDFQueryEncoder':
        """Document frequencies of the index's (quantized) document vectors; the index model's tokenizer.  Refuses an
        index whose terms are not tokens (latent ids of SAE-SPLADE, Latent Terms, SSR): a query's tokens would match
        none of them."""
        recorded = index.meta.get('model') or {}
        namespace = model_settings(index.path / recorded['path']).get('terms') if recorded.get('path') else None
        if namespace not in (None, 'vocabulary'):
            raise ValueError(f'{index.path}: its terms are {namespace} ids of a {recorded.get("kind")} model, not '
                             'tokens; IDF query weights need an index of token terms (SPLADE and its relatives)')
        if tokenizer is None:
            tokenizer = index.model().tokenizer
        df = index.document_frequencies()
        vocabulary = tokenizer.get_vocab()
        if df and not any(t in vocabulary for t in itertools.islice(df, 1000)):
            raise ValueError(f'{index.path}: none of its terms is a token of the tokenizer; IDF query weights need '
                             'an index of that tokenizer\'s tokens')
        return cls.from_document_frequencies(tokenizer, df, index.num_docs(), **kwargs)

    @classmethod
    def from_corpus(cls, tokenizer, texts: Iterable[str], max_length: int = 256, **kwargs) -> 'IDFQueryEncoder':
        """Document frequencies of the tokens of ``texts`` (each text truncated to ``max_length`` tokens)."""
        df, num_docs = Counter(), 0
        for text in texts:
            num_docs += 1
            if not is_blank(text):
                ids = tokenizer(str(text), add_special_tokens=False, truncation=True,
                                max_length=max_length)['input_ids']
                df.update(set(tokenizer.convert_ids_to_tokens(ids)))
        return cls.from_document_frequencies(tokenizer, df, num_docs, max_length=max_length, **kwargs)


class StaticQueryWeights(nn.Module):
    """The trainable query side of doc-only training: ``q_j = w_j`` for each token ``j`` present in the query.

    Call it as the ``query_encoder`` of :func:`pyterrier_lsr.train.train` (with its parameters as
    ``extra_parameters`` to learn them, or frozen for a fixed IDF side); :meth:`to_encoder` exports the learned
    table as a :class:`StaticQueryEncoder`.  Negative learned weights are clipped to 0 (``relu``).
    """

    def __init__(self, tokenizer, init: Mapping[str, float] | None = None, trainable: bool = True):
        super().__init__()
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        weight = torch.ones(max(vocab.values()) + 1) if init is None else torch.zeros(max(vocab.values()) + 1)
        for token, value in (init or {}).items():
            if token in vocab:
                weight[vocab[token]] = value
        weight[tokenizer.all_special_ids] = 0.
        self.weight = nn.Parameter(weight, requires_grad=trainable)

    def forward(self, texts: Sequence[str], tokenizer=None, max_length: int = 256) -> torch.Tensor:
        ids = self.tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_length,
                             padding=True, return_tensors='pt')
        presence = torch.zeros(len(texts), len(self.weight), device=self.weight.device)
        device = self.weight.device
        presence.scatter_(1, ids['input_ids'].to(device), ids['attention_mask'].float().to(device))
        presence[:, self.tokenizer.all_special_ids] = 0.
        return presence * torch.relu(self.weight)

    def to_encoder(self, **kwargs) -> StaticQueryEncoder:
        return StaticQueryEncoder.from_tensor(self.tokenizer, torch.relu(self.weight), **kwargs)


def static_module_folder(folder: Path) -> Path | None:
    """The folder of a sentence-transformers ``SparseStaticEmbedding`` module: ``folder`` itself or one inside it, if
    any."""
    for path in sorted(folder.rglob('model.safetensors')):
        if 'SparseStaticEmbedding' in path.parent.name:
            return path.parent
    return None
