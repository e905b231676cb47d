"""pyterrier-lsr: learned sparse retrieval methods as PyTerrier transformers.

The top level holds what a pipeline is made of: the model kinds (every one a :class:`SparseModel`), the index
artifacts and their indexers, and the query-side and pruning transformers.  Torch modules are in
:mod:`pyterrier_lsr.models`, training in :mod:`pyterrier_lsr.train`, the encoding engine in
:mod:`pyterrier_lsr.core.encoding`, whole systems in :mod:`pyterrier_lsr.systems`.
"""

from importlib.metadata import version as _version

__version__ = _version('pyterrier-lsr')  # stated once, in pyproject.toml

from .core.collection import Collection, load_collection
from .index import LsrIndex, SpladeIndexer
from .index.maxsim import MaxSimIndex
from .kinds.asymmetric import AsymmetricSplade
from .kinds.base import SparseModel, SparseScorer
from .kinds.inference_free import InferenceFreeSplade
from .kinds.latent_terms import LatentTerms
from .kinds.loading import load_model
from .kinds.multivector import MultiVector
from .kinds.pruning import Prune
from .kinds.query import IDFQueryEncoder, StaticQueryEncoder
from .kinds.sae_splade import SaeSplade
from .kinds.splade import Splade
from .kinds.ssr import SSR

__all__ = [
    'SparseModel',
    'Splade',
    'AsymmetricSplade',
    'InferenceFreeSplade',
    'SaeSplade',
    'LatentTerms',
    'SSR',
    'MultiVector',
    'MaxSimIndex',
    'LsrIndex',
    'SpladeIndexer',
    'IDFQueryEncoder',
    'StaticQueryEncoder',
    'SparseScorer',
    'Prune',
    'load_model',
    'Collection',
    'load_collection',
]
