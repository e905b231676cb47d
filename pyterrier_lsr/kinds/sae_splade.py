"""SAE-SPLADE through the shared torch-model wrapper, and its interpretability helpers.

The model itself (backbone + SAE encoder + α) is :class:`pyterrier_lsr.models.sae_splade.SaeSpladeModel`; stage 1
(the token-state SAE) is :func:`pyterrier_lsr.train.train_token_sae`.
"""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..core.checks import checked_batch_size
from ..core.encoding import is_blank, length_sorted_batches
from ..core.folders import kind_settings, local_folder
from ..core.model_files import load_tokenizer
from ..models.features import load_dense
from ..models.sae import SAEConfig, SparseAutoencoder
from ..models.sae_splade import DEFAULT_ALPHA, KIND, SaeSpladeModel, latent_idf, structural_token_ids
from .splade import TorchSparseModel

__all__ = ['SaeSplade', 'idf_weighted_queries', 'latent_top_words', 'explain']


class SaeSplade(TorchSparseModel):
    """An :class:`SaeSpladeModel` (backbone + SAE encoder + α) and its tokenizer: SPLADE's encoders, scorer, indexer
    and training loop, with latent ids (``l<id>``) as terms, plus interpretability helpers (:meth:`explain`,
    :meth:`top_words`).

    Args:
        model: an :class:`SaeSpladeModel`; usually made by :meth:`from_backbone` (stage 2 before training) or
            ``from_pretrained`` (a saved folder).
        tokenizer, device, max_length, batch_size, precision, name: see
            :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel`.

    Raises:
        ValueError: an SAE that does not fit the backbone (another width, or BatchTopK), or from ``from_pretrained`` a
            folder that is not an SAE-SPLADE folder or whose per-latent files have the wrong shape.

    Example::

        sae, log = train_token_sae("splade-tiny", texts, {"n_latents": 16384, "k": 4})   # stage 1
        model = SaeSplade.from_backbone("splade-tiny", sae)                               # stage 2, then train()
        model.explain(texts[0])          # the text's heaviest latents and the words that fire them
    """
    kind = KIND
    display = 'SAE-SPLADE'
    terms_namespace = 'latent'

    @classmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'SaeSplade':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs``: runtime options."""
        kind_settings(folder, KIND, ('sae', 'alpha'), 'an SAE-SPLADE')
        tokenizer = load_tokenizer(folder)
        model = SaeSpladeModel.from_pretrained(folder, structural_token_ids(tokenizer))
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def example(cls) -> 'SaeSplade':
        """SPLADE-tiny's encoder and a random SAE of 64 latents (k = 4) over its token states."""
        model, tokenizer = load_dense(local_folder('splade-tiny'))
        sae = SparseAutoencoder(SAEConfig(d_in=model.config.hidden_size, n_latents=64, k=4, seed=1))
        return cls(SaeSpladeModel(model, sae, structural_token_ids(tokenizer)), tokenizer, device='cpu', batch_size=2)

    @classmethod
    def from_backbone(cls, backbone: str, sae: SparseAutoencoder, alpha: float = DEFAULT_ALPHA,
                      **kwargs) -> 'SaeSplade':
        """A stage-2 model (before fine-tuning) from a backbone name/folder (offline names resolve, e.g.
        ``'splade-tiny'``; an MLM checkpoint's head is dropped) and a stage-1 SAE trained on its token states."""
        model, tokenizer = load_dense(local_folder(backbone))
        return cls(SaeSpladeModel(model, sae, structural_token_ids(tokenizer), alpha), tokenizer, **kwargs)

    def write_folder(self, folder: Path):
        """One folder: backbone, tokenizer, SAE, settings."""
        self._check_model()
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(str(folder))

    def top_words(self, texts: Sequence, latents: Sequence[int] | None = None, n: int = 10,
                  batch_size: int | None = None) -> dict[int, list[tuple[str, float]]]:
        """See :func:`latent_top_words`."""
        return latent_top_words(self, texts, latents, n, batch_size)

    def explain(self, text: str, top: int = 10,
                words: dict[int, list[tuple[str, float]]] | None = None) -> list[dict]:
        """See :func:`explain`."""
        return explain(self, text, top, words)


def idf_weighted_queries(splade, document_frequencies, num_docs: int):
    """An :class:`~pyterrier_lsr.AsymmetricSplade` whose documents are ``splade``'s (an :class:`SaeSplade`, or an
    asymmetric SAE-SPLADE, whose query model is then the one reweighted) and whose queries weigh each latent by its
    idf (:func:`~pyterrier_lsr.models.sae_splade.latent_idf` of the frequencies of an index of ``splade``'s documents,
    e.g. ``index.document_frequencies(), index.num_docs()``), so that index serves it unchanged.  Latents in half the
    documents or more leave the queries.  ``splade`` is not modified."""
    import copy

    from .asymmetric import AsymmetricSplade
    if getattr(splade, 'sides', type(splade)) is not SaeSplade:
        raise ValueError(f'idf_weighted_queries reweighs the latents of an SAE-SPLADE model, not of a '
                         f'{type(splade).__name__}')
    queries = copy.deepcopy(getattr(splade, 'query_splade', splade).model)
    with torch.no_grad():
        queries.latent_weight.copy_(latent_idf(document_frequencies, num_docs, queries.terms))
    return AsymmetricSplade(splade.model, splade.tokenizer, queries, SaeSplade, name=splade.name, **splade.runtime())


def _word_spans(encoding, text: str, n_tokens: int) -> list[str | None]:
    """The (lowercased) word each token position belongs to, wordpieces merged (``None`` for special tokens)."""
    word_ids = encoding.word_ids[:n_tokens]
    spans: dict[int, list[int]] = {}
    for (start, end), word in zip(encoding.offsets[:n_tokens], word_ids):
        if word is not None:
            span = spans.setdefault(word, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    return [None if w is None else text[spans[w][0]:spans[w][1]].lower() for w in word_ids]


def latent_top_words(splade: SaeSplade, texts: Sequence, latents: Sequence[int] | None = None, n: int = 10,
                     batch_size: int | None = None) -> dict[int, list[tuple[str, float]]]:
    """For each latent (all, or ``latents``), the ``n`` words of ``texts`` that activate it most: ``{latent: [(word,
    activation), ...]}``, best first, a word's activation being its largest SAE activation ``z`` over its wordpieces
    and occurrences.  Words are whole words (wordpieces merged through the fast tokenizer's offsets), lowercased.
    Latents that never fire on ``texts`` are absent.
    """
    tokenizer, model = splade.tokenizer, splade.model
    if not tokenizer.is_fast:
        raise ValueError('latent_top_words needs a fast tokenizer (word offsets)')
    if n < 1:
        raise ValueError(f'n must be >= 1, got {n}')
    texts = [str(t) for t in texts if not is_blank(t)]
    wanted = None if latents is None else torch.tensor(sorted(set(latents)), dtype=torch.long)
    vocabulary: dict[str, int] = {}
    keys, values = torch.empty(0, dtype=torch.long), torch.empty(0)  # (latent, word) pairs and their best activation
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        for batch in length_sorted_batches(tokenizer, texts, checked_batch_size(batch_size, splade.batch_size),
                                           splade.max_length, splade.device):
            ids, mask = batch.input_ids, batch.attention_mask
            indices, acts, _ = model.token_latents(ids, mask)
            # The pooled positions, in the row-major order of the token latents.
            text_of, position = model.features.token_mask(ids, mask).nonzero(as_tuple=True)
            spans = [_word_spans(enc, texts[i], len(enc.ids)) for i, enc in zip(batch.positions, batch.encodings)]
            word = torch.tensor([vocabulary.setdefault(spans[t][p] or '', len(vocabulary))
                                 for t, p in zip(text_of.tolist(), position.tolist())], dtype=torch.long)
            indices, acts = indices.cpu(), acts.float().cpu()
            batch_keys = (indices * (1 << 32) + word[:, None]).flatten()
            keep = acts.flatten() > 0
            if wanted is not None:
                keep &= torch.isin(indices.flatten(), wanted)
            keys = torch.cat([keys, batch_keys[keep]])
            values = torch.cat([values, acts.flatten()[keep]])
            keys, inverse = keys.unique(return_inverse=True)
            values = torch.zeros(len(keys)).scatter_reduce(0, inverse, values, 'amax')
    if was_training:
        model.train()
    words = np.array(list(vocabulary), dtype=object)
    latent_of, word_of = (keys >> 32).numpy(), (keys & ((1 << 32) - 1)).numpy()
    order = np.lexsort((-values.numpy(), latent_of))
    out: dict[int, list[tuple[str, float]]] = {}
    for i in order:
        found = out.setdefault(int(latent_of[i]), [])
        if len(found) < n:
            found.append((str(words[word_of[i]]), float(values[i])))
    return out


def explain(splade: SaeSplade, text: str, top: int = 10,
            words: dict[int, list[tuple[str, float]]] | None = None) -> list[dict]:
    """The ``top`` latents of ``text`` by weight, each as ``{'term', 'latent', 'weight', 'in_text', 'words'}``:
    ``in_text`` = the words of this text that activate it (best first, with their activations), ``words`` = its top
    words on a corpus when ``words`` (a :func:`latent_top_words` result) is given, else ``[]``."""
    vector = splade.encode([text])[0]
    best = sorted(vector.items(), key=lambda item: -item[1])[:top]
    latents = [int(term[1:]) for term, _ in best]
    local = latent_top_words(splade, [text], latents, n=5) if latents else {}
    return [{'term': term, 'latent': latent, 'weight': weight, 'in_text': local.get(latent, []),
             'words': (words or {}).get(latent, [])} for (term, weight), latent in zip(best, latents)]


