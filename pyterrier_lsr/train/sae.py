"""Stage-1 recipes shared by Latent Terms and SAE-SPLADE: a frozen model's vectors of a corpus (cached), a TopK SAE
trained on them, and for Latent Terms the whole corpus-to-index build in one call."""
from collections.abc import Iterable, Sequence

import numpy as np
from tqdm.auto import tqdm

from ..core.checks import check_documents
from ..index import SpladeIndexer
from ..kinds.latent_terms import LatentTerms, cached_embeddings
from ..models.sae import SAEConfig, train_sae

__all__ = ['LATENT_TERMS', 'build_latent_terms', 'train_latent_sae', 'train_token_sae']

# Latent Terms as the README builds it (multi-vector, BM25 over square-rooted latent frequencies): the settings of
# systems.latent_terms_index and of the Latent Terms teacher of domain adaptation.  The SAE sees every token vector of
# the corpus three times: held-out pseudo-queries prefer that to one epoch over a 200,000 sample on Vaswani (571,000
# vectors) and CISI (219,000) alike; the cap bounds its time and memory on large corpora, above it a seeded sample
# (docs/results.md).  Its budget in updates: three epochs and at least
# min_updates, at most 3 x 782 = 2,346 (800,000 vectors in batches of 1,024).  Three epochs of a 50-document corpus are
# 9-24 updates; held-out pseudo-queries of 50-, 500- and 5,000-document subsamples of Vaswani and CISI rise with a
# floor of 100 and more with 300, the largest tried (mean RR@10 0.706, 0.771, 0.800; at 5,000 documents three epochs
# exceed every floor), and prefer 16,384 latents to at most one latent per token vector or per eight
# (benchmarks/latent_budget.py).  Vaswani (1,674 updates) and CISI (642) train as before.
LATENT_TERMS = dict(mode='multi', sae={'n_latents': 16384, 'k': 16, 'epochs': 3, 'min_updates': 300}, sqrt_tf=True,
                    k1=0.9, b=0.4, max_train_vectors=800_000)


def build_latent_terms(docs: Iterable[dict], index_path, dense: str = 'all-MiniLM-L6-v2', mode: str = 'single',
                       sae: dict | None = None, sqrt_tf: bool = False, cache_dir='latent_cache',
                       max_train_vectors: int | None = 200_000, scale: float = 100., overwrite: bool = False,
                       text_field: str = 'text', verbose: bool = True, **latent_terms_kwargs):
    """Corpus -> frozen-model embeddings (cached) -> SAE training -> PISA index, in one call.

    Args:
        docs: dicts with ``docno`` and ``text_field`` (read once, kept in memory).
        sae: :class:`~pyterrier_lsr.models.sae.SAEConfig` settings (``d_in`` comes from the dense model).
        max_train_vectors: the SAE trains on a seeded random sample of at most this many vectors.
        cache_dir: embeddings are cached here per (model, mode, max_length, corpus); another SAE setting reuses them.
        latent_terms_kwargs: device, batch_size, max_length, precision for :class:`LatentTerms`.

    Documents are indexed from the cached vectors, without a second transformer pass.
    Returns ``(latent_terms, index, log)``, ``log`` being the SAE training log (its last entry's ``step``: the updates
    it ran; ``verbose`` prints them too).
    """
    docs = check_documents(docs, text_field)  # docnos checked, never str()-ed, before the hours of stage 1
    latent_terms = LatentTerms(dense, mode=mode, sqrt_tf=sqrt_tf, **latent_terms_kwargs)
    model, log, vectors, offsets = train_latent_sae(latent_terms, [text for _, text in docs], sae, cache_dir,
                                                    max_train_vectors, verbose)
    latent_terms.set_sae(model)
    toks = latent_terms.encode_vectors(vectors, offsets)
    index = SpladeIndexer(index_path, latent_terms, scale=scale, overwrite=overwrite, verbose=verbose).index(
        _Sized(({'docno': docno, 'toks': vec} for (docno, _), vec in zip(docs, toks)), len(docs)))
    return latent_terms, index, log


class _Sized:
    """A generator with its known length: the indexer's progress bar then has a total and an ETA (encoding a large
    corpus's token vectors through a 16k-latent SAE takes minutes on a CPU)."""

    def __init__(self, items: Iterable, length: int):
        self.items, self.length = items, length

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return self.length


def train_latent_sae(latent_terms: LatentTerms, texts: Sequence, sae: dict | None = None, cache_dir='latent_cache',
                     max_train_vectors: int | None = 200_000, verbose: bool = True):
    """Stage 1 shared by Latent Terms and SAE-SPLADE: ``latent_terms``'s (frozen) vectors of ``texts`` (cached in
    ``cache_dir``), then a TopK SAE (``sae``: :class:`~pyterrier_lsr.models.sae.SAEConfig` settings, ``d_in`` from the
    model) trained on a seeded random sample of at most ``max_train_vectors`` of them.

    Returns ``(sae, log, vectors, offsets)``: the trained SAE, its training log and the cached vectors (see
    :meth:`LatentTerms.embed`).
    """
    vectors, offsets = cached_embeddings(latent_terms, texts, cache_dir, verbose)
    config = SAEConfig(d_in=latent_terms.features.dim, **(sae or {}))
    train = vectors
    if max_train_vectors is not None and len(vectors) > max_train_vectors:
        rows = np.random.default_rng(config.seed).choice(len(vectors), max_train_vectors, replace=False)
        train = vectors[np.sort(rows)]
    model, log = train_sae(train, config, device=latent_terms.device, verbose=verbose)
    if verbose:
        tqdm.write(f'SAE: {log[-1]["step"]} updates over {len(train):,} vectors ({config.epochs} epochs, at least '
                   f'{config.min_updates}), {config.n_latents:,} latents, {log[-1]["dead"]:.1%} dead, FVE '
                   f'{log[-1]["fve"]:.3f}')
    return model, log, vectors, offsets


def train_token_sae(backbone: str, texts: Sequence, sae: dict | None = None, cache_dir='sae_splade_cache',
                    max_train_vectors: int | None = 200_000, verbose: bool = True, **latent_terms_kwargs):
    """Stage 1: a TopK SAE on ``backbone``'s frozen, L2-normalised token states of ``texts`` (cached in
    ``cache_dir``; a seeded sample of at most ``max_train_vectors`` trains it).  ``sae``: :class:`SAEConfig` settings
    (``n_latents``, ``k``, ``k_aux``, ``aux_coef``, ``epochs``...; ``d_in`` comes from the backbone);
    ``latent_terms_kwargs``: device, batch_size, max_length, precision of the extraction.  Returns ``(sae, log)``."""
    features = LatentTerms(backbone, mode='multi', **latent_terms_kwargs)
    model, log, _, _ = train_latent_sae(features, texts, sae, cache_dir, max_train_vectors, verbose)
    return model, log
