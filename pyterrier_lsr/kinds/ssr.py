"""SSR, single-stage sparse retrieval over multi-vector token embeddings (docs/ssr.md).

A TopK sparse autoencoder maps each token embedding ``e_t`` of a :class:`~pyterrier_lsr.kinds.multivector.MultiVector`
encoder to a sparse code ``z_t`` (at most ``k`` active latents out of ``n_latents``, :meth:`SSR.token_codes`);
latents become index terms ``l<id>`` and documents are searched in one stage, with no clustering.  Two scorings:

* **token-level** (:class:`~pyterrier_lsr.index.ssr.SSRIndex`, the default): postings keep token identity and a
  query scores ``sum_i max_{t in d} <z_i, z_t>`` exactly: MaxSim with ``<e_i, e_t>`` replaced by ``<z_i, z_t>``
  (``<e_i, e_t> ~ <z_i, z_t>`` up to the decoder's cross terms, its rows being unit-norm); by default the query side
  is exact instead, ``<e_i, D_a>`` against the decoder rows on the top ``query_latents`` (:meth:`SSR.query_codes`);
* **pooled** (this module's :meth:`SSR.encode_vectors`, indexed by any engine of an :class:`~pyterrier_lsr.LsrIndex`
  or scored by ``SSRIndex``'s ``mode='pooled'``): documents ``d_j = max_t z_tj`` (``doc_pooling='max'``), queries
  ``q_j = sum_i z_ij`` (``query_pooling='sum'``, or ``'max'``), score ``<q, d> = sum_i sum_j z_ij max_t z_tj``:
  the max taken per latent instead of per token, an upper bound of the token-level score that adds up partial matches
  from different document tokens (our choice for an inverted index that only has a dot product; the abstract does
  not say).

Weights are the SAE's activations of unit-norm vectors (about 0-1), so the index's default scale 100 keeps two
digits.  A second stage (:meth:`SSR.reranked`) re-scores the top ``depth`` documents of an ``SSRIndex`` by exact
MaxSim from a :class:`~pyterrier_lsr.index.maxsim.MaxSimIndex`.

A model folder is the encoder's folder (see :class:`~pyterrier_lsr.kinds.multivector.MultiVector`) + ``sae/`` (a
:class:`~pyterrier_lsr.models.sae.SparseAutoencoder` folder), with ``kind: ssr`` and the poolings in ``config.json``
under ``lsr``, so :func:`~pyterrier_lsr.load_model` (and an index's stored copy) reloads it.
"""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch

from ..core.checks import check_choice, check_int, check_matrix, check_settings
from ..core.encoding import to_dicts
from ..core.folders import CONFIG_FILE, CONFIG_KEY, model_settings
from ..core.selection import top_k_positive
from ..models.sae import ENCODE_ROWS, SAEConfig, SparseAutoencoder, latent_term_names, train_sae
from .base import SparseModel
from .multivector import MultiVector

SAE_FOLDER = 'sae'
POOLINGS = ('max', 'sum')
QUERY_SIDES = ('codes', 'decoder')


def pool_codes(indices: torch.Tensor, values: torch.Tensor, owner: torch.Tensor, n_texts: int, n_latents: int,
               pooling: str) -> torch.Tensor:
    """Per-token sparse codes (``indices``/``values``: tokens x k, as :meth:`SparseAutoencoder.encode_topk` returns)
    pooled per text (``owner``: each token's text) into ``n_texts x n_latents`` by ``max`` or ``sum``."""
    if pooling not in POOLINGS:
        raise ValueError(f'pooling must be one of {POOLINGS}, got {pooling!r}')
    flat = (owner[:, None] * n_latents + indices).flatten()
    out = values.new_zeros(n_texts * n_latents)
    if pooling == 'max':  # activations are >= 0, so the zero start never wins over an active latent
        out.scatter_reduce_(0, flat, values.flatten(), 'amax')
    else:
        out.index_add_(0, flat, values.flatten())
    return out.view(n_texts, n_latents)


@torch.inference_mode()
def token_codes(sae: SparseAutoencoder, vectors: np.ndarray, k: int | None = None, batch_size: int = 65536
                ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's sparse code: ``(indices, values)``, ``rows x k`` int64 latent ids and float32 activations (relu'd,
    so some may be 0), as :meth:`SparseAutoencoder.encode_topk` gives them (``k``: default the SAE's), computed on the
    SAE's device (``batch_size`` rows moved there at a time).  On a CPU the selection is
    :func:`~pyterrier_lsr.core.selection.top_k_positive` (the codes 1.8-2.4x faster at k = 96, level at 16): the same
    positive latents, in no particular order, exact ties kept at lower latent ids, zeros at latent 0."""
    k = sae.config.k if k is None else check_int('k', k, 1, sae.n_latents)
    indices, values = np.zeros((len(vectors), k), np.int64), np.zeros((len(vectors), k), np.float32)
    on_cpu = sae.W_enc.device.type == 'cpu'
    step = ENCODE_ROWS if on_cpu else batch_size  # on a CPU, a product's output stays in cache for the selection
    for start in range(0, len(vectors), step):
        rows = torch.as_tensor(np.asarray(vectors[start:start + step]), dtype=torch.float32, device=sae.W_enc.device)
        if on_cpu:
            idx, val = top_k_positive(sae.pre_activations(rows).numpy(), k)
        else:
            idx, val = (t.cpu().numpy() for t in sae.encode_topk(rows, k))
        indices[start:start + len(rows)], values[start:start + len(rows)] = idx, val
    return indices, values


@torch.inference_mode()
def decoder_codes(sae: SparseAutoencoder, vectors: np.ndarray, m: int, batch_size: int = ENCODE_ROWS
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``m`` largest weights ``<e, D_a>`` (the embedding itself against the decoder's unit rows ``D_a``)
    as ``(indices, values)`` like :func:`token_codes`; non-positive weights are set to 0 (not scored).  Against a
    document token's code, ``sum_a <e, D_a> z_ta = <e, x̂_t - b_dec>``: the exact query token against the token's
    reconstruction (``b_dec`` adds the same ``<e, b_dec>`` to every token, so no max changes), over the query token's
    top ``m`` latents."""
    device = sae.W_dec.device
    indices, values = np.zeros((len(vectors), m), np.int64), np.zeros((len(vectors), m), np.float32)
    for start in range(0, len(vectors), batch_size):
        rows = torch.as_tensor(np.asarray(vectors[start:start + batch_size]), dtype=torch.float32, device=device)
        val, idx = (rows @ sae.W_dec.T).topk(m, dim=-1)
        indices[start:start + len(rows)], values[start:start + len(rows)] = idx.cpu().numpy(), val.relu().cpu().numpy()
    return indices, values


class SSR(SparseModel):
    """A multi-vector encoder + a TopK SAE over its token embeddings (see the module docs for the scorings).  Index
    token-level with :class:`~pyterrier_lsr.index.ssr.SSRIndex` (``SSRIndex(path, ssr).index(docs)``, or
    ``SSRIndex.write`` from embeddings at hand), pooled with ``SpladeIndexer(path, ssr)``; :meth:`reranked` adds exact
    MaxSim to an ``SSRIndex``.

    Args:
        encoder: the :class:`~pyterrier_lsr.kinds.multivector.MultiVector` whose token embeddings the SAE reads.
        sae: a per-token TopK :class:`~pyterrier_lsr.models.sae.SparseAutoencoder` with ``d_in`` = the encoder's dim.
        doc_pooling, query_pooling: ``'max'`` or ``'sum'`` of token codes per latent (defaults: max for documents,
            sum for queries).
        doc_k: latents kept per document token in the token-level index (:meth:`doc_codes`; default: the SAE's
            ``k``; ``SSRIndex``'s ``mode='pooled'`` pools these codes).  More than the trained ``k`` lets a document
            token share more latents with a query token's top ones, at more postings per query (measured in
            docs/results.md, SSR); queries and :meth:`encode_vectors` (pooled PISA codes) keep the SAE's ``k``.

    Example::

        ssr = SSR.from_pretrained("path/to/ssr")                       # or load_model(folder)
        index = SSRIndex("vaswani.ssr", ssr).index(corpus)
        index.retriever(mode="tokens").search("radio waves")
    """

    kind = 'ssr'
    display = 'SSR'
    terms_namespace = 'latent'

    def __init__(self, encoder: MultiVector, sae: SparseAutoencoder, doc_pooling: str = 'max',
                 query_pooling: str = 'sum', name: str | None = None, doc_k: int | None = None):
        if sae.config.d_in != encoder.dim:
            raise ValueError(f'the SAE reads {sae.config.d_in}-d vectors, the encoder gives {encoder.dim}-d')
        if sae.config.batch_topk:
            raise ValueError('SSR needs a per-token TopK SAE (batch_topk=False)')
        check_choice('doc_pooling', doc_pooling, POOLINGS)
        check_choice('query_pooling', query_pooling, POOLINGS)
        if doc_k is not None:
            check_int('doc_k', doc_k, 1, sae.n_latents)
        self.encoder = encoder
        self.sae = sae.to(encoder.device).eval()
        self.doc_pooling = doc_pooling
        self.query_pooling = query_pooling
        self.doc_k = doc_k
        self.terms = latent_term_names(sae.n_latents)
        self.name = name

    def token_codes(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each token embedding's sparse code (see :func:`token_codes`)."""
        return token_codes(self.sae, vectors)

    def doc_codes(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each document token embedding's sparse code for the token-level index: :func:`token_codes` with
        ``doc_k`` latents (default: the SAE's ``k``)."""
        return token_codes(self.sae, vectors, self.doc_k)

    def query_codes(self, vectors: np.ndarray, query: str = 'decoder', query_latents: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """The query tokens' weights per latent for token-level scoring: ``query='decoder'``, their embeddings against
        the decoder rows, the top ``query_latents`` (default: ``2 k``, chosen on pseudo-queries) per token
        (:func:`decoder_codes`; only the documents are then approximated); ``'codes'``, their SAE codes (as
        documents get theirs)."""
        m = self.query_width(query, query_latents)
        return self.token_codes(vectors) if m is None else decoder_codes(self.sae, vectors, m)

    def query_width(self, query: str, query_latents: int | None) -> int | None:
        """The checked ``query`` side and its ``query_latents`` (see :meth:`query_codes`): ``m`` for ``'decoder'``,
        None for ``'codes'``."""
        check_choice('query', query, QUERY_SIDES)
        if query == 'codes':
            if query_latents is not None:
                raise ValueError("query_latents applies to query='decoder' only; query='codes' uses the SAE's k")
            return None
        m = min(2 * self.sae.config.k, self.sae.n_latents) if query_latents is None else query_latents
        return check_int('query_latents', m, 1, self.sae.n_latents)

    @torch.inference_mode()
    def encode_vectors(self, vectors: np.ndarray, offsets: np.ndarray, query: bool = False,
                       batch_size: int = 256) -> list[dict[str, float]]:
        """``{'l<id>': weight}`` per text from token embeddings grouped by text (as :meth:`MultiVector.embed` returns),
        without a transformer pass."""
        pooling = self.query_pooling if query else self.doc_pooling
        out = []
        for start in range(0, len(offsets) - 1, batch_size):
            stop = min(start + batch_size, len(offsets) - 1)
            indices, values = self.token_codes(vectors[offsets[start]:offsets[stop]])
            owner = torch.repeat_interleave(torch.arange(stop - start),
                                            torch.as_tensor(np.diff(offsets[start:stop + 1])))
            out.extend(to_dicts(pool_codes(torch.from_numpy(indices), torch.from_numpy(values), owner, stop - start,
                                           self.sae.n_latents, pooling), self.terms))
        return out

    def _encode(self, texts: Sequence, query: bool, batch_size: int | None, verbose: bool) -> list[dict[str, float]]:
        vectors, offsets = self.encoder.embed(texts, query=query, verbose=verbose, batch_size=batch_size)
        return self.encode_vectors(vectors, offsets, query=query)

    def encode_docs(self, texts: Sequence, batch_size: int | None = None,
                    verbose: bool = False) -> list[dict[str, float]]:
        return self._encode(texts, False, batch_size, verbose)

    def encode_queries(self, texts: Sequence, batch_size: int | None = None,
                       verbose: bool = False) -> list[dict[str, float]]:
        return self._encode(texts, True, batch_size, verbose)

    def reranked(self, index, store, depth: int = 100, mode: str = 'tokens',
                 query: str | None = None, query_latents: int | None = None) -> pt.Transformer:
        """Two stages: the top ``depth`` of ``index`` (an :class:`~pyterrier_lsr.index.ssr.SSRIndex` of this model,
        scored as its ``retriever(mode=, query=, query_latents=)`` scores), re-scored by exact MaxSim from
        ``store``'s vectors.  Each query goes through the transformer once; its token embeddings serve both
        stages."""
        first = index.retriever(check_int('depth', depth, 1), mode, query, query_latents)  # checks the rest
        return _TwoStage(index, store, first)

    def settings(self) -> dict:
        return dict(super().settings(), doc_pooling=self.doc_pooling, query_pooling=self.query_pooling,
                    doc_k=self.doc_k)

    def write_folder(self, folder: Path):
        """The encoder's folder + ``sae/``; the settings (kind, poolings, doc_k) go into its ``config.json`` under
        ``lsr``."""
        self.encoder.write_folder(folder)
        self.sae.save_pretrained(folder / SAE_FOLDER)

    @classmethod
    def example(cls) -> 'SSR':
        """all-MiniLM-L6-v2 projected to 16 dimensions and a random SAE of 32 latents (k = 4) over them."""
        encoder = MultiVector.from_backbone('all-MiniLM-L6-v2', dim=16, device='cpu', batch_size=2)
        return cls(encoder, SparseAutoencoder(SAEConfig(d_in=16, n_latents=32, k=4, seed=1)))

    @classmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'SSR':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` go to :meth:`MultiVector.from_pretrained`."""
        settings = model_settings(folder)
        if settings.get('kind') != 'ssr':
            raise ValueError(f'{folder} is not an SSR folder ({CONFIG_FILE} has no {CONFIG_KEY}.kind = "ssr")')
        encoder = MultiVector.from_pretrained(folder, **kwargs)
        sae = SparseAutoencoder.from_pretrained(folder / SAE_FOLDER, device=encoder.device)
        return cls(encoder, sae, settings.get('doc_pooling', 'max'), settings.get('query_pooling', 'sum'),
                   doc_k=settings.get('doc_k'))

    def __repr__(self):
        return (f'SSR({self.name or "<model>"!r}, latents={self.sae.n_latents}, k={self.sae.config.k}, '
                f'doc={self.doc_pooling}, query={self.query_pooling}'
                + ('' if self.doc_k is None else f', doc_k={self.doc_k}') + ')')


class _TwoStage(pt.Transformer):
    def __init__(self, index, store, first):
        self.index = index
        self.store = store
        self.first = first

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        candidates, positions, (vectors, offsets) = self.first.ranked(inp)
        if not len(candidates):
            return candidates
        vectors = torch.from_numpy(vectors)
        queries = [vectors[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        # input positions key the query embeddings: they index the embeddings directly
        return self.store.rescore(candidates, positions, queries, groups=positions)

    def __repr__(self):
        return f'{self.first!r} >> MaxSim top-{self.first.num_results}'


def train_ssr_sae(vectors: np.ndarray, sae: dict | None = None, max_train_vectors: int | None = 200_000,
                  device=None, verbose: bool = True):
    """A TopK SAE over token embeddings (``vectors``: tokens x dim, e.g. a corpus's :meth:`MultiVector.embed`),
    trained on a seeded sample of at most ``max_train_vectors`` rows; ``sae``: :class:`SAEConfig` settings
    (``d_in`` comes from ``vectors``); ``device``: where it trains (default: CUDA when present).  Returns
    ``(sae, log)`` as :func:`train_sae` does."""
    vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise ValueError(f'vectors must be a 2-d float array (tokens x dim), got shape {vectors.shape}')
    config = SAEConfig(d_in=vectors.shape[1], **check_settings('sae', sae, 'SAEConfig'))
    if max_train_vectors is not None and len(vectors) > check_int('max_train_vectors', max_train_vectors, 1):
        rows = np.random.default_rng(config.seed).choice(len(vectors), max_train_vectors, replace=False)
        vectors = vectors[np.sort(rows)]
    if not len(vectors):
        raise ValueError('vectors has no rows to train on')
    return train_sae(check_matrix('vectors', vectors), config, device=device, verbose=verbose)
