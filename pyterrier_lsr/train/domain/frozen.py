"""The documents' side of query-only adaptation: each document's vector under the frozen document model, encoded
once or read from an index of that model (checked against a fresh encoding of a few documents), and a context that
freezes a module's parameters for one run."""
from collections.abc import Sequence
from contextlib import contextmanager

import torch

from .vectors import sparse_vectors

# an index passed as `documents` must match a fresh encoding of a few documents to this; loose enough for an index
# encoded at another precision, far below what another model or max_length changes
CHECKED_DOCUMENTS = 8
CHECK_TOLERANCE = 0.05


class FrozenDocuments:
    """Each text's vector under the (frozen) document model, computed once (:meth:`encode`, at the length an index
    encodes it) or read from an index of that model (:meth:`from_index`), and looked up by text as
    ``(texts, tokenizer, max_length) -> vectors``."""

    def __init__(self, size: int):
        self.size = size
        self.row: dict[str, int] = {}
        self.terms, self.weights = [], []

    def _add(self, text: str, terms: torch.Tensor, weights: torch.Tensor):
        self.row[text] = len(self.terms)
        self.terms.append(terms)
        self.weights.append(weights)

    @classmethod
    def encode(cls, model, tokenizer, texts: Sequence[str], max_length: int, precision: str,
               verbose: bool = False) -> 'FrozenDocuments':
        frozen = cls(model.vocab_size)
        unique = list(dict.fromkeys(texts))
        vectors = sparse_vectors(model, tokenizer, unique, max_length, precision, frozen.size, verbose,
                                 'encoding documents')
        rows, cols = vectors.indices()
        values = vectors.values()
        starts = torch.searchsorted(rows, torch.arange(len(unique) + 1))  # coalesced: sorted by row
        for i, text in enumerate(unique):
            part = slice(starts[i].item(), starts[i + 1].item())
            frozen._add(text, cols[part].clone(), values[part].clone())
        return frozen

    @classmethod
    def from_index(cls, index, docs: dict[str, str], docnos: set[str], terms: Sequence[str]) -> 'FrozenDocuments':
        """The vectors of ``docnos`` (their texts in ``docs``) as stored by ``index`` (an
        :class:`~pyterrier_lsr.LsrIndex`, whose float vectors are the encoder's own); its terms must be among
        ``terms``, the names of the model's term ids."""
        frozen = cls(len(terms))
        vocabulary = {t: i for i, t in enumerate(terms)}
        for docno, vector in index.vectors():
            if docno in docnos:
                try:
                    ids = [vocabulary[t] for t in vector]
                except KeyError as unknown:
                    raise ValueError(f'{index}: document {docno!r} has a term outside the model\'s vocabulary '
                                     f'({unknown}): the index was built with another model') from None
                frozen._add(docs[docno], torch.tensor(ids, dtype=torch.long),
                            torch.tensor(list(vector.values()), dtype=torch.float32))
        missing = [d for d in docnos if docs[d] not in frozen.row]
        if missing:
            raise ValueError(f'{index} lacks {len(missing)} documents of the corpus (e.g. {missing[0]!r}): '
                             'it was built from another corpus')
        return frozen

    def __call__(self, texts: Sequence[str], tokenizer=None, max_length=None) -> torch.Tensor:
        out = torch.zeros(len(texts), self.size)
        for i, text in enumerate(texts):
            j = self.row[text]
            out[i, self.terms[j]] = self.weights[j]
        return out


def frozen_documents(splade, docs: dict[str, str], docnos: list[str], index, precision: str,
                     verbose: bool) -> FrozenDocuments:
    """``docnos``' vectors under ``splade``'s document model: encoded, or read from ``index`` after checking on a few
    documents that it holds what ``splade`` encodes (another model or ``max_length`` is refused)."""
    def encode(texts, verbose=False):
        return FrozenDocuments.encode(splade.model, splade.tokenizer, texts, splade.max_length, precision, verbose)
    if index is None:
        return encode([docs[d] for d in docnos], verbose)
    frozen = FrozenDocuments.from_index(index, docs, set(docnos), splade.terms)
    sample = [docs[d] for d in docnos[::max(1, len(docnos) // CHECKED_DOCUMENTS)][:CHECKED_DOCUMENTS]]
    difference = (frozen(sample) - encode(sample)(sample)).abs().max().item()
    if difference > CHECK_TOLERANCE:
        raise ValueError(f'{index} does not hold the documents as this model encodes them (weights differ by up to '
                         f'{difference:.3g}): index the corpus with this model, or leave out `documents`')
    return frozen


@contextmanager
def frozen_parameters(module: torch.nn.Module | None):
    """``module``'s trainable parameters take no gradient inside the block and train again after it; ``None``:
    nothing."""
    params = [] if module is None else [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)
