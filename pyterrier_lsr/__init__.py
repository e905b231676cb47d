"""pyterrier-lsr: learned sparse retrieval methods as PyTerrier transformers (the public API)."""

__version__ = '0.2.0'

from .asymmetric import AsymmetricSplade
from .encoders import SparseScorer, SparseTextEncoder, Splade, SpladeEncoder
from .encoding import encode_texts
from .index import LsrIndex, SpladeIndexer, quantize
from .inference_free import InferenceFreeSplade
from .latent_terms import LatentTerms
from .loading import load_model
from .models import SpladeModel
from .models.sae import SAEConfig, SparseAutoencoder, train_sae
from .models.sae_splade import SaeSpladeModel
from .multivector import MaxSimIndex, MultiVector
from .models.vocab_transfer import (extend_vocabulary, sparsemax, train_byte_level_bpe, train_wordpiece,
                                    transfer_vocabulary)
from .pruning import Prune, prune
from .query import IDFQueryEncoder, StaticQueryEncoder, StaticQueryWeights, idf
from .sae_splade import SaeSplade, explain, latent_top_words
from .ssr import SSR
from .train.sae import build_latent_terms, train_token_sae

__all__ = [
    'Splade',
    'SpladeEncoder',
    'SparseScorer',
    'SparseTextEncoder',
    'SpladeModel',
    'encode_texts',
    'SpladeIndexer',
    'LsrIndex',
    'quantize',
    'IDFQueryEncoder',
    'StaticQueryEncoder',
    'StaticQueryWeights',
    'idf',
    'AsymmetricSplade',
    'InferenceFreeSplade',
    'load_model',
    'Prune',
    'prune',
    'LatentTerms',
    'build_latent_terms',
    'SAEConfig',
    'SparseAutoencoder',
    'train_sae',
    'SaeSplade',
    'SaeSpladeModel',
    'train_token_sae',
    'latent_top_words',
    'explain',
    'transfer_vocabulary',
    'train_byte_level_bpe',
    'train_wordpiece',
    'extend_vocabulary',
    'sparsemax',
    'MultiVector',
    'MaxSimIndex',
    'SSR',
]
