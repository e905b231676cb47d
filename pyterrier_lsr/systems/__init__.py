"""Whole systems, built in re-runnable calls (applications layer): :mod:`.builders` (BM25, sparse and Latent Terms
indexes, domain-adapted, VT-SPLADE, SAE-SPLADE and new-head models, each reused from its folder on a second call),
:mod:`.dense` (the dense base of Latent Terms, exact cosine) and :mod:`.recipes` (the fixed-budget training recipe the
method comparisons in ``examples/`` share)."""
from .builders import (
           BM25,
           DENSE_BASES,
           LATENT_TERMS,
           SAE_SPLADE,
           SAE_SPLADE_STATES,
           adapted,
           best_dense,
           bm25,
           latent_terms_index,
           new_head_splade,
           sae_splade,
           sparse_index,
           vt_splade,
)
from .dense import DenseRetriever, dense_retriever

__all__ = ['BM25', 'DENSE_BASES', 'LATENT_TERMS', 'SAE_SPLADE', 'SAE_SPLADE_STATES', 'DenseRetriever', 'adapted',
           'best_dense', 'bm25', 'dense_retriever', 'latent_terms_index', 'new_head_splade', 'sae_splade',
           'sparse_index', 'vt_splade']
