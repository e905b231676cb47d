"""pyterrier-lsr: learned sparse retrieval methods as PyTerrier transformers.

The top level holds what a pipeline is made of: the model kinds (every one a :class:`SparseModel`), the index
artifacts and their indexers, the query-side and pruning transformers, and :func:`load_collection` (a corpus, topics
and qrels from ``irds:<id>`` or a folder of plain files).  Torch modules are in :mod:`pyterrier_lsr.models`, training
in :mod:`pyterrier_lsr.train`, the encoding engine in :mod:`pyterrier_lsr.core.encoding`, whole systems in
:mod:`pyterrier_lsr.systems`.

Example::

    import pyterrier as pt
    from pyterrier.measures import nDCG
    from pyterrier_lsr import LsrIndex, Splade, load_collection

    vaswani = load_collection("irds:vaswani")
    index = LsrIndex("vaswani.lsr", Splade.from_pretrained("splade-tiny"))
    if not index.built():
        index.index(vaswani.corpus)
    pt.Experiment([index.retriever()], vaswani.topics, vaswani.qrels, [nDCG @ 10])
"""

from importlib.metadata import version as _version

__version__ = _version('pyterrier-lsr')  # stated once, in pyproject.toml

from .core.collection import Collection, load_collection
from .index import LsrIndex, SpladeIndexer
from .index.maxsim import MaxSimIndex
from .index.ssr import SSRIndex
from .kinds.asymmetric import AsymmetricSplade
from .kinds.base import SparseModel, SparseScorer
from .kinds.inference_free import InferenceFreeSplade
from .kinds.latent_terms import LatentTerms
from .kinds.loading import load_model
from .kinds.multivector import MultiVector
from .kinds.sae_splade import SaeSplade
from .kinds.splade import Splade
from .kinds.ssr import SSR
from .stages.pruning import Prune
from .stages.query import IDFQueryEncoder, StaticQueryEncoder

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
    'SSRIndex',
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
