"""pyterrier-lsr: learned sparse retrieval methods as PyTerrier transformers.

The top level holds what a pipeline is made of: the model kinds (every one a :class:`SparseModel`), the index
artifacts and their indexers, and the query-side and pruning transformers.  Torch modules are in
:mod:`pyterrier_lsr.models`, training in :mod:`pyterrier_lsr.train`, the encoding engine in
:mod:`pyterrier_lsr.encoding`, whole systems in :mod:`pyterrier_lsr.systems`.
"""

__version__ = '0.3.0'

from .asymmetric import AsymmetricSplade
from .base import SparseModel, SparseScorer
from .encoders import Splade
from .index import LsrIndex, SpladeIndexer
from .inference_free import InferenceFreeSplade
from .latent_terms import LatentTerms
from .loading import load_model
from .multivector import MaxSimIndex, MultiVector
from .pruning import Prune
from .query import IDFQueryEncoder, StaticQueryEncoder
from .sae_splade import SaeSplade
from .ssr import SSR

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
]
