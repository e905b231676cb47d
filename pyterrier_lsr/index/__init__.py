"""Indexes: the engine-neutral vectors, the engines built from them, and the :class:`LsrIndex` artifact."""
from .artifact import LsrIndex
from .engines import ENGINES, get_engine
from .indexer import SpladeIndexer
from .quantization import MAX_WEIGHT, pisa_term, quantize
from .vectors import VectorStore, VectorWriter, write_manifest, write_shard

__all__ = ['LsrIndex', 'SpladeIndexer', 'ENGINES', 'get_engine', 'MAX_WEIGHT', 'pisa_term', 'quantize', 'VectorStore',
           'VectorWriter', 'write_manifest', 'write_shard']
