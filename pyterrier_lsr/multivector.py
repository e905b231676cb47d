"""Multi-vector (ColBERT-style) retrieval for PyTerrier: the encoder wrapper, an exact MaxSim scorer, a store of
document token embeddings with a brute-force MaxSim retriever, and a k-means (PLAID-style) candidate generator over
that store as the clustering baseline of :mod:`pyterrier_lsr.ssr`.

A store (:class:`MaxSimIndex`) is a folder: ``vectors.npy`` (all documents' token embeddings, float16, grouped by
document), ``offsets.npy`` (document ``i`` owns rows ``offsets[i]:offsets[i + 1]``), ``docnos.json`` and
``maxsim.json`` (settings, the encoder's name).  Search reads the vectors into memory as float32 and computes
exactly, so it suits small corpora (Vaswani: ~0.6M tokens, ~0.3 GB in memory).
"""
import json
import os
import shutil
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
import torch

from .encoding import autocast, length_sorted_batches, resolve_device, resolve_precision
from .models.multivector import SETTINGS_FILE, MultiVectorModel
from .models.sae_splade import structural_token_ids

STORE_FILE = 'maxsim.json'
IVF_FOLDER = 'ivf'


def _write_atomic(path: Path, write):
    """``write(tmp_path)`` then rename, so a crash never leaves a half-written file under the final name."""
    tmp = path.with_name(path.name + '.tmp')
    write(tmp)
    os.replace(tmp, path)


def _save_npy(path: Path, array: np.ndarray):
    def write(tmp):
        with open(tmp, 'wb') as f:
            np.save(f, array)
    _write_atomic(path, write)


class MultiVector:
    """A :class:`~pyterrier_lsr.models.multivector.MultiVectorModel` and its tokenizer: token embeddings of texts,
    an exact MaxSim scorer and an indexer for a :class:`MaxSimIndex`.

    Args:
        model, tokenizer: the encoder and its HF tokenizer.
        device, batch_size, precision: as for :class:`~pyterrier_lsr.Splade`.
        doc_max_length, query_max_length: truncation lengths (special tokens included) of documents and queries.
    """

    def __init__(self, model: MultiVectorModel, tokenizer, device=None, doc_max_length: int = 256,
                 query_max_length: int = 32, batch_size: int = 32, precision: Optional[str] = None,
                 name: Optional[str] = None):
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.doc_max_length = doc_max_length
        self.query_max_length = query_max_length
        self.batch_size = batch_size
        self.precision = resolve_precision(precision, self.device)
        self.name = name

    @property
    def dim(self) -> int:
        return self.model.dim

    @classmethod
    def from_backbone(cls, backbone: str = 'all-MiniLM-L6-v2', dim: int = 128, seed: int = 0,
                      **kwargs) -> 'MultiVector':
        """A new (untrained) encoder: an HF ``AutoModel`` (offline names resolve, see :mod:`pyterrier_lsr.offline`)
        with an orthogonally initialised ``hidden -> dim`` projection."""
        from .models.features import load_dense
        dense, tokenizer = load_dense(backbone)
        model = MultiVectorModel(dense, dim, structural_token_ids(tokenizer), seed=seed)
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> 'MultiVector':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` override the saved lengths, device..."""
        from transformers import AutoTokenizer
        settings = json.loads((Path(path) / SETTINGS_FILE).read_text())
        lengths = {k: settings[k] for k in ('doc_max_length', 'query_max_length') if k in settings}
        return cls(MultiVectorModel.from_pretrained(path), AutoTokenizer.from_pretrained(str(path)),
                   name=str(path), **{**lengths, **kwargs})

    def save_pretrained(self, path):
        """Backbone HF folder + tokenizer + ``projection.safetensors`` + ``multivector.json`` (with the lengths)."""
        path = Path(path)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(str(path))
        settings = {**self.model.settings, 'doc_max_length': self.doc_max_length,
                    'query_max_length': self.query_max_length}
        _write_atomic(path / SETTINGS_FILE, lambda tmp: tmp.write_text(json.dumps(settings, indent=1)))
        # An unnamed encoder is now loadable from here (stores record it); a named one keeps its name, since
        # other stores may already refer to it.
        self.name = self.name or str(path)

    @torch.inference_mode()
    def embed(self, texts: Sequence, query: bool = False, verbose: bool = False) -> Tuple[np.ndarray, np.ndarray]:
        """Token embeddings of ``texts``: ``(vectors, offsets)``, float32 ``n x dim`` rows grouped by text in input
        order, text ``i`` owning ``vectors[offsets[i]:offsets[i + 1]]`` (no rows for blank texts).  Texts are
        length-sorted and padded per batch, so a result does not depend on the other texts of the batch."""
        max_length = self.query_max_length if query else self.doc_max_length
        per_text: List[np.ndarray] = [np.zeros((0, self.dim), np.float32)] * len(texts)
        with autocast(self.device, self.precision):
            for batch in length_sorted_batches(self.tokenizer, texts, self.batch_size, max_length, self.device,
                                               verbose, 'embedding'):
                emb, mask = self.model(batch.input_ids, batch.attention_mask)
                emb, mask = emb.float().cpu().numpy(), mask.cpu().numpy()
                for row, i in enumerate(batch.positions):
                    per_text[i] = emb[row][mask[row]]
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in per_text])]).astype(np.int64)
        return np.concatenate(per_text) if len(texts) else np.zeros((0, self.dim), np.float32), offsets

    def scorer(self, text_field: str = 'text') -> 'MaxSimScorer':
        """Re-ranks ``qid, query, docno, text`` by exact MaxSim, encoding the documents' texts."""
        return MaxSimScorer(self, text_field)

    def indexer(self, path, overwrite: bool = False, verbose: bool = True) -> 'MaxSimIndexer':
        return MaxSimIndexer(path, self, overwrite=overwrite, verbose=verbose)

    def __repr__(self):
        return f'MultiVector({self.name or "<model>"!r}, dim={self.dim})'


def segment_max(sims: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per-document max of token-major similarities: ``sims`` (tokens x Lq), ``lengths`` (documents) -> documents x Lq;
    a document without tokens gets 0."""
    out = torch.segment_reduce(sims, 'max', lengths=lengths, axis=0, unsafe=True)
    return out.masked_fill_((lengths == 0)[:, None], 0.)


def maxsim_rows(query: torch.Tensor, vectors: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """MaxSim of one query (Lq x dim) against documents given as consecutive token rows (``lengths`` per document)."""
    return segment_max(vectors @ query.T, lengths).sum(-1)


def _result_frame(rows: List[dict], inp: pd.DataFrame) -> pd.DataFrame:
    """A ranked ``qid, docno, score, rank`` frame keeping the input's query columns (empty input: empty output)."""
    columns = [c for c in inp.columns if c not in ('docno', 'score', 'rank')]
    if not rows:
        return pd.DataFrame({**{c: pd.Series(dtype=inp[c].dtype) for c in columns}, 'docno': pd.Series(dtype=str),
                             'score': pd.Series(dtype=float), 'rank': pd.Series(dtype=int)})
    res = pd.DataFrame(rows).merge(inp[columns], on='qid')
    return pt.model.add_ranks(res.sort_values(['qid', 'score'], ascending=[True, False], kind='stable'))


def _query_embeddings(encoder: MultiVector, queries: Sequence[str]) -> Dict[str, torch.Tensor]:
    vectors, offsets = encoder.embed(queries, query=True)
    vectors = torch.from_numpy(vectors)
    return {q: vectors[offsets[i]:offsets[i + 1]] for i, q in enumerate(queries)}


class MaxSimScorer(pt.Transformer):
    """Re-ranks ``qid, query, docno, <text_field>`` by exact MaxSim of freshly encoded queries and documents."""

    def __init__(self, encoder: MultiVector, text_field: str = 'text'):
        self.encoder = encoder
        self.text_field = text_field

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.result_frame(inp, extra_columns=['query', self.text_field])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        texts = inp[self.text_field].fillna('').astype(str)
        unique = texts.unique().tolist()
        vectors, offsets = self.encoder.embed(unique)
        vectors, lengths = torch.from_numpy(vectors), torch.from_numpy(np.diff(offsets))
        row_of = {t: i for i, t in enumerate(unique)}
        queries = _query_embeddings(self.encoder, inp['query'].fillna('').astype(str).unique().tolist())
        scores = np.zeros(len(inp))
        for query, idx in inp.groupby(inp['query'].fillna('').astype(str)).indices.items():
            docs = [row_of[t] for t in texts.iloc[idx]]
            sub, sub_lengths = _gather(vectors, offsets, lengths, np.asarray(docs))
            scores[idx] = maxsim_rows(queries[query], sub, sub_lengths).numpy()
        return pt.model.add_ranks(inp.assign(score=scores))


def _gather(vectors: torch.Tensor, offsets: np.ndarray, lengths: torch.Tensor, docs: np.ndarray):
    """The token rows of ``docs`` (internal ids, any order, repeats allowed), consecutive, and their lengths."""
    sub_lengths = lengths[torch.from_numpy(docs)]
    counts = sub_lengths.numpy()
    starts = np.repeat(offsets[docs], counts)
    within = np.arange(len(starts)) - np.repeat(np.cumsum(counts) - counts, counts)
    return vectors[torch.from_numpy(starts + within)], sub_lengths


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
        vectors, offsets = self.encoder.embed([d[self.text_field] for d in docs], verbose=self.verbose)
        return MaxSimIndex.write(self.path, [str(d['docno']) for d in docs], vectors, offsets, self.encoder,
                                 overwrite=self.overwrite)


class MaxSimIndex:
    """A store of documents' token embeddings: brute-force MaxSim retrieval, MaxSim re-ranking by docno, and the
    k-means (PLAID-style) candidate generation of the clustering baseline.

    Args:
        path: the folder (see the module docs).
        encoder: the :class:`MultiVector` that encoded the documents (it encodes queries); when omitted, the folder
            recorded at indexing time is loaded.
    """

    def __init__(self, path, encoder: Optional[MultiVector] = None):
        self.path = Path(path)
        if not (self.path / STORE_FILE).exists():
            raise FileNotFoundError(f'no MaxSim store at {self.path} (missing {STORE_FILE})')
        self.meta = json.loads((self.path / STORE_FILE).read_text())
        self.docnos: List[str] = json.loads((self.path / 'docnos.json').read_text())
        self.offsets = np.load(self.path / 'offsets.npy')
        self.lengths = torch.from_numpy(np.diff(self.offsets))
        self._vectors = None
        self._docids = None
        self._encoder = encoder

    @classmethod
    def write(cls, path, docnos: Sequence[str], vectors: np.ndarray, offsets: np.ndarray,
              encoder: Optional[MultiVector] = None, overwrite: bool = False) -> 'MaxSimIndex':
        """Writes a store from embeddings already computed (e.g. :meth:`MultiVector.embed` of a corpus)."""
        path = Path(path)
        if path.exists() and any(path.iterdir()):
            if not overwrite:
                raise FileExistsError(f'{path} already exists; pass overwrite=True to replace it')
            shutil.rmtree(path)
        if len(offsets) != len(docnos) + 1 or offsets[-1] != len(vectors):
            raise ValueError(f'{len(docnos)} docnos, {len(offsets)} offsets and {len(vectors)} vectors do not match')
        if any('\n' in d for d in docnos):
            raise ValueError('docnos must not contain newlines')
        path.mkdir(parents=True, exist_ok=True)
        _save_npy(path / 'vectors.npy', np.asarray(vectors, dtype=np.float16))
        _save_npy(path / 'offsets.npy', np.asarray(offsets, dtype=np.int64))
        _write_atomic(path / 'docnos.json', lambda tmp: tmp.write_text(json.dumps(list(docnos))))
        meta = {'num_docs': len(docnos), 'num_tokens': int(offsets[-1]), 'dim': int(vectors.shape[1]),
                'model': getattr(encoder, 'name', None)}
        # Written last: its presence marks a complete store.
        _write_atomic(path / STORE_FILE, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))
        return cls(path, encoder)

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def __len__(self):
        return self.num_docs()

    @property
    def vectors(self) -> torch.Tensor:
        if self._vectors is None:
            self._vectors = torch.from_numpy(np.load(self.path / 'vectors.npy').astype(np.float32))
        return self._vectors

    @property
    def docids(self) -> Dict[str, int]:
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
        sub, lengths = _gather(self.vectors, self.offsets, self.lengths, np.asarray(docs, dtype=np.int64))
        return maxsim_rows(query, sub, lengths)

    def retriever(self, num_results: int = 1000) -> pt.Transformer:
        """Brute-force exact MaxSim over every document: ``qid, query`` -> ranked ``docno, score``."""
        return _Retriever(self, lambda q: self._top(self.score_all(q), None, num_results))

    def scorer(self) -> pt.Transformer:
        """Re-ranks ``qid, query, docno`` (docnos of this store) by exact MaxSim from the stored vectors."""
        return _StoredScorer(self)

    def rescore(self, frame: pd.DataFrame, keys: pd.Series, queries: Dict[str, torch.Tensor]) -> pd.DataFrame:
        """``frame`` (with ``qid``, ``docno`` of this store) scored by exact MaxSim and ranked; row ``i``'s query
        embeddings are ``queries[keys[i]]`` (keys: query texts, or qids when the embeddings are at hand)."""
        docids = self.docids
        missing = set(frame['docno']) - docids.keys()
        if missing:
            raise KeyError(f'{len(missing)} docnos are not in {self.path}, e.g. {sorted(missing)[:3]}')
        scores = np.zeros(len(frame))
        for key, idx in frame.groupby(keys.values).indices.items():
            docs = np.array([docids[d] for d in frame['docno'].iloc[idx]], dtype=np.int64)
            scores[idx] = self.score_docs(queries[key], docs).numpy()
        return pt.model.add_ranks(frame.assign(score=scores))

    def _top(self, scores: torch.Tensor, docs: Optional[np.ndarray], k: int) -> List[Tuple[str, float]]:
        top = scores.topk(min(k, len(scores)))
        ids = top.indices.numpy() if docs is None else docs[top.indices.numpy()]
        return [(self.docnos[i], s) for i, s in zip(ids.tolist(), top.values.tolist())]

    # -- clustering baseline --------------------------------------------------------------------------------------

    def build_ivf(self, n_centroids: Optional[int] = None, niter: int = 4, seed: int = 0,
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
        folder = self.path / IVF_FOLDER
        folder.mkdir(exist_ok=True)
        _save_npy(folder / 'centroids.npy', kmeans.centroids.astype(np.float32))
        _save_npy(folder / 'codes.npy', codes[:, 0].astype(np.int32))
        return {'kmeans_s': trained - start, 'assign_s': assigned - trained, 'n_centroids': k}

    def ivf_retriever(self, ncells: int = 2, ndocs: int = 1024, num_results: int = 1000) -> pt.Transformer:
        """The clustering baseline, PLAID-style: each query token probes its ``ncells`` nearest centroids; documents
        with a token in a probed cell are candidates; candidates are ranked by centroid interaction (MaxSim with each
        document token replaced by its centroid) and the top ``ndocs`` by exact MaxSim.  Defaults are ColBERTv2's
        search settings for k=100 (without its centroid-score threshold)."""
        ivf = _Ivf(self)
        return _Retriever(self, lambda q: ivf.search(q, ncells, ndocs, num_results))

    def __repr__(self):
        return f'MaxSimIndex({str(self.path)!r})'


class _Ivf:
    def __init__(self, index: MaxSimIndex):
        folder = index.path / IVF_FOLDER
        self.index = index
        self.centroids = torch.from_numpy(np.load(folder / 'centroids.npy'))
        self.codes = torch.from_numpy(np.load(folder / 'codes.npy').astype(np.int64))
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
            rows, lengths = _gather(self.codes[:, None], index.offsets, index.lengths, docs)
            approx = segment_max(centroid_scores.T[rows[:, 0]], lengths).sum(-1)
            docs = docs[approx.topk(ndocs).indices.numpy()]
        return index._top(index.score_docs(query, docs), docs, k)


class _Retriever(pt.Transformer):
    def __init__(self, index: MaxSimIndex, search):
        self.index = index
        self.search = search

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.query_frame(inp, extra_columns=['query'])
        queries = _query_embeddings(self.index.encoder, inp['query'].fillna('').astype(str).unique().tolist())
        rows = []
        for qid, query in zip(inp['qid'], inp['query'].fillna('').astype(str)):
            if len(queries[query]):
                rows.extend({'qid': qid, 'docno': d, 'score': s} for d, s in self.search(queries[query]))
        return _result_frame(rows, inp)


class _StoredScorer(pt.Transformer):
    def __init__(self, index: MaxSimIndex):
        self.index = index

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.result_frame(inp, extra_columns=['query'])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        query_col = inp['query'].fillna('').astype(str)
        return self.index.rescore(inp, query_col, _query_embeddings(self.index.encoder, query_col.unique().tolist()))
