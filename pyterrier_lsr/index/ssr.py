"""Token-level SSR: an inverted index whose postings keep token identity, scored by exact MaxSim over the codes.

Each document token ``t``'s sparse code ``z_t`` (:meth:`SSR.doc_codes`: ``doc_k`` latents, default the SAE's k) is
indexed as postings ``latent -> (document token, value)``; a query scores a document by

    ``sum_i max_{t in d} <z_i, z_t>``

over its tokens' codes ``z_i``, exactly: per query token, its latents' posting lists are accumulated per document token
(one dense float32 accumulator over the corpus's tokens), the maximum is taken per document (over its token offsets)
and summed over query tokens, in one compiled loop (:func:`maxsim_over_codes`, numba).  This is MaxSim with
``<e_i, e_t>`` replaced by ``<z_i, z_t>``, which PISA's dot product over pooled vectors cannot express (pooling takes
the max per latent, from different tokens).  By default (``query='decoder'``) a query token's weights are not its
code but its exact embedding against the SAE's decoder rows, ``w_ia = <e_i, D_a>`` on its top ``query_latents``
latents (:meth:`SSR.query_codes`), so ``sum_i max_t <w_i, z_t>`` approximates only the documents; the same postings
and kernel serve both.  The cheaper ``mode='pooled'`` scores the same index as
:class:`~pyterrier_lsr.kinds.ssr.SSR`'s pooled vectors do (documents max-pooled per latent, queries pooled by the
model's ``query_pooling``), in floats, without PISA's quantization.

An index is a token store folder (see :mod:`.tokens`: marked ``ssr_index``, ``pt_meta.json``, ``docnos.json``,
``offsets.npy``, document ``i`` owning tokens ``offsets[i]:offsets[i + 1]``; built by streaming documents, beside its
final name, and swapped in) with ``ssr_index.json`` (counts and the model's name), ``postings-indptr.npy`` /
``postings-tokens.npy`` / ``postings-values.npy`` (latent ``j``'s postings are ``indptr[j]:indptr[j + 1]``, tokens
ascending) and ``model/``, a copy of the SSR model, so the index reopens alone.  Only documents with a positive score
are returned (as an inverted index does): a document sharing no latent with the query is not a result.
"""
from collections.abc import Sequence
from pathlib import Path

import numba
import numpy as np
import pandas as pd
import pyterrier as pt
import torch

from ..core import arrays, storage
from ..core.checks import check_bool, check_choice, check_int, check_query_frame
from ..core.encoding import as_texts
from ..kinds.ssr import QUERY_SIDES, SSR, pool_codes
from .ranking import top_rows
from .tokens import TokenStore, TopK, load_npy, result_frame

INDEX_KIND = 'ssr_index'
META_FILE = 'ssr_index.json'
POSTINGS_FILES = ('postings-indptr.npy', 'postings-tokens.npy', 'postings-values.npy')
MODEL_FOLDER = 'model'
MODES = ('tokens', 'pooled')

__all__ = ['SSRIndex', 'SSRRetriever', 'token_postings', 'maxsim_over_codes', 'MODES']


def token_postings(indices: np.ndarray, values: np.ndarray, n_latents: int):
    """Per-token codes (``tokens x k`` latent ids and values) as postings ``(indptr, tokens, values)``: latent ``j``'s
    tokens, ascending, are ``tokens[indptr[j]:indptr[j + 1]]``; non-positive values are dropped."""
    return _postings_by_latent(*_checked_codes(indices, values, n_latents), n_latents)


def _checked_codes(indices, values, n_latents: int) -> tuple[np.ndarray, np.ndarray]:
    """``(indices, values)`` as the compiled loops read them (contiguous int64 / float32), once checked: the loops
    index memory by these latent ids without bounds checks."""
    indices, values = np.asarray(indices), np.asarray(values)
    if indices.ndim != 2 or indices.shape != values.shape or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(f'indices and values must be two integer / float arrays of one shape (rows x latents), got '
                         f'{indices.dtype} {indices.shape} and {values.dtype} {values.shape}')
    if indices.size and (indices.min() < 0 or indices.max() >= n_latents):
        raise ValueError(f'indices must be latent ids in [0, {n_latents}), got {indices.min()}..{indices.max()}')
    return np.ascontiguousarray(indices, np.int64), np.ascontiguousarray(values, np.float32)


@numba.njit(nogil=True)
def _postings_by_latent(indices, values, n_latents):
    # A counting sort: one pass counts each latent's postings, a second places them, tokens ascending within a latent.
    # (np.argsort of the flattened codes needed 5x their size in temporaries: 23 GB at 5M tokens x 96 latents.)
    indptr = np.zeros(n_latents + 1, np.int64)
    for t in range(indices.shape[0]):
        for j in range(indices.shape[1]):
            if values[t, j] > 0:
                indptr[indices[t, j] + 1] += 1
    indptr = np.cumsum(indptr)
    fill = indptr[:-1].copy()
    tokens, out = np.empty(indptr[-1], np.int32), np.empty(indptr[-1], np.float32)
    for t in range(indices.shape[0]):
        for j in range(indices.shape[1]):
            if values[t, j] > 0:
                p = fill[indices[t, j]]
                tokens[p], out[p] = t, values[t, j]
                fill[indices[t, j]] = p + 1
    return indptr, tokens, out


@numba.njit(nogil=True)
def maxsim_over_codes(indptr, tokens, values, offsets, q_indices, q_values):
    """``sum_i max_{t in d} <w_i, z_t>`` for every document ``d`` (``offsets``: document ``d`` owns tokens
    ``offsets[d]:offsets[d + 1]``) of one query's token weights (``q_indices``/``q_values``: query tokens x m, float32;
    non-positive weights skipped) over postings ``(indptr, tokens, values)`` as :func:`token_postings` gives them.

    Products and per-token sums are float32 (in the query's latent order), the per-document sums float64.  Indices
    are not bounds-checked here: the caller validates them.  A compiled loop because numpy's best (``np.add.at`` per
    posting list, then ``np.maximum.reduceat``) is 1.4-1.8x slower at 96 latents per document token.  Compiled on the
    first call of each process (about a second), not cached on disk: nothing is written beside the installed package."""
    acc = np.zeros(offsets[-1], np.float32)
    out = np.zeros(len(offsets) - 1)
    for i in range(q_indices.shape[0]):
        touched = False
        for j in range(q_indices.shape[1]):
            weight = q_values[i, j]
            if weight > 0:
                start, stop = indptr[q_indices[i, j]], indptr[q_indices[i, j] + 1]
                for p in range(start, stop):
                    acc[tokens[p]] += weight * values[p]
                touched |= stop > start
        if touched:
            for d in range(len(offsets) - 1):
                best = np.float32(0)  # scores are >= 0, so an empty document scores 0
                for t in range(offsets[d], offsets[d + 1]):
                    best = max(best, acc[t])
                out[d] += best
            acc[:] = 0
    return out


class SSRIndex(TokenStore):
    """A token-level SSR index (see the module docs; artifact type ``sparse_index``, format ``ssr``):
    ``retriever(mode='tokens')`` is exact MaxSim over the codes, ``mode='pooled'`` the pooled dot product; the index
    is its own default retriever (``SSRIndex(path)(topics)``); :meth:`SSR.reranked` re-scores its top documents by
    exact MaxSim.

    Args:
        path: the folder; a missing or empty one is an index to build (:meth:`built` is False).
        model: the :class:`~pyterrier_lsr.kinds.ssr.SSR` model that encodes documents (when indexing) and queries;
            default: the copy stored in the index.
        save_model: store a copy of the model in the index when indexing (without it, pass ``model=`` when
            reopening).
        overwrite, text_field, shard_size, verbose: for :meth:`index` (see :class:`~.tokens.TokenStore`).

    Example::

        index = SSRIndex("vaswani.ssr", model)
        if not index.built():
            index.indexer().index(corpus)
        pt.Artifact.load("vaswani.ssr").search("radio waves")   # reopens with its recorded model
    """

    kind, meta_file, label = INDEX_KIND, META_FILE, 'SSR index'
    ARTIFACT_TYPE = 'sparse_index'
    ARTIFACT_FORMAT = 'ssr'

    def __init__(self, path, model: SSR | None = None, *, save_model: bool = True, overwrite: bool = False,
                 text_field: str = 'text', shard_size: int = 1024, verbose: bool = True):
        super().__init__(path, model, overwrite=overwrite, text_field=text_field, shard_size=shard_size,
                         verbose=verbose)
        self._settings['save_model'] = check_bool('save_model', save_model)

    def _open(self, marker: dict) -> dict:
        state = super()._open(marker)
        meta = state['meta']
        try:
            check_int('n_latents', meta.get('n_latents'), 0)
        except (TypeError, ValueError) as ex:
            raise ValueError(f'{self.path / META_FILE}: {ex}') from None
        indptr, tokens, values = (load_npy(self.path / name) for name in POSTINGS_FILES)
        problem = None
        if not (np.issubdtype(indptr.dtype, np.integer) and np.issubdtype(tokens.dtype, np.integer)
                and np.issubdtype(values.dtype, np.floating)):
            problem = f'the postings arrays have types {indptr.dtype} / {tokens.dtype} / {values.dtype}'
        elif indptr.shape != (meta['n_latents'] + 1,) or indptr[0] != 0 or (np.diff(indptr) < 0).any() or \
                indptr[-1] != len(tokens) or tokens.shape != values.shape:
            problem = 'the postings arrays do not describe the same postings'
        elif len(tokens) and (tokens.min() < 0 or tokens.max() >= meta['num_tokens']):
            problem = 'a posting names a token outside the corpus'
        if problem:
            raise ValueError(f'SSR index {self.path}: {problem}; rebuild it')
        # the types token_postings writes, so the compiled kernel has one specialization
        state.update(indptr=indptr.astype(np.int64, copy=False), tokens=tokens.astype(np.int32, copy=False),
                     values=values.astype(np.float32, copy=False),
                     owner=np.repeat(np.arange(meta['num_docs'], dtype=np.int64), np.diff(state['offsets'])))
        return state

    @property
    def indptr(self) -> np.ndarray:
        return self._state()['indptr']

    @property
    def tokens(self) -> np.ndarray:
        return self._state()['tokens']

    @property
    def values(self) -> np.ndarray:
        return self._state()['values']

    @classmethod
    def write(cls, path, docnos: Sequence[str], vectors: np.ndarray, offsets: np.ndarray, model: SSR,
              overwrite: bool = False, save_model: bool = True) -> 'SSRIndex':
        """An index from token embeddings already computed (e.g. :meth:`MultiVector.embed` of a corpus, as a
        :class:`~pyterrier_lsr.index.maxsim.MaxSimIndex` store holds them); ``overwrite`` replaces only another SSR
        index; ``save_model`` stores a copy of ``model`` (without it, pass ``model=`` when reopening)."""
        return cls._from_arrays(path, docnos, vectors, offsets, model, overwrite=overwrite, save_model=save_model)

    def _embed(self, model: SSR, texts):
        return model.encoder.embed(texts)

    def _sink(self, folder: Path, model: SSR):
        return _CodeSink(folder, model, self._settings['save_model'])

    def model(self) -> SSR:
        """The model: the one given, else the copy stored in the index (its files checked first)."""
        if self._model is not None:
            return self._matching(self._model)
        state = self._state()
        if 'model' not in state:
            if not (self.path / MODEL_FOLDER).is_dir():
                raise ValueError(f'{self.path} holds no model (written with save_model=False); pass model= to SSRIndex')
            storage.check_files(self.path, state['files'], 'the model copy of the SSR index', full=True,
                                prefix=f'{MODEL_FOLDER}/')  # weights edited in place
            state['model'] = self._matching(SSR.from_pretrained(self.path / MODEL_FOLDER))
        return state['model']

    def _matching(self, ssr: SSR) -> SSR:
        """``ssr`` if its SAE has the index's latents (a query's latent ids index the postings)."""
        if ssr.sae.n_latents != self.meta['n_latents']:
            raise ValueError(f'{self.path} holds codes of {self.meta["n_latents"]} latents; the SSR model given has '
                             f'{ssr.sae.n_latents}')
        return ssr

    # -- scoring --------------------------------------------------------------------------------------------------

    def score_tokens(self, indices: np.ndarray, values: np.ndarray, state: dict | None = None) -> np.ndarray:
        """``sum_i max_{t in d} <w_i, z_t>`` of one query's token weights (``indices``/``values``: query tokens x
        k or m, its codes or decoder weights, :meth:`SSR.query_codes`; values taken as float32) against every document
        (float64, 0 for a document sharing no latent with the query)."""
        state = state or self._state()
        return maxsim_over_codes(state['indptr'], state['tokens'], state['values'], state['offsets'],
                                 *_checked_codes(indices, values, state['meta']['n_latents']))

    def pooled(self, state: dict | None = None):
        """The documents' codes max-pooled per latent, as ``(indptr, docs, values)`` postings per latent."""
        state = state or self._state()
        if 'pooled' not in state:
            n_docs, n_latents, tokens, values = state['meta']['num_docs'], state['meta']['n_latents'], \
                state['tokens'], state['values']
            # tokens ascend within a latent, so (latent, document) keys ascend and runs of equal keys are contiguous
            latents = np.repeat(np.arange(n_latents), np.diff(state['indptr']))
            keys = latents * n_docs + state['owner'][tokens]
            starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else keys
            maxima = np.maximum.reduceat(values, starts) if len(keys) else values
            indptr = np.searchsorted(keys[starts] // n_docs, np.arange(n_latents + 1))
            state['pooled'] = (indptr, keys[starts] % n_docs, maxima)
        return state['pooled']

    def score_pooled(self, indices: np.ndarray, values: np.ndarray, state: dict | None = None) -> np.ndarray:
        """The pooled dot product ``<q, d>`` of one query's token codes: ``q`` pooled by the model's
        ``query_pooling``, ``d_j = max_t z_tj``."""
        state = state or self._state()
        indptr, docs, maxima = self.pooled(state)
        owner = torch.zeros(len(indices), dtype=torch.long)
        query = pool_codes(torch.as_tensor(indices, dtype=torch.long), torch.as_tensor(values), owner, 1,
                           state['meta']['n_latents'], self.model().query_pooling)[0].numpy()
        out = np.zeros(state['meta']['num_docs'])
        for latent in np.flatnonzero(query > 0).tolist():
            start, stop = indptr[latent], indptr[latent + 1]
            out[docs[start:stop]] += float(query[latent]) * maxima[start:stop]
        return out

    def search_embeddings(self, vectors: np.ndarray, offsets: np.ndarray, num_results: int, mode: str = 'tokens',
                          query: str | None = None, query_latents: int | None = None, state: dict | None = None
                          ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The top ``num_results`` ``(document ids, scores)`` (best first, ties by docno, positive scores only) of each
        query given as token embeddings grouped by query (as :meth:`MultiVector.embed` returns); ``query`` and
        ``query_latents``: the query tokens' weights (:meth:`SSR.query_codes`; ``query`` defaults as in
        :meth:`retriever`)."""
        num_results = check_int('num_results', num_results, 1)
        query = check_query(mode, query)
        state = state or self._state()
        score = self.score_tokens if mode == 'tokens' else self.score_pooled
        indices, values = self.model().query_codes(vectors, query, query_latents)
        out = []
        for q in range(len(offsets) - 1):
            start, stop = offsets[q], offsets[q + 1]
            scores = score(indices[start:stop], values[start:stop], state)
            docs = top_rows(scores, num_results, self._docno_ranks(state), keep=scores > 0)
            out.append((docs, scores[docs]))
        return out

    def ranked(self, inp: pd.DataFrame, num_results: int, mode: str, query: str | None = None,
               query_latents: int | None = None, build: str | None = None):
        """The input's queries embedded once and searched: ``(result frame, each row's input position, the
        embeddings (vectors, offsets) by input position)``; ``build``: the build a retriever was made on (refused if
        the index was rebuilt since)."""
        check_query_frame(inp, ['query'])
        state = self._state() if build is None else self._check_build(build)
        vectors, offsets = self.model().encoder.embed(as_texts(inp['query'], 'column "query"'), query=True)
        found = self.search_embeddings(vectors, offsets, num_results, mode, query, query_latents, state)
        docnos = state['docnos']
        rows = [(position, docnos[d], s) for position, (docs, scores) in enumerate(found)
                for d, s in zip(docs.tolist(), scores)]
        return result_frame(rows, inp), [r[0] for r in rows], (vectors, offsets)

    def retriever(self, num_results: int = 1000, mode: str = 'tokens', query: str | None = None,
                  query_latents: int | None = None) -> 'SSRRetriever':
        """``qid, query`` -> ``qid, query, docno, score, rank``: ``mode='tokens'`` scores
        ``sum_i max_{t in d} <w_i, z_t>``, ``'pooled'`` the pooled dot product (see the module docs).  The query
        token's weights ``w_i``: ``query='decoder'`` (tokens only; the default there), its embedding against the
        decoder rows, ``<e_i, D_a>`` for its top ``query_latents`` latents (default: twice the SAE's k), so only the
        documents are approximated; ``'codes'`` (the default for ``'pooled'``), its SAE code ``z_i``, as documents
        get theirs."""
        num_results = check_int('num_results', num_results, 1)
        query = check_query(mode, query)
        self.model().query_width(query, query_latents)
        return SSRRetriever(self, num_results, mode, query, query_latents)


def check_query(mode: str, query: str | None) -> str:
    """The query side for ``mode``: ``query`` if allowed with it (the decoder's weights need token-level scoring);
    for None, ``'decoder'`` with ``mode='tokens'`` (chosen on pseudo-queries, see docs/ssr.md) and
    ``'codes'`` with ``'pooled'``."""
    check_choice('mode', mode, MODES)
    if query is None:
        return 'decoder' if mode == 'tokens' else 'codes'
    check_choice('query', query, QUERY_SIDES)
    if query == 'decoder' and mode != 'tokens':
        raise ValueError("query='decoder' needs mode='tokens' (the pooled score pools the query's SAE codes)")
    return query


class SSRRetriever(TopK, pt.Transformer):
    """``qid, query`` -> the top ``num_results`` documents of an :class:`SSRIndex`; bound to the build it was made
    on."""

    def __init__(self, index: SSRIndex, num_results: int, mode: str, query: str, query_latents: int | None):
        self.index = index
        self.num_results = num_results
        self.mode = mode
        self.query = query
        self.query_latents = query_latents
        self.build = index.build_id()

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        return self.ranked(inp)[0]

    def ranked(self, inp: pd.DataFrame):
        """:meth:`SSRIndex.ranked` with this retriever's settings."""
        return self.index.ranked(inp, self.num_results, self.mode, self.query, self.query_latents, self.build)

    def __repr__(self):
        return f'SSR({self.mode}, query={self.query}, {self.index.path.name})'


class _CodeSink:
    """The documents' token codes (:meth:`SSR.doc_codes`), appended chunk by chunk to scratch arrays in the folder
    being built, turned into postings (:func:`token_postings`) when complete."""

    def __init__(self, folder: Path, ssr: SSR, save_model: bool):
        self.folder, self.ssr, self.save_model = folder, ssr, save_model
        k = ssr.doc_k or ssr.sae.config.k
        self.scratch = [folder / '.codes-indices.npy', folder / '.codes-values.npy']
        self.writers = [arrays.ArrayWriter(self.scratch[0], np.int32, (k,)),
                        arrays.ArrayWriter(self.scratch[1], np.float32, (k,))]

    def add(self, vectors: np.ndarray):
        if vectors.shape[1] != self.ssr.encoder.dim:
            raise ValueError(f'vectors of {vectors.shape[1]} dimensions; the SSR model reads {self.ssr.encoder.dim}')
        for writer, array in zip(self.writers, self.ssr.doc_codes(vectors)):
            writer.add(array)

    def close(self) -> dict:
        for writer in self.writers:
            writer.close()
        indices, values = (load_npy(path, 'r') for path in self.scratch)
        postings = token_postings(indices, values, self.ssr.sae.n_latents)
        del indices, values
        for path in self.scratch:
            path.unlink()
        for name, array in zip(POSTINGS_FILES, postings):
            storage.write_array(self.folder / name, array)
        if self.save_model:
            self.ssr.save_into(self.folder / MODEL_FOLDER)
        return {'n_latents': self.ssr.sae.n_latents, 'k': self.ssr.sae.config.k,
                'doc_k': self.writers[0].row_shape[0], 'model': self.ssr.name}
