"""Multi-vector (ColBERT-style) retrieval for PyTerrier: the encoder wrapper, an exact MaxSim scorer, a store of
document token embeddings with a brute-force MaxSim retriever, and a k-means (PLAID-style) candidate generator over
that store as the clustering baseline of :mod:`pyterrier_lsr.kinds.ssr`.

A store (:class:`MaxSimIndex`) is a folder: ``vectors.npy`` (all documents' token embeddings, float16, grouped by
document), ``offsets.npy`` (document ``i`` owns rows ``offsets[i]:offsets[i + 1]``), ``docnos.json`` and
``maxsim.json`` (settings, the encoder's name).  Search reads the vectors into memory as float32 and computes
exactly, so it suits small corpora (Vaswani: ~0.6M tokens, ~0.3 GB in memory).  A store is our artifact (marked
``maxsim_store``, see :mod:`pyterrier_lsr.core.storage`): its inputs are checked before anything is written, it is built
beside its final name and swapped in, and ``overwrite`` replaces only another store.  Its marker records every file's
size and digest (:func:`~pyterrier_lsr.core.storage.record_files`, as an index's ``lsr.json`` does), and so does the
marker of its k-means cells (``ivf/``): opening checks sizes and small files
(:func:`~pyterrier_lsr.core.storage.check_files`), :meth:`~MaxSimIndex.verify` every digest, so an edited or swapped
file
is an error naming it.  A query frame holds one row per query (a duplicate qid is an error, see
:func:`~pyterrier_lsr.core.checks.check_query_frame`), and results are joined to their input row by position, never by
qid.

One concept (the multi-vector encoder and its exact MaxSim store), kept in one module past 450 lines because the store,
its retrievers and its k-means baseline share the segment-max kernels and the store layout checks.
"""
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch

from ..core import storage
from ..core.checks import check_docnos, check_int, check_matrix, check_query_frame, check_result_frame
from ..core.encoding import as_texts
from ..kinds.multivector import MultiVector, gather_rows, maxsim_rows, query_embeddings, segment_max

STORE_FILE = 'maxsim.json'
DOCNOS_FILE = 'docnos.json'
VECTORS_FILE = 'vectors.npy'
OFFSETS_FILE = 'offsets.npy'
IVF_FOLDER = 'ivf'
STORE_KIND = 'maxsim_store'
IVF_KIND = 'maxsim_store.ivf'


def _result_frame(rows: list[tuple[int, str, float]], inp: pd.DataFrame) -> pd.DataFrame:
    """``(input row, docno, score)`` results, best first per input row, as a ``qid, docno, score, rank`` frame
    keeping each input row's query columns: rows are joined by position, never by qid (empty input: empty
    output)."""
    columns = [c for c in inp.columns if c not in ('docno', 'score', 'rank')]
    positions = np.array([r[0] for r in rows], dtype=np.int64)
    out = inp[columns].iloc[positions].reset_index(drop=True)
    return out.assign(docno=pd.Series([r[1] for r in rows], dtype=object),
                      score=np.array([r[2] for r in rows], dtype=np.float64),
                      rank=pd.Series(positions).groupby(positions).cumcount().to_numpy(dtype=np.int64))


def _ranked(frame: pd.DataFrame, scores: np.ndarray, groups) -> pd.DataFrame:
    """``frame`` with ``score`` and ``rank`` (from 0 within each group, best first, ties in input order), sorted by
    group (in order of first appearance) then rank."""
    codes = pd.factorize(pd.Series(list(groups)))[0]
    order = np.lexsort((np.arange(len(frame)), -scores, codes))
    out = frame.iloc[order].reset_index(drop=True).assign(score=scores[order])
    return out.assign(rank=pd.Series(codes[order]).groupby(codes[order]).cumcount().to_numpy(dtype=np.int64))



class MaxSimIndexer(pt.Indexer):
    """Encodes ``docno, text`` documents with a :class:`MultiVector` and writes a :class:`MaxSimIndex` folder."""

    def __init__(self, path, encoder: MultiVector, overwrite: bool = False, text_field: str = 'text',
                 verbose: bool = True):
        self.path = Path(path)
        self.encoder = encoder
        self.overwrite = overwrite
        self.text_field = text_field
        self.verbose = verbose

    def index_inputs(self):
        return [['docno', self.text_field]]

    def index(self, it: Iterable[dict]) -> 'MaxSimIndex':
        docs = list(it)
        for doc in docs[:1]:
            missing = [c for c in ('docno', self.text_field) if c not in doc]
            if missing:
                raise KeyError(f'documents must have columns {missing}; got {sorted(doc)}')
        docnos = check_docnos([d['docno'] for d in docs], f'the documents indexed into {self.path}')
        vectors, offsets = self.encoder.embed(as_texts([d[self.text_field] for d in docs], 'documents'),
                                              verbose=self.verbose)
        return MaxSimIndex.write(self.path, docnos, vectors, offsets, self.encoder, overwrite=self.overwrite)


class TokenStore:
    """What a folder of documents' token rows holds whatever it stores per token (a MaxSim store's embeddings, an SSR
    index's postings): its marker, settings file (``num_docs``, ``num_tokens``), ``docnos.json`` and ``offsets.npy``
    (document ``i`` owns token rows ``offsets[i]:offsets[i + 1]``), read and checked alike, and written alike."""
    kind: str
    meta_file: str
    label: str

    def __init__(self, path):
        self.path = Path(path)
        if not storage.is_artifact(self.path, self.kind):
            raise FileNotFoundError(f'no {self.label} at {self.path} (no {storage.MARKER} naming {self.kind!r}; '
                                    'folders written before 0.3 must be written again)')
        # every file's size and digest recorded at build (storage.record_files / check_files): an edited
        # settings file, docno list or shortened array is an error naming it, not a silently wrong ranking
        self.files = storage.read_marker(self.path).get('files')
        if not isinstance(self.files, dict):
            raise ValueError(f'{self.label} {self.path}: its {storage.MARKER} records no files (written by an older '
                             'pyterrier-lsr, or edited); write it again')
        storage.check_files(self.path, self.files, f'the {self.label}')
        self.meta = storage.read_json(self.path / self.meta_file, f'{self.label} settings')
        self.docnos: list[str] = storage.read_json(self.path / DOCNOS_FILE, f'{self.label} docnos', expect=list)
        self.offsets = _load_npy(self.path / OFFSETS_FILE)
        try:
            for key in ('num_docs', 'num_tokens'):
                check_int(key, self.meta.get(key), 0)
        except (TypeError, ValueError) as ex:
            raise ValueError(f'{self.path / self.meta_file}: {ex}') from None
        problem = _layout_problem(self.docnos, self.offsets, self.meta['num_docs'], self.meta['num_tokens'])
        if problem:
            raise ValueError(f'{self.label} {self.path}: {problem}')

    @staticmethod
    def _checked(path: Path, docnos: Sequence[str], offsets, num_tokens: int):
        """``(docnos, offsets)`` given to :meth:`write`, checked before anything is written."""
        docnos = check_docnos(docnos, f'the documents of {path}')
        offsets = np.asarray(offsets)
        problem = _layout_problem(docnos, offsets, len(docnos), num_tokens)
        if problem:
            raise ValueError(f'offsets of {path}: {problem}')
        return docnos, offsets

    @classmethod
    @contextmanager
    def _building(cls, path: Path, docnos: list[str], offsets: np.ndarray, meta: dict, overwrite: bool):
        """Yields the folder being built (see :func:`~pyterrier_lsr.core.storage.build_folder`), its common files
        written;
        the caller adds its own."""
        with storage.build_folder(path, cls.kind, overwrite, what=cls.label) as tmp:
            storage.write_array(tmp / OFFSETS_FILE, offsets.astype(np.int64))
            storage.write_json(tmp / DOCNOS_FILE, docnos, indent=None)
            storage.write_json(tmp / cls.meta_file, {'num_docs': len(docnos), **meta})
            yield tmp
            storage.mark(tmp, cls.kind, files=storage.record_files(tmp))

    def verify(self) -> 'TokenStore':
        """Checks the digest of every file (a full read); raises a ``ValueError`` naming the damaged files.  Opening
        checks sizes and small files only."""
        storage.check_files(self.path, self.files, f'the {self.label}', full=True)
        return self

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def __len__(self):
        return self.num_docs()


class MaxSimIndex(TokenStore):
    """A store of documents' token embeddings: brute-force MaxSim retrieval, MaxSim re-ranking by docno, and the
    k-means (PLAID-style) candidate generation of the clustering baseline.

    Args:
        path: the folder (see the module docs).
        encoder: the :class:`MultiVector` that encoded the documents (it encodes queries); when omitted, the folder
            recorded at indexing time is loaded.
    """

    kind, meta_file, label = STORE_KIND, STORE_FILE, 'MaxSim store'

    def __init__(self, path, encoder: MultiVector | None = None):
        super().__init__(path)
        try:
            check_int('dim', self.meta.get('dim'), 1)
        except (TypeError, ValueError) as ex:
            raise ValueError(f'{self.path / STORE_FILE}: {ex}') from None
        shape = _load_npy(self.path / VECTORS_FILE, 'r').shape
        if tuple(shape) != (self.meta['num_tokens'], self.meta['dim']):
            raise ValueError(f'MaxSim store {self.path}: vectors of shape {tuple(shape)}, expected '
                             f'({self.meta["num_tokens"]}, {self.meta["dim"]})')
        self.lengths = torch.from_numpy(np.diff(self.offsets))
        self._vectors = None
        self._docids = None
        self._encoder = encoder

    @classmethod
    def write(cls, path, docnos: Sequence[str], vectors: np.ndarray, offsets: np.ndarray,
              encoder: MultiVector | None = None, overwrite: bool = False) -> 'MaxSimIndex':
        """Writes a store from embeddings already computed (e.g. :meth:`MultiVector.embed` of a corpus): the inputs
        are checked first (docnos: non-empty unique strings; offsets: from 0, non-decreasing, ending at the number of
        vector rows; vectors: finite), then the store is built beside ``path`` and swapped in; ``overwrite`` replaces
        only another MaxSim store."""
        path = Path(path)
        vectors = check_matrix('vectors', vectors)
        docnos, offsets = cls._checked(path, docnos, offsets, len(vectors))
        stored = vectors.astype(np.float16)
        if not np.isfinite(stored).all():
            raise ValueError('vectors must lie within float16 range, the stored precision')
        meta = {'num_tokens': len(vectors), 'dim': int(vectors.shape[1]), 'model': getattr(encoder, 'name', None)}
        with cls._building(path, docnos, offsets, meta, overwrite) as tmp:
            storage.write_array(tmp / VECTORS_FILE, stored)
        return cls(path, encoder)

    @property
    def vectors(self) -> torch.Tensor:
        if self._vectors is None:
            self._vectors = torch.from_numpy(_load_npy(self.path / VECTORS_FILE).astype(np.float32))
        return self._vectors

    @property
    def docids(self) -> dict[str, int]:
        if self._docids is None:
            self._docids = {d: i for i, d in enumerate(self.docnos)}
        return self._docids

    @property
    def encoder(self) -> MultiVector:
        if self._encoder is None:
            if not self.meta.get('model'):
                raise ValueError(f'{self.path} records no model; pass encoder= to MaxSimIndex')
            self._encoder = MultiVector.from_pretrained(self.meta['model'])
        return self._encoder

    def score_all(self, query: torch.Tensor) -> torch.Tensor:
        """Exact MaxSim of one query's embeddings (Lq x dim) against every document."""
        return maxsim_rows(query, self.vectors, self.lengths)

    def score_docs(self, query: torch.Tensor, docs: np.ndarray) -> torch.Tensor:
        """Exact MaxSim against the documents of internal ids ``docs``."""
        sub, lengths = gather_rows(self.vectors, self.offsets, self.lengths, np.asarray(docs, dtype=np.int64))
        return maxsim_rows(query, sub, lengths)

    def retriever(self, num_results: int = 1000) -> pt.Transformer:
        """Brute-force exact MaxSim over every document: ``qid, query`` -> ranked ``docno, score``."""
        return _Retriever(self, lambda q: self._top(self.score_all(q), None, num_results))

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
        docids = self.docids
        missing = {d for d in frame['docno'] if d not in docids}
        if missing:
            raise KeyError(f'{len(missing)} docnos are not in {self.path}, e.g. {sorted(map(str, missing))[:3]}')
        scores = np.zeros(len(frame))
        for key, idx in pd.Series(range(len(keys))).groupby(keys).indices.items():
            docs = np.array([docids[d] for d in frame['docno'].iloc[idx]], dtype=np.int64)
            scores[idx] = self.score_docs(queries[key], docs).numpy()
        return _ranked(frame, scores, groups)

    def _top(self, scores: torch.Tensor, docs: np.ndarray | None, k: int) -> list[tuple[str, float]]:
        top = scores.topk(min(k, len(scores)))
        ids = top.indices.numpy() if docs is None else docs[top.indices.numpy()]
        return [(self.docnos[i], s) for i, s in zip(ids.tolist(), top.values.tolist())]

    # -- clustering baseline --------------------------------------------------------------------------------------

    def build_ivf(self, n_centroids: int | None = None, niter: int = 4, seed: int = 0,
                  verbose: bool = False) -> dict:
        """k-means centroids over all stored token embeddings and each token's nearest centroid (faiss), written
        under ``ivf/``; ColBERTv2/PLAID's defaults: ``2^floor(log2(16 sqrt(tokens)))`` centroids, 4 iterations
        (PLAID samples the corpus for k-means; our corpora are below its sample size, so every token is used).
        Returns the seconds spent in k-means and in assignment."""
        import faiss
        vectors = self.vectors.numpy()
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

    def ivf_retriever(self, ncells: int = 2, ndocs: int = 1024, num_results: int = 1000) -> pt.Transformer:
        """The clustering baseline, PLAID-style: each query token probes its ``ncells`` nearest centroids; documents
        with a token in a probed cell are candidates; candidates are ranked by centroid interaction (MaxSim with each
        document token replaced by its centroid) and the top ``ndocs`` by exact MaxSim.  Defaults are ColBERTv2's
        search settings for k=100 (without its centroid-score threshold)."""
        ivf = _Ivf(self)
        return _Retriever(self, lambda q: ivf.search(q, ncells, ndocs, num_results))

    def __repr__(self):
        return f'MaxSimIndex({str(self.path)!r})'


def _load_npy(path: Path, mmap_mode=None) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False, mmap_mode=mmap_mode)
    except FileNotFoundError:
        raise FileNotFoundError(f'{path}: missing') from None
    except (ValueError, OSError) as ex:
        raise ValueError(f'{path} is not a readable .npy array ({ex})') from None


def _layout_problem(docnos: list, offsets: np.ndarray, num_docs: int, num_tokens: int) -> str | None:
    """What keeps docnos and offsets from describing ``num_docs`` documents of ``num_tokens`` token rows (offsets from
    0, non-decreasing, ending at the number of rows: none reads past them), or ``None``."""
    if len(docnos) != num_docs:
        return f'{len(docnos)} docnos for {num_docs} documents'
    if offsets.shape != (num_docs + 1,) or not np.issubdtype(offsets.dtype, np.integer):
        return f'offsets of shape {offsets.shape} ({offsets.dtype}) for {num_docs} documents'
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] != num_tokens:
        return f'offsets must start at 0, never decrease and end at the number of token rows ({num_tokens})'
    return None


class _Ivf:
    def __init__(self, index: MaxSimIndex):
        folder = index.path / IVF_FOLDER
        # sizes, and the digests of small files
        storage.check_files(folder, index._ivf_files(), 'the k-means cell folder',
                            remedy='rebuild it with build_ivf()')
        self.index = index
        centroids, codes = _load_npy(folder / 'centroids.npy'), _load_npy(folder / 'codes.npy').astype(np.int64)
        if codes.shape != (index.meta['num_tokens'],) or codes.min(initial=0) < 0 or \
                codes.max(initial=0) >= max(1, len(centroids)):
            raise ValueError(f'{folder}: the cells do not match the store (rebuild them with build_ivf())')
        self.centroids, self.codes = torch.from_numpy(centroids), torch.from_numpy(codes)
        owner = np.repeat(np.arange(index.num_docs()), np.diff(index.offsets))
        # Inverted lists: the distinct documents having a token in each cell.
        pairs = np.unique(np.stack([self.codes.numpy(), owner], 1), axis=0)
        self.cell_offsets = np.searchsorted(pairs[:, 0], np.arange(len(self.centroids) + 1))
        self.cell_docs = pairs[:, 1]

    def search(self, query: torch.Tensor, ncells: int, ndocs: int, k: int):
        index = self.index
        centroid_scores = query @ self.centroids.T  # Lq x centroids
        cells = np.unique(centroid_scores.topk(min(ncells, len(self.centroids)), dim=-1).indices.numpy())
        docs = np.unique(np.concatenate([self.cell_docs[self.cell_offsets[c]:self.cell_offsets[c + 1]] for c in cells]))
        if len(docs) > ndocs:
            rows, lengths = gather_rows(self.codes[:, None], index.offsets, index.lengths, docs)
            approx = segment_max(centroid_scores.T[rows[:, 0]], lengths).sum(-1)
            docs = docs[approx.topk(ndocs).indices.numpy()]
        return index._top(index.score_docs(query, docs), docs, k)


class _Retriever(pt.Transformer):
    def __init__(self, index: MaxSimIndex, search):
        self.index = index
        self.search = search

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_query_frame(inp, ['query'])
        texts = as_texts(inp['query'], 'column "query"')
        queries = query_embeddings(self.index.encoder, list(dict.fromkeys(texts)))
        rows = []
        for position, query in enumerate(texts):
            if len(queries[query]):
                rows.extend((position, d, s) for d, s in self.search(queries[query]))
        return _result_frame(rows, inp)


class _StoredScorer(pt.Transformer):
    def __init__(self, index: MaxSimIndex):
        self.index = index

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query'])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        texts = as_texts(inp['query'], 'column "query"')
        return self.index.rescore(inp, texts, query_embeddings(self.index.encoder, list(dict.fromkeys(texts))))
