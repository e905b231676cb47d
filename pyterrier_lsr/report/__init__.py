"""Effectiveness-cost reports: ``pt.Experiment`` plus retrieval-cost columns, a table and a plot.

:mod:`.costs` measures (latency, sizes, postings per query, engine footprint), :mod:`.table` writes the report,
:mod:`.plot` draws it, :mod:`.config` is the YAML schema of ``pyterrier-lsr report config.yaml`` and :mod:`.builder`
builds a config's systems (:func:`run_config`).
"""
from .builder import run_config
from .config import (
           DEFAULT_MEASURES,
           DEFAULT_PASSES,
           LEVEL_KEYS,
           PRUNING_KEYS,
           SYSTEM_KEYS,
           TOP_KEYS,
           TYPES,
           ConfigError,
           check_config,
           config_help,
           confined_path,
           engine_parameters,
           load_config,
           select_topics,
)
from .costs import (
           COST_COLUMNS,
           System,
           costs,
           engine_costs,
           engine_footprint,
           index_size_bytes,
           posting_lengths,
           query_times,
)
from .plot import figure, place_labels
from .table import report

__all__ = ['run_config', 'DEFAULT_MEASURES', 'DEFAULT_PASSES', 'LEVEL_KEYS', 'PRUNING_KEYS',
           'SYSTEM_KEYS', 'TOP_KEYS', 'TYPES', 'ConfigError', 'check_config', 'config_help', 'confined_path',
           'engine_parameters', 'load_config', 'select_topics', 'COST_COLUMNS', 'System', 'costs', 'engine_costs',
           'engine_footprint', 'index_size_bytes', 'posting_lengths', 'query_times', 'figure', 'place_labels',
           'report']
