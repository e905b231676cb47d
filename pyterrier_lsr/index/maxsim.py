"""Multi-vector (ColBERT-style) retrieval for PyTerrier: a store of document token embeddings (an artifact, and its own
brute-force exact MaxSim retriever), MaxSim re-ranking by docno, and a k-means (PLAID-style) candidate generator over
that store as the clustering baseline of :mod:`pyterrier_lsr.kinds.ssr`.

A store (:class:`MaxSimIndex`, type ``multivector_index``, format ``maxsim``) is a token store folder (see
:mod:`.tokens`: marker, ``pt_meta.json``, ``docnos.json``, ``offsets.npy``) with ``vectors.npy`` (all documents' token
embeddings, float16, grouped by document) and ``maxsim.json`` (counts, ``dim``, the encoder's name).  Build one with
``MaxSimIndex(path, model).indexer().index(docs)``, or from
embeddings at hand with :meth:`MaxSimIndex.write`.  Search reads the vectors into memory as float32 on first use and
computes exactly, so it suits small corpora (Vaswani: ~0.6M tokens, ~0.3 GB in memory).  The k-means cells
(``ivf/``) carry their own marker recording their files and the digest of the vectors they cluster: opening checks
sizes and small files, :meth:`~MaxSimIndex.verify` every digest, so an edited or swapped file is an error naming it.
A query frame holds one row per query (a duplicate qid is an error, see
:func:`~pyterrier_lsr.core.checks.check_query_frame`), and results are joined to their input row by position, never by
qid.
"""
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch

from ..core import arrays, storage
from ..core.checks import check_bool, check_int, check_query_frame, check_result_frame
from ..core.encoding import as_texts
from ..core.extras import import_extra
from ..core.quiet import quiet_transformers
from ..kinds.multivector import MultiVector, gather_rows, maxsim_rows, query_embeddings, segment_max
from .ranking import docno_ranks, top_rows
from .tokens import TokenStore, TopK, load_npy, result_frame

STORE_FILE = 'maxsim.json'
VECTORS_FILE = 'vectors.npy'
IVF_FOLDER = 'ivf'
MODEL_FOLDER = 'model'
STORE_KIND = 'maxsim_store'
IVF_KIND = 'maxsim_store.ivf'

__all__ = ['MaxSimIndex', 'MaxSimRetriever']


def _ranked(frame: pd.DataFrame, scores: np.ndarray, groups) -> pd.DataFrame:
    """``frame`` with ``score`` and ``rank`` (from 0 within each group, best first, ties by docno: the rule of
    :mod:`.ranking`), sorted by group (in order of first appearance) then rank."""
    codes = pd.factorize(pd.Series(list(groups)))[0]
    order = np.lexsort((docno_ranks(frame['docno'].astype(str)), -scores, codes))
    out = frame.iloc[order].reset_index(drop=True).assign(score=scores[order])
    return out.assign(rank=pd.Series(codes[order]).groupby(codes[order]).cumcount().to_numpy(dtype=np.int64))



class MaxSimIndex(TokenStore):
    """A store of documents' token embeddings (see the module docs): brute-force MaxSim retrieval (also as the store's
    own transformer, ``MaxSimIndex(path)(topics)``), MaxSim re-ranking by docno, and the k-means (PLAID-style)
    candidate generation of the clustering baseline.

    Args:
        path: the folder; a missing or empty one is a store to build (:meth:`built` is False).
        model: the :class:`MultiVector` that encodes documents (when indexing) and queries; default: the copy
            stored in the store (its files checked against their digests first).
        save_model: store a copy of the model in the store when indexing (without it, pass ``model=`` when
            reopening: a model folder named by its path could have changed since).
        overwrite, text_field, shard_size, verbose: for :meth:`index` (see :class:`~.tokens.TokenStore`).

    Example::

        store = MaxSimIndex("vaswani.maxsim", model)
        if not store.built():
            store.indexer().index(corpus)
        store.search("radio waves")                  # the store is its own brute-force retriever
        (store.retriever() % 10).search("radio waves")   # asks for 10, not 1,000
    """

    kind, meta_file, label = STORE_KIND, STORE_FILE, 'MaxSim store'
    ARTIFACT_TYPE = 'multivector_index'
    ARTIFACT_FORMAT = 'maxsim'

    def __init__(self, path, model: MultiVector | None = None, *, save_model: bool = True, overwrite: bool = False,
                 text_field: str = 'text', shard_size: int = 1024, verbose: bool = True):
        super().__init__(path, model, overwrite=overwrite, text_field=text_field, shard_size=shard_size,
                         verbose=verbose)
        self._settings['save_model'] = check_bool('save_model', save_model)

    def _open(self, marker: dict) -> dict:
        state = super()._open(marker)
        meta = state['meta']
        try:
            check_int('dim', meta.get('dim'), 1)
        except (TypeError, ValueError) as ex:
            raise ValueError(f'{self.path / STORE_FILE}: {ex}') from None
        shape = load_npy(self.path / VECTORS_FILE, 'r').shape
        if tuple(shape) != (meta['num_tokens'], meta['dim']):
            raise ValueError(f'MaxSim store {self.path}: vectors of shape {tuple(shape)}, expected '
                             f'({meta["num_tokens"]}, {meta["dim"]})')
        state['lengths'] = torch.from_numpy(np.diff(state['offsets']))
        return state

    @classmethod
    def write(cls, path, docnos: Sequence[str], vectors: np.ndarray, offsets: np.ndarray,
              model: MultiVector | None = None, overwrite: bool = False, save_model: bool = True) -> 'MaxSimIndex':
        """Writes a store from embeddings already computed (e.g. :meth:`MultiVector.embed` of a corpus): the inputs
        are checked first (docnos: non-empty unique strings; offsets: from 0, non-decreasing, ending at the number of
        vector rows; vectors: finite), then the store is built beside ``path`` and swapped in; ``overwrite`` replaces
        only another MaxSim store; ``save_model`` stores a copy of ``model`` (when given)."""
        return cls._from_arrays(path, docnos, vectors, offsets, model, overwrite=overwrite,
                                save_model=save_model and model is not None)

    def _embed(self, model, texts):
        return model.embed(texts)

    def _sink(self, folder: Path, model):
        # an encoder that cannot be saved (not a MultiVector) is not copied: reopening then needs it given again
        keep = self._settings['save_model'] and hasattr(model, 'write_folder')
        return _VectorSink(folder, getattr(model, 'name', None), model if keep else None)

    def _vectors(self, state: dict) -> torch.Tensor:
        return self._lazy_array(state, VECTORS_FILE, lambda a: torch.from_numpy(a.astype(np.float32)))

    def vectors(self) -> torch.Tensor:
        """Every token embedding (float32), read on first use."""
        return self._vectors(self._state())

    @property
    def lengths(self) -> torch.Tensor:
        return self._state()['lengths']

    @property
    def docids(self) -> dict[str, int]:
        state = self._state()
        if 'docids' not in state:
            state['docids'] = {d: i for i, d in enumerate(state['docnos'])}
        return state['docids']

    def model(self) -> MultiVector:
        """The model given, else the copy stored with the build at ``path`` (its files checked against their digests
        first, so weights edited in place are noticed), loaded once per build.  A store keeping no copy
        (``save_model=False``, or written by an older pyterrier-lsr, which recorded the model's name only) needs
        ``model=``: a model folder reloaded by its name may hold other weights by now."""
        if self._model is not None:
            return self._matching(self._model)
        state = self._state()
        if 'model' not in state:
            if not (self.path / MODEL_FOLDER).is_dir():
                recorded = state['meta'].get('model')
                named = f' (it records {recorded!r})' if recorded else ''
                raise ValueError(f'{self.path} keeps no copy of its model{named}: pass model= to MaxSimIndex (the '
                                 'one its documents were encoded with), or rebuild it with save_model=True')
            storage.check_files(self.path, state['files'], 'the model copy of the MaxSim store', full=True,
                                prefix=f'{MODEL_FOLDER}/')
            model = self._matching(MultiVector.from_pretrained(self.path / MODEL_FOLDER))
            model.name = state['meta'].get('model') or model.name  # the name it was indexed under, in reprs
            state['model'] = model
        return state['model']

    def _matching(self, model: MultiVector) -> MultiVector:
        """``model`` if its embeddings have the stored vectors' dimension (any, before the store is built)."""
        if self.built() and model.dim != self.meta['dim']:
            raise ValueError(f'{self.path} holds vectors of {self.meta["dim"]} dimensions; the model given embeds '
                             f'in {model.dim}')
        return model

    def score_all(self, query: torch.Tensor, state: dict | None = None) -> torch.Tensor:
        """Exact MaxSim of one query's embeddings (Lq x dim) against every document."""
        state = state or self._state()
        return maxsim_rows(query, self._vectors(state), state['lengths'])

    def score_docs(self, query: torch.Tensor, docs: np.ndarray, state: dict | None = None) -> torch.Tensor:
        """Exact MaxSim against the documents of internal ids ``docs``."""
        state = state or self._state()
        sub, lengths = gather_rows(self._vectors(state), state['offsets'], state['lengths'],
                                   np.asarray(docs, dtype=np.int64))
        return maxsim_rows(query, sub, lengths)

    def retriever(self, num_results: int = 1000) -> 'MaxSimRetriever':
        """Brute-force exact MaxSim over every document: ``qid, query`` -> ranked ``docno, score``."""
        return MaxSimRetriever(self, check_int('num_results', num_results, 1))

    def scorer(self) -> pt.Transformer:
        """Re-ranks ``qid, query, docno`` (docnos of this store) by exact MaxSim from the stored vectors."""
        return _StoredScorer(self)

    def rescore(self, frame: pd.DataFrame, keys, queries, groups=None) -> pd.DataFrame:
        """``frame`` (with ``qid``, ``docno`` of this store) scored by exact MaxSim and ranked.

        Row ``i`` is scored with the query embeddings ``queries[keys[i]]`` (``keys``: one per row, in row order, e.g.
        query texts, or the position of each row's query in the input when the embeddings are at hand: qids are not
        unique keys when two input rows share one).  Ranks run within ``groups`` (one per row; default the qids)."""
        keys = list(keys)
        if len(keys) != len(frame):
            raise ValueError(f'rescore needs one key per row: {len(keys)} keys for {len(frame)} rows')
        groups = frame['qid'] if groups is None else list(groups)
        if len(groups) != len(frame):
            raise ValueError(f'rescore needs one group per row: {len(groups)} groups for {len(frame)} rows')
        state, docids = self._state(), self.docids
        missing = {d for d in frame['docno'] if d not in docids}
        if missing:
            raise KeyError(f'{len(missing)} docnos are not in {self.path}, e.g. {sorted(map(str, missing))[:3]}')
        scores = np.zeros(len(frame))
        for key, idx in pd.Series(range(len(keys))).groupby(keys).indices.items():
            docs = np.array([docids[d] for d in frame['docno'].iloc[idx]], dtype=np.int64)
            scores[idx] = self.score_docs(queries[key], docs, state).numpy()
        return _ranked(frame, scores, groups)

    def _top(self, scores: torch.Tensor, docs: np.ndarray | None, k: int, state: dict) -> list[tuple[str, float]]:
        """The ``k`` best ``(docno, score)`` of ``scores`` (of every document, or of the documents ``docs``), ties by
        docno (:func:`~.ranking.top_rows`)."""
        values = scores.numpy()
        ids = np.arange(len(values)) if docs is None else np.asarray(docs, dtype=np.int64)
        picked = top_rows(values, k, self._docno_ranks(state)[ids])
        return [(state['docnos'][i], s) for i, s in zip(ids[picked].tolist(), values[picked].tolist())]

    # -- clustering baseline --------------------------------------------------------------------------------------

    def build_ivf(self, n_centroids: int | None = None, niter: int = 4, seed: int = 0,
                  verbose: bool = True) -> dict:
        """k-means centroids over all stored token embeddings and each token's nearest centroid (faiss), written
        under ``ivf/``; ColBERTv2/PLAID's defaults: ``2^floor(log2(16 sqrt(tokens)))`` centroids, 4 iterations
        (PLAID samples the corpus for k-means; our corpora are below its sample size, so every token is used).
        Returns the seconds spent in k-means and in assignment."""
        faiss = import_extra('multivector', 'faiss', needed_for='build_ivf (k-means)')
        vectors = self.vectors().numpy()
        k = n_centroids or int(2 ** np.floor(np.log2(16 * np.sqrt(len(vectors)))))
        start = time.perf_counter()
        kmeans = faiss.Kmeans(vectors.shape[1], k, niter=niter, seed=seed, spherical=True, verbose=verbose,
                              max_points_per_centroid=max(256, -(-len(vectors) // k)))
        kmeans.train(vectors)
        trained = time.perf_counter()
        _, codes = kmeans.index.search(vectors, 1)
        assigned = time.perf_counter()
        with storage.build_folder(self.path / IVF_FOLDER, IVF_KIND, overwrite=True, what='k-means cells') as folder:
            storage.write_array(folder / 'centroids.npy', kmeans.centroids.astype(np.float32))
            storage.write_array(folder / 'codes.npy', codes[:, 0].astype(np.int32))
            # recorded like the store's own files, and tied to the vectors they cluster
            storage.mark(folder, IVF_KIND, files=storage.record_files(folder), vectors=self._vectors_digest())
        return {'kmeans_s': trained - start, 'assign_s': assigned - trained, 'n_centroids': k}

    def _vectors_digest(self) -> str:
        return self.files[VECTORS_FILE]['sha256']

    def _ivf_files(self) -> dict[str, dict]:
        """The files of the k-means cells as :meth:`build_ivf` recorded them (see
        :func:`~pyterrier_lsr.core.storage.record_files`), or an error naming the folder: cells never built, written by
        an
        older pyterrier-lsr, or built for other vectors (another store's cells copied in)."""
        folder = self.path / IVF_FOLDER
        if not folder.exists():
            raise FileNotFoundError(f'{folder}: no k-means cells; build them with build_ivf()')
        marker = storage.read_marker(folder) if storage.is_artifact(folder, IVF_KIND) else None
        if not marker or not isinstance(marker.get('files'), dict):
            raise ValueError(f'{folder}: its {storage.MARKER} records no k-means cells (written by an older '
                             'pyterrier-lsr, or edited); rebuild them with build_ivf()')
        if marker.get('vectors') != self._vectors_digest():
            raise ValueError(f'{folder}: the k-means cells were built for other vectors than {VECTORS_FILE} of '
                             f'{self.path}; rebuild them with build_ivf()')
        return marker['files']

    def verify(self) -> 'MaxSimIndex':
        """As :meth:`TokenStore.verify`, and every file of the k-means cells when they are built."""
        super().verify()
        if (self.path / IVF_FOLDER).exists():
            storage.check_files(self.path / IVF_FOLDER, self._ivf_files(), 'the k-means cell folder', full=True,
                                remedy='rebuild it with build_ivf()')
        return self

    def ivf_retriever(self, ncells: int = 2, ndocs: int = 1024, num_results: int = 1000) -> 'MaxSimRetriever':
        """The clustering baseline, PLAID-style: each query token probes its ``ncells`` nearest centroids; documents
        with a token in a probed cell are candidates; candidates are ranked by centroid interaction (MaxSim with each
        document token replaced by its centroid) and the top ``ndocs`` by exact MaxSim.  Defaults are ColBERTv2's
        search settings for k=100 (without its centroid-score threshold)."""
        num_results = check_int('num_results', num_results, 1)
        ivf = _Ivf(self, check_int('ncells', ncells, 1), check_int('ndocs', ndocs, 1))
        return MaxSimRetriever(self, num_results, ivf)


class _VectorSink:
    """The store's ``vectors.npy``, written chunk by chunk as float16, and a copy of the encoder (``model``, when
    kept) under ``model/``."""

    def __init__(self, folder: Path, model_name: str | None, model: MultiVector | None = None):
        self.folder, self.model_name, self.model, self.writer = folder, model_name, model, None

    def add(self, vectors: np.ndarray):
        stored = vectors.astype(np.float16)
        if not np.isfinite(stored).all():
            raise ValueError('vectors must lie within float16 range, the stored precision')
        if self.writer is None:
            self.writer = arrays.ArrayWriter(self.folder / VECTORS_FILE, np.float16, stored.shape[1:])
        self.writer.add(stored)

    def close(self) -> dict:
        if self.writer is None or not self.writer.rows:
            raise ValueError('every document is empty (no token rows); nothing could be retrieved')
        self.writer.close()
        if self.model is not None:
            with quiet_transformers():
                self.model.write_folder(self.folder / MODEL_FOLDER)
        return {'dim': int(self.writer.row_shape[0]), 'model': self.model_name}


class _Ivf:
    def __init__(self, index: MaxSimIndex, ncells: int, ndocs: int):
        folder = index.path / IVF_FOLDER
        state = index._state()
        # sizes, and the digests of small files
        storage.check_files(folder, index._ivf_files(), 'the k-means cell folder',
                            remedy='rebuild it with build_ivf()')
        self.ncells, self.ndocs = ncells, ndocs
        centroids, codes = load_npy(folder / 'centroids.npy'), load_npy(folder / 'codes.npy').astype(np.int64)
        if codes.shape != (state['meta']['num_tokens'],) or codes.min(initial=0) < 0 or \
                codes.max(initial=0) >= max(1, len(centroids)):
            raise ValueError(f'{folder}: the cells do not match the store (rebuild them with build_ivf())')
        self.centroids, self.codes = torch.from_numpy(centroids), torch.from_numpy(codes)
        owner = np.repeat(np.arange(len(state['docnos'])), np.diff(state['offsets']))
        # Inverted lists: the distinct documents having a token in each cell.
        pairs = np.unique(np.stack([self.codes.numpy(), owner], 1), axis=0)
        self.cell_offsets = np.searchsorted(pairs[:, 0], np.arange(len(self.centroids) + 1))
        self.cell_docs = pairs[:, 1]

    def candidates(self, query: torch.Tensor, state: dict) -> np.ndarray:
        """The documents kept for exact scoring (see :meth:`MaxSimIndex.ivf_retriever`)."""
        centroid_scores = query @ self.centroids.T  # Lq x centroids
        cells = np.unique(centroid_scores.topk(min(self.ncells, len(self.centroids)), dim=-1).indices.numpy())
        docs = np.unique(np.concatenate([self.cell_docs[self.cell_offsets[c]:self.cell_offsets[c + 1]] for c in cells]))
        if len(docs) > self.ndocs:
            rows, lengths = gather_rows(self.codes[:, None], state['offsets'], state['lengths'], docs)
            approx = segment_max(centroid_scores.T[rows[:, 0]], lengths).sum(-1)
            docs = docs[approx.topk(self.ndocs).indices.numpy()]
        return docs


class MaxSimRetriever(TopK, pt.Transformer):
    """``qid, query`` -> the top ``num_results`` documents of a :class:`MaxSimIndex` by exact MaxSim, over every
    document or over the k-means baseline's candidates; bound to the build it was made on."""

    def __init__(self, index: MaxSimIndex, num_results: int, ivf: _Ivf | None = None):
        self.index = index
        self.num_results = num_results
        self.ivf = ivf
        self.build = index.build_id()

    def search_one(self, query: torch.Tensor, state: dict) -> list[tuple[str, float]]:
        """The ranked ``(docno, score)`` of one query's embeddings."""
        if self.ivf is None:
            return self.index._top(self.index.score_all(query, state), None, self.num_results, state)
        docs = self.ivf.candidates(query, state)
        return self.index._top(self.index.score_docs(query, docs, state), docs, self.num_results, state)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_query_frame(inp, ['query'])
        state = self.index._check_build(self.build)
        texts = as_texts(inp['query'], 'column "query"')
        queries = query_embeddings(self.index.model(), list(dict.fromkeys(texts)))
        rows = []
        for position, query in enumerate(texts):
            if len(queries[query]):
                rows.extend((position, d, s) for d, s in self.search_one(queries[query], state))
        return result_frame(rows, inp)

    def __repr__(self):
        ivf = '' if self.ivf is None else f', ncells={self.ivf.ncells}, ndocs={self.ivf.ndocs}'
        return f'MaxSim({self.index.path.name}, num_results={self.num_results}{ivf})'


class _StoredScorer(pt.Transformer):
    def __init__(self, index: MaxSimIndex):
        self.index = index

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query'])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        texts = as_texts(inp['query'], 'column "query"')
        return self.index.rescore(inp, texts, query_embeddings(self.index.model(), list(dict.fromkeys(texts))))

    def __repr__(self):
        return f'MaxSimScorer({self.index.path.name})'
