"""Latent Terms: a frozen dense retriever's embeddings through a TopK SAE, latents indexed as terms, BM25 in PISA.

A text's term frequencies are its SAE latent activations: of its mean-pooled, normalised embedding
(``mode='single'``) or summed over its normalised token embeddings (``mode='multi'``), optionally square-rooted.
Terms are named ``l<latent id>`` (lowercase, so they are stored as they are: PISA lowercases query terms and the
indexer escapes uppercase ones).  Queries are encoded the same way; their values weight each term's BM25
contribution.

BM25 under the index's quantization
-----------------------------------
The index stores ``int(tf * s)`` (``s`` = the index scale), and PISA's document length is the sum of a
document's stored TFs, so lengths are scaled by ``s`` too and ``dl / avgdl`` is unchanged.  The saturation
term ``s·tf / (s·tf + k1' (1 - b + b dl/avgdl))`` then equals ``tf / (tf + (k1'/s)(...))``: PISA's ``k1'`` acts
as ``k1'/s`` on float TFs.  :meth:`LatentTerms.retriever` therefore passes ``k1' = k1 * s``, so ``k1`` keeps its
meaning on the float scale.  PISA also multiplies each idf by ``(1 + k1')``, a constant factor over all
terms, so rankings are those of float BM25 with ``k1`` (scores are ``(1 + k1 s) / (1 + k1)`` times larger), up to
the rounding of TFs.  PISA's idf is ``max(1e-6, log((N - df + 0.5) / (df + 0.5)))``: a latent in more than half of
the documents contributes (almost) nothing.  Query weights: PISA repeats a query term ``int(w * s)`` times
(weighted mode), i.e. multiplies its contribution by ``w`` up to rounding; weights below ``1/s`` are dropped.
"""
import hashlib
import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import pyterrier as pt
import torch
from torch import nn
from tqdm.auto import tqdm

from .encoders import SpladeEncoder
from .encoding import autocast, encode_texts, is_blank, resolve_device, resolve_precision, to_dicts
from .index import LsrIndex, SpladeIndexer
from .models.sae import SAEConfig, SparseAutoencoder, latent_term_names, train_sae
from .offline import resolve_model

SETTINGS_FILE = 'latent_terms.json'
SAE_FOLDER = 'sae'
DENSE_FOLDER = 'dense'
MODES = ('single', 'multi')


class DenseFeatures(nn.Module):
    """The SAE's inputs from an HF encoder: one mean-pooled vector per text (``single``) or one per token
    (``multi``), L2-normalised so the SAE sees directions, not norms.

    Positions holding ``skip_ids`` (e.g. ``[CLS]``/``[SEP]``) give no vector and take no part in the mean.
    ``frozen=False`` keeps the encoder trainable (SAE-SPLADE fine-tunes it; Latent Terms never does).
    Returns ``(vectors, owner)``: ``n x dim`` vectors, grouped by text in batch order, and each one's text index.
    """

    def __init__(self, dense: nn.Module, mode: str = 'single', skip_ids: Sequence[int] = (), frozen: bool = True):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
        self.dense = dense.requires_grad_(False) if frozen else dense
        self.mode = mode
        self.register_buffer('skip_ids', torch.tensor(sorted(set(skip_ids)), dtype=torch.long), persistent=False)

    @property
    def dim(self) -> int:
        return self.dense.config.hidden_size

    def token_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The positions that give vectors: non-padding, not in ``skip_ids``."""
        mask = attention_mask.bool()
        return mask & ~torch.isin(input_ids, self.skip_ids) if len(self.skip_ids) else mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        hidden = self.dense(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
        mask = self.token_mask(input_ids, attention_mask)
        if self.mode == 'multi':
            owner = torch.arange(len(mask), device=mask.device)[:, None].expand_as(mask)[mask]
            vectors = hidden[mask]
        else:
            weights = mask[..., None].float()
            vectors = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
            owner = torch.arange(len(mask), device=mask.device)
        return nn.functional.normalize(vectors, dim=-1), owner


class LatentTermsModel(nn.Module):
    """``(input_ids, attention_mask)`` -> ``batch x n_latents`` term frequencies, for :func:`encode_texts`."""

    def __init__(self, features: DenseFeatures, sae: SparseAutoencoder, sqrt_tf: bool = False):
        super().__init__()
        self.features = features
        self.sae = sae
        self.sqrt_tf = sqrt_tf

    def pool(self, vectors: torch.Tensor, owner: torch.Tensor, n_texts: int) -> torch.Tensor:
        """Sums each text's latent activations (its term frequencies)."""
        z = self.sae.encode(vectors.float())
        tf = z.new_zeros(n_texts, z.shape[-1]).index_add_(0, owner, z)
        return tf.sqrt() if self.sqrt_tf else tf

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        vectors, owner = self.features(input_ids, attention_mask)
        return self.pool(vectors, owner, len(input_ids))


def load_dense(name_or_path: str):
    """An HF encoder and its tokenizer; offline names (see :mod:`pyterrier_lsr.offline`) resolve to their folders."""
    from transformers import AutoModel, AutoTokenizer
    folder = resolve_model(str(name_or_path))
    return AutoModel.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


class LatentTerms:
    """A dense bi-encoder + a trained SAE; hands out PyTerrier encoders, an indexer and a BM25 retriever.

    Args:
        dense: name or folder of the dense model (HF ``AutoModel``), e.g. ``'all-MiniLM-L6-v2'`` (offline).
        sae: a trained :class:`~pyterrier_lsr.models.sae.SparseAutoencoder` over this model's vectors in this mode
            (``None``: embedding only, see :func:`build_latent_terms`).
        mode: ``'single'`` (mean-pooled text embedding) or ``'multi'`` (token embeddings, latents summed).
        sqrt_tf: square-root the summed activations (the replication's term frequencies).
        device, max_length, batch_size, precision: as for :class:`~pyterrier_lsr.Splade`.
    """

    def __init__(self, dense: str = 'all-MiniLM-L6-v2', sae: Optional[SparseAutoencoder] = None, mode: str = 'single',
                 sqrt_tf: bool = False, device=None, max_length: int = 256, batch_size: int = 32,
                 precision: Optional[str] = None):
        self.dense_name = str(dense)
        model, self.tokenizer = load_dense(self.dense_name)
        self.device = resolve_device(device)
        self.features = DenseFeatures(model, mode).to(self.device).eval()
        self.mode = mode
        self.sqrt_tf = sqrt_tf
        self.max_length = max_length
        self.batch_size = batch_size
        self.precision = resolve_precision(precision, self.device)
        self.sae = self.model = None
        if sae is not None:
            self.set_sae(sae)

    def set_sae(self, sae: SparseAutoencoder):
        if sae.config.d_in != self.features.dim:
            raise ValueError(f'the SAE reads {sae.config.d_in}-d vectors, the dense model gives {self.features.dim}-d')
        self.sae = sae.to(self.device).eval()
        # Built in eval mode: encode_texts restores the mode it finds, and a train-mode model would turn the
        # dense model's dropout on for everything after the first encode.
        self.model = LatentTermsModel(self.features, self.sae, self.sqrt_tf).eval()
        self.terms = latent_term_names(sae.n_latents)

    @property
    def settings(self) -> dict:
        return {'dense': self.dense_name, 'mode': self.mode, 'sqrt_tf': self.sqrt_tf, 'max_length': self.max_length}

    def save_pretrained(self, path, include_dense: bool = False):
        """Writes ``latent_terms.json`` (dense model name, mode, sqrt_tf, max_length) and the SAE under ``sae/``;
        with ``include_dense`` a copy of the dense model goes under ``dense/`` and the folder is self-contained."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        settings = self.settings
        if include_dense:
            self.features.dense.save_pretrained(path / DENSE_FOLDER)
            self.tokenizer.save_pretrained(path / DENSE_FOLDER)
            settings['dense'] = DENSE_FOLDER
        self.sae.save_pretrained(path / SAE_FOLDER)
        (path / SETTINGS_FILE).write_text(json.dumps(settings, indent=1))

    @classmethod
    def from_pretrained(cls, path, **kwargs) -> 'LatentTerms':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` (device, batch_size...) override settings."""
        path = Path(path)
        settings = json.loads((path / SETTINGS_FILE).read_text())
        if settings['dense'] == DENSE_FOLDER:
            settings['dense'] = str(path / DENSE_FOLDER)
        settings.update(kwargs)
        return cls(sae=SparseAutoencoder.from_pretrained(path / SAE_FOLDER), **settings)

    def _check_sae(self):
        if self.model is None:
            raise ValueError('this LatentTerms has no SAE yet (train one with build_latent_terms or set_sae)')

    def encode(self, texts: Sequence, batch_size: Optional[int] = None, verbose: bool = False,
               desc: str = 'encoding') -> List[Dict[str, float]]:
        """Texts to ``{'l<id>': tf}`` dicts; None/NaN/blank texts give ``{}``."""
        self._check_sae()
        return encode_texts(self.model, self.tokenizer, texts, self.terms, batch_size=batch_size or self.batch_size,
                            max_length=self.max_length, device=self.device, precision=self.precision,
                            verbose=verbose, desc=desc)

    @torch.inference_mode()
    def embed(self, texts: Sequence, path=None, verbose: bool = False):
        """The SAE's input vectors of ``texts``: ``(vectors, offsets)``, text ``i`` owning rows
        ``offsets[i]:offsets[i + 1]`` (none for blank texts).  With ``path`` the vectors are written there as a
        ``.npy`` memmap (token vectors of a corpus can outgrow memory)."""
        todo = [i for i, text in enumerate(texts) if not is_blank(text)]
        input_ids = self.tokenizer([str(texts[i]) for i in todo], truncation=True, max_length=self.max_length,
                                   return_attention_mask=False)['input_ids'] if todo else []
        counts = np.zeros(len(texts), dtype=np.int64)
        counts[todo] = [len(ids) for ids in input_ids] if self.mode == 'multi' else 1
        offsets = np.concatenate([[0], np.cumsum(counts)])
        shape = (int(offsets[-1]), self.features.dim)
        vectors = np.lib.format.open_memmap(str(path), 'w+', np.float32, shape) if path else np.empty(shape, np.float32)
        order = sorted(range(len(todo)), key=lambda j: len(input_ids[j]), reverse=True)
        with autocast(self.device, self.precision), \
                tqdm(total=len(order), desc='embedding', unit='text', disable=not verbose) as pbar:
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                padded = self.tokenizer.pad({'input_ids': [input_ids[j] for j in batch]}, return_tensors='pt')
                out, _ = self.features(padded['input_ids'].to(self.device), padded['attention_mask'].to(self.device))
                out, row = out.float().cpu().numpy(), 0
                for j in batch:  # rows come grouped by text, in batch order
                    text = todo[j]
                    vectors[offsets[text]:offsets[text + 1]] = out[row:row + counts[text]]
                    row += counts[text]
                pbar.update(len(batch))
        if path:
            vectors.flush()
        return vectors, offsets

    @torch.inference_mode()
    def encode_vectors(self, vectors: np.ndarray, offsets: np.ndarray, texts_per_batch: int = 256,
                       verbose: bool = False) -> Iterable[Dict[str, float]]:
        """Like :meth:`encode` from the vectors :meth:`embed` returned (no transformer pass); yields one dict per text."""
        self._check_sae()
        n = len(offsets) - 1
        for start in tqdm(range(0, n, texts_per_batch), desc='latents', unit='batch', disable=not verbose):
            stop = min(start + texts_per_batch, n)
            rows = torch.tensor(np.asarray(vectors[offsets[start]:offsets[stop]]), device=self.device)
            owner = torch.repeat_interleave(torch.arange(stop - start), torch.from_numpy(np.diff(offsets[start:stop + 1])))
            yield from to_dicts(self.model.pool(rows, owner.to(self.device), stop - start), self.terms)

    def doc_encoder(self, text_field: str = 'text', batch_size: Optional[int] = None, verbose: bool = False) -> SpladeEncoder:
        """Transformer adding ``toks`` from ``text_field``."""
        return SpladeEncoder(self, text_field, 'toks', batch_size, verbose)

    def query_encoder(self, batch_size: Optional[int] = None, verbose: bool = False) -> SpladeEncoder:
        """Transformer adding ``query_toks`` from ``query``."""
        return SpladeEncoder(self, 'query', 'query_toks', batch_size, verbose)

    def indexer(self, path, scale: float = 100., **kwargs) -> SpladeIndexer:
        """A :class:`~pyterrier_lsr.SpladeIndexer` encoding documents with this model (``kwargs``: overwrite, verbose...)."""
        self._check_sae()
        return SpladeIndexer(path, self, scale=scale, **kwargs)

    def retriever(self, index, k1: float = 1.5, b: float = 0.75, num_results: int = 1000, threads: int = 1,
                  verbose: bool = False) -> pt.Transformer:
        """``query_encoder() >> BM25`` over the latent TFs of ``index`` (an :class:`~pyterrier_lsr.LsrIndex` or its
        path); ``k1`` is on the float TF scale (PISA gets ``k1 * scale``, see the module docs)."""
        return self.query_encoder() >> bm25(index, k1, b, num_results, threads, verbose)

    def __repr__(self):
        return f'LatentTerms({self.dense_name!r}, mode={self.mode!r}, sqrt_tf={self.sqrt_tf})'


def bm25(index, k1: float = 1.5, b: float = 0.75, num_results: int = 1000, threads: int = 1,
         verbose: bool = False) -> pt.Transformer:
    """PISA BM25 for ``query_toks`` frames over an :class:`~pyterrier_lsr.LsrIndex` of float TFs quantized by its scale;
    ``k1`` is on the float scale and query weights multiply the terms' contributions (see the module docs)."""
    index = index if isinstance(index, LsrIndex) else LsrIndex(index)
    return index.pisa().bm25(k1=k1 * index.scale, b=b, num_results=num_results, threads=threads, verbose=verbose,
                             query_weighted=True, toks_scale=index.scale)


def cache_key(latent_terms: LatentTerms, texts: Sequence) -> str:
    """Identifies the embeddings of ``texts`` by dense model, mode, max_length, precision and the texts themselves."""
    lt = latent_terms
    settings = {'dense': lt.dense_name, 'mode': lt.mode, 'max_length': lt.max_length, 'precision': lt.precision}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode())
    for text in texts:
        digest.update(b'\0' + str(text).encode())
    return f'{Path(latent_terms.dense_name).name}.{latent_terms.mode}.{digest.hexdigest()[:16]}'


def cached_embeddings(latent_terms: LatentTerms, texts: Sequence, cache_dir, verbose: bool = True):
    """:meth:`LatentTerms.embed` of ``texts``, stored as ``<key>.vectors.npy`` + ``<key>.offsets.npy`` in
    ``cache_dir`` and memory-mapped from there on later calls."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = cache_key(latent_terms, texts)
    vectors_path, offsets_path = cache_dir / f'{key}.vectors.npy', cache_dir / f'{key}.offsets.npy'
    if not offsets_path.exists():  # written last, so its presence means the vectors are complete
        partial = cache_dir / f'{key}.vectors.partial.npy'
        _, offsets = latent_terms.embed(texts, path=partial, verbose=verbose)
        partial.rename(vectors_path)
        np.save(offsets_path, offsets)
    return np.load(vectors_path, mmap_mode='r'), np.load(offsets_path)


def build_latent_terms(docs: Iterable[dict], index_path, dense: str = 'all-MiniLM-L6-v2', mode: str = 'single',
                       sae: Optional[dict] = None, sqrt_tf: bool = False, cache_dir='latent_cache',
                       max_train_vectors: Optional[int] = 200_000, scale: float = 100., overwrite: bool = False,
                       text_field: str = 'text', verbose: bool = True, **latent_terms_kwargs):
    """Corpus -> frozen-model embeddings (cached) -> SAE training -> PISA index, in one call.

    Args:
        docs: dicts with ``docno`` and ``text_field`` (read once, kept in memory).
        sae: :class:`~pyterrier_lsr.models.sae.SAEConfig` settings (``d_in`` comes from the dense model).
        max_train_vectors: the SAE trains on a seeded random sample of at most this many vectors.
        cache_dir: embeddings are cached here per (model, mode, max_length, corpus); another SAE setting reuses them.
        latent_terms_kwargs: device, batch_size, max_length, precision for :class:`LatentTerms`.

    Documents are indexed from the cached vectors, without a second transformer pass.
    Returns ``(latent_terms, index, log)``, ``log`` being the SAE training log.
    """
    docs = [(str(doc['docno']), doc[text_field]) for doc in docs]
    latent_terms = LatentTerms(dense, mode=mode, sqrt_tf=sqrt_tf, **latent_terms_kwargs)
    model, log, vectors, offsets = train_latent_sae(latent_terms, [text for _, text in docs], sae, cache_dir,
                                                    max_train_vectors, verbose)
    latent_terms.set_sae(model)
    toks = latent_terms.encode_vectors(vectors, offsets)
    index = SpladeIndexer(index_path, scale=scale, overwrite=overwrite, verbose=verbose).index(
        {'docno': docno, 'toks': vec} for (docno, _), vec in zip(docs, toks))
    return latent_terms, index, log


def train_latent_sae(latent_terms: LatentTerms, texts: Sequence, sae: Optional[dict] = None, cache_dir='latent_cache',
                     max_train_vectors: Optional[int] = 200_000, verbose: bool = True):
    """Stage 1 shared by Latent Terms and SAE-SPLADE: ``latent_terms``'s (frozen) vectors of ``texts`` (cached in
    ``cache_dir``), then a TopK SAE (``sae``: :class:`~pyterrier_lsr.models.sae.SAEConfig` settings, ``d_in`` from the
    model) trained on a seeded random sample of at most ``max_train_vectors`` of them.

    Returns ``(sae, log, vectors, offsets)``: the trained SAE, its training log and the cached vectors (see
    :meth:`LatentTerms.embed`).
    """
    vectors, offsets = cached_embeddings(latent_terms, texts, cache_dir, verbose)
    config = SAEConfig(d_in=latent_terms.features.dim, **(sae or {}))
    train = vectors
    if max_train_vectors is not None and len(vectors) > max_train_vectors:
        rows = np.random.default_rng(config.seed).choice(len(vectors), max_train_vectors, replace=False)
        train = vectors[np.sort(rows)]
    model, log = train_sae(train, config, device=latent_terms.device, verbose=verbose)
    return model, log, vectors, offsets
