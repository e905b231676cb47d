"""Domain adaptation from a corpus alone: ``domain_adapt(splade, corpus, output_dir, DomainConfig(...))``.

One module per concept: :mod:`.config` (the settings), :mod:`.queries` (pseudo-queries), :mod:`.teacher` (BM25 +
dense teacher, cached), :mod:`.cache` (the cached examples and held-out queries), :mod:`.vectors` (sparse vectors
through the package's batching engine), :mod:`.frozen` (the frozen documents of query-side adaptation),
:mod:`.heldout` (held-out evaluation with ``ir_measures``) and :mod:`.driver` (:class:`DomainAdaptation`, the run).
Everything that costs time is cached under ``cache_dir`` as JSON / npz (never pickle).
"""
from .cache import build_data
from .config import SELECT_ON, DomainConfig, config_from_overrides, logged_config
from .driver import DONE_FILE, DomainAdaptation, claim_cache, claim_output, domain_adapt
from .frozen import FrozenDocuments, frozen_parameters
from .heldout import heldout_scores, rank_measures
from .queries import document_frequencies, keyword_query, make_queries

__all__ = ['build_data', 'SELECT_ON', 'DomainConfig', 'config_from_overrides', 'logged_config', 'DONE_FILE',
           'claim_cache', 'claim_output', 'DomainAdaptation', 'domain_adapt', 'FrozenDocuments', 'frozen_parameters',
           'heldout_scores', 'rank_measures', 'document_frequencies', 'keyword_query', 'make_queries']
