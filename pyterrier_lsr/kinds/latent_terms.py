"""Latent Terms: a frozen dense retriever's embeddings through a TopK SAE, latents indexed as terms, BM25 in PISA.

A text's term frequencies are its SAE latent activations: of its mean-pooled, normalised embedding
(``mode='single'``) or summed over its normalised token embeddings (``mode='multi'``), optionally square-rooted.
Terms are named ``l<latent id>`` (lowercase, so they are stored as they are: PISA lowercases query terms and the
indexer escapes uppercase ones).  Queries are encoded the same way; their values weight each term's BM25
contribution.  A Latent Terms index records BM25 scoring (with the model's ``k1``, ``b``), so
``LsrIndex(path).retriever()`` retrieves with it like any other index.

BM25 under the index's quantization
-----------------------------------
The index stores ``int(tf * s)`` (``s`` = the index scale), and PISA's document length is the sum of a
document's stored TFs, so lengths are scaled by ``s`` too and ``dl / avgdl`` is unchanged.  The saturation
term ``s·tf / (s·tf + k1' (1 - b + b dl/avgdl))`` then equals ``tf / (tf + (k1'/s)(...))``: PISA's ``k1'`` acts
as ``k1'/s`` on float TFs.  The index's PISA engine therefore passes ``k1' = k1 * s``, so ``k1`` keeps its
meaning on the float scale.  PISA also multiplies each idf by ``(1 + k1')``, a constant factor over all
terms, so rankings are those of float BM25 with ``k1`` (scores are ``(1 + k1 s) / (1 + k1)`` times larger), up to
the rounding of TFs.  PISA's idf is ``max(1e-6, log((N - df + 0.5) / (df + 0.5)))``: a latent in more than half of
the documents contributes (almost) nothing.  Query weights: PISA repeats a query term ``int(w * s)`` times
(weighted mode), i.e. multiplies its contribution by ``w`` up to rounding; weights below ``1/s`` are dropped.
"""
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from ..core import arrays, storage
from ..core.checks import check_bool, check_choice, check_float, check_str
from ..core.encoding import autocast, length_sorted_batches, to_dicts
from ..core.folders import CONFIG_FILE, CONFIG_KEY, kind_settings, local_folder
from ..core.offline import offline_name
from ..models.features import MODES, DenseFeatures, LatentTermsModel, load_dense, st_max_length, st_pooling
from ..models.sae import SAEConfig, SparseAutoencoder, latent_term_names
from .splade import TorchSparseModel

SAE_FOLDER = 'sae'
DENSE_FOLDER = 'dense'
KIND = 'latent-terms'
DEFAULT_MAX_LENGTH = 256  # for a dense model whose folder declares no max_seq_length
CHECKPOINT_BATCHES = 20  # an interrupted embedding pass loses at most this many batches
# the marked kind of an embedding cache folder (Latent Terms', SAE-SPLADE's token states, the dense baseline's),
# which may also be a domain adaptation's cache (see storage.SHARED_CACHES)
CACHE_KIND = storage.EMBEDDINGS_CACHE

__all__ = ['LatentTerms', 'cache_key', 'cached_embeddings', 'claim_cache', 'MODES']


class LatentTerms(TorchSparseModel):
    """A dense bi-encoder + a trained SAE, through the shared torch-model wrapper (encoders, scorer), with BM25
    scoring recorded in its indexes.

    Args:
        dense: name or folder of the dense model (HF ``AutoModel``, e.g. a sentence-transformers folder, whose
            declared pooling, mean or CLS, ``single`` mode follows), e.g. ``'all-MiniLM-L6-v2'`` or
            ``'all-mpnet-base-v2'`` (offline, see :mod:`pyterrier_lsr.core.offline`; their hub names too).
        sae: a trained :class:`~pyterrier_lsr.models.sae.SparseAutoencoder` over this model's vectors in this mode
            (``None``: embedding only, see :func:`~pyterrier_lsr.train.build_latent_terms`).
        mode: ``'single'`` (mean-pooled text embedding) or ``'multi'`` (token embeddings, latents summed).
        sqrt_tf: square-root the summed activations (the replication's term frequencies).
        k1, b: BM25 parameters its indexes score with (``k1`` on the float TF scale).
        max_length: texts are truncated to this many tokens (special tokens included); ``None``: the length the
            dense model's sentence-transformers folder declares (its authors' setting: 256 for all-MiniLM-L6-v2, 384
            for all-mpnet-base-v2), 256 for a folder declaring none.
        device, batch_size, precision, name: as for :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel`.
        include_dense: whether a saved folder holds a copy of the dense model under ``dense/`` (self-contained);
            by default it does unless the dense model is an offline short name (which resolves to an installed
            package anywhere), so a folder never depends on a relative path or the network.

    Raises:
        ValueError: an unknown ``mode``, an SAE over vectors of another dimension, ``precision='int8'`` (no int8
            path), or encoding before an SAE is set.
        FileNotFoundError: a ``dense`` name that resolves to no folder.

    Example::

        index = latent_terms_index("vaswani.latent.lsr", corpus)   # pyterrier_lsr.systems: the measured settings
        lt = index.model()                                         # this class, with its SAE
        lt.encode(["radio waves"])                                 # [{'l812': 1.9, 'l77': 1.4, ...}]
        index.retriever().search("radio waves")                    # BM25 over latent term frequencies
    """
    kind = KIND
    display = 'Latent Terms'
    terms_namespace = 'latent'

    def __init__(self, dense: str = 'all-MiniLM-L6-v2', sae: SparseAutoencoder | None = None, mode: str = 'single',
                 sqrt_tf: bool = False, k1: float = 1.5, b: float = 0.75, device=None, max_length: int | None = None,
                 batch_size: int = 32, precision: str | None = None, name: str | None = None,
                 include_dense: bool | None = None):
        check_choice('mode', mode, MODES)
        k1, b = check_float('k1', k1, 0), check_float('b', b, 0, 1)
        check_bool('sqrt_tf', sqrt_tf)  # a string such as 'no' would count as True
        if include_dense is not None:
            check_bool('include_dense', include_dense)
        self.include_dense = include_dense
        self.dense_name = str(dense)
        folder = local_folder(self.dense_name)
        model, tokenizer = load_dense(folder)
        # a hub snapshot or folder without sentence-transformers files pools by the mean and truncates at 256
        if max_length is None:
            max_length = st_max_length(folder) or DEFAULT_MAX_LENGTH
        super().__init__(None, tokenizer, device, max_length, batch_size, precision, name or self.dense_name)
        pooling = st_pooling(folder)
        self.features = DenseFeatures(model, mode, pooling=pooling).to(self.device).eval()
        self.mode, self.sqrt_tf, self.k1, self.b = mode, sqrt_tf, float(k1), float(b)
        self.sae = None
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
    def scoring(self) -> dict:
        return {'kind': 'bm25', 'k1': self.k1, 'b': self.b}

    def _includes_dense(self) -> bool:
        return self.include_dense if self.include_dense is not None else not offline_name(self.dense_name)

    def settings(self) -> dict:
        """``lsr`` in ``config.json``: kind, dense model, mode, sqrt_tf, max_length, k1, b."""
        return dict(super().settings(), dense=DENSE_FOLDER if self._includes_dense() else self.dense_name,
                    mode=self.mode, sqrt_tf=self.sqrt_tf, max_length=self.max_length, k1=self.k1, b=self.b)

    def write_folder(self, folder: Path):
        """The SAE under ``sae/`` and, when included, the dense model under ``dense/``."""
        self._check_model()
        if self._includes_dense():
            self.features.dense.save_pretrained(folder / DENSE_FOLDER)
            self.tokenizer.save_pretrained(folder / DENSE_FOLDER)
        self.sae.save_pretrained(folder / SAE_FOLDER)

    @classmethod
    def example(cls) -> 'LatentTerms':
        """all-MiniLM-L6-v2 (an offline checkpoint) and a random SAE of 64 latents (k = 4) over its token vectors."""
        return cls('all-MiniLM-L6-v2', SparseAutoencoder(SAEConfig(d_in=384, n_latents=64, k=4, seed=1)),
                   mode='multi', device='cpu', batch_size=2)

    @classmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'LatentTerms':
        """Loads a folder written by :meth:`save_pretrained`; ``kwargs`` (device, batch_size...) override settings."""
        known = ('dense', 'mode', 'sqrt_tf', 'max_length', 'k1', 'b')
        settings = kind_settings(folder, KIND, known, 'a Latent Terms')
        settings = {k: settings[k] for k in known}
        check_str(f'{folder}/{CONFIG_FILE}: {CONFIG_KEY}.dense', settings['dense'])
        if settings['dense'] == DENSE_FOLDER:
            settings['dense'] = str(folder / DENSE_FOLDER)
        settings.update(kwargs)
        return cls(sae=SparseAutoencoder.from_pretrained(folder / SAE_FOLDER), **settings)

    @torch.inference_mode()
    def embed(self, texts: Sequence, path=None, verbose: bool = False, pooled_path=None):
        """The SAE's input vectors of ``texts``: ``(vectors, offsets)``, text ``i`` owning rows
        ``offsets[i]:offsets[i + 1]`` (none for blank texts).  With ``path`` the vectors are written there as a
        ``.npy`` memmap (token vectors of a corpus can outgrow memory) and the pass is resumable: every
        :data:`CHECKPOINT_BATCHES` batches the file is flushed and ``<path>.progress.json`` records the batches
        done, so a later call with the same texts and settings continues where an interrupted one stopped.
        ``pooled_path`` (``multi`` mode, with ``path``): the same pass also writes there the vectors a ``single``-mode
        sibling embeds (one row per non-blank text, in text order), so the dense base costs no second pass."""
        if pooled_path is not None and (self.mode != 'multi' or path is None):
            raise ValueError("pooled_path needs mode='multi' and a path")
        batches = list(length_sorted_batches(self.tokenizer, texts, self.batch_size, self.max_length, self.device))
        counts = np.zeros(len(texts), dtype=np.int64)
        for batch in batches:
            counts[batch.positions] = (self.features.token_mask(batch.input_ids, batch.attention_mask).sum(1).cpu()
                                       .numpy() if self.mode == 'multi' else 1)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        shape = (int(offsets[-1]), self.features.dim)
        progress = Path(f'{path}.progress.json') if path else None
        run = {'key': cache_key(self, texts), 'batch_size': self.batch_size, 'rows': shape[0],
               'pooled': pooled_path is not None}
        done = 0
        if path and progress.is_file() and Path(path).is_file():
            saved = storage.read_json(progress, 'the embedding progress')
            if {k: saved.get(k) for k in run} == run:
                done = int(saved.get('batches', 0))
        vectors = _array(path, shape, resume=done > 0)
        pooled_row = np.cumsum(counts > 0) - 1  # a text's row among the non-blank ones
        pooled = _array(pooled_path, (int((counts > 0).sum()), self.features.dim), done > 0) if pooled_path else None
        with autocast(self.device, self.precision), \
                tqdm(total=sum(len(b.positions) for b in batches), desc='embedding', unit='text',
                     disable=not verbose, initial=sum(len(b.positions) for b in batches[:done])) as pbar:
            for number, batch in enumerate(batches[done:], done + 1):
                out, _, *pooled_out = self.features(batch.input_ids, batch.attention_mask, pooled=pooled is not None)
                out, row = out.float().cpu().numpy(), 0
                for text in batch.positions:  # rows come grouped by text, in batch order
                    vectors[offsets[text]:offsets[text + 1]] = out[row:row + counts[text]]
                    row += counts[text]
                if pooled is not None:
                    pooled[pooled_row[batch.positions]] = pooled_out[0].float().cpu().numpy()
                pbar.update(len(batch.positions))
                if path and (number % CHECKPOINT_BATCHES == 0 or number == len(batches)):
                    for array in (vectors, pooled):  # the vectors reach the files before the progress counting them
                        if array is not None:
                            array.flush()
                    storage.write_json(progress, dict(run, batches=number))
        return vectors, offsets

    @torch.inference_mode()
    def encode_vectors(self, vectors: np.ndarray, offsets: np.ndarray, batch_size: int = 256,
                       verbose: bool = False) -> Iterable[dict[str, float]]:
        """Like :meth:`encode` from the vectors :meth:`embed` returned (no transformer pass); yields one dict per
        text."""
        self._check_model()
        n = len(offsets) - 1
        for start in tqdm(range(0, n, batch_size), desc='latents', unit='batch', disable=not verbose):
            stop = min(start + batch_size, n)
            rows = torch.tensor(np.asarray(vectors[offsets[start]:offsets[stop]]), device=self.device)
            counts = torch.from_numpy(np.diff(offsets[start:stop + 1]))
            owner = torch.repeat_interleave(torch.arange(stop - start), counts)
            yield from to_dicts(self.model.pool(rows, owner.to(self.device), stop - start), self.terms)

    def _check_model(self):
        if self.model is None:
            raise ValueError('this LatentTerms has no SAE yet (train one with build_latent_terms or set_sae)')

    def __repr__(self):
        return f'LatentTerms({self.dense_name!r}, mode={self.mode!r}, sqrt_tf={self.sqrt_tf})'


def _array(path, shape, resume: bool) -> np.ndarray:
    """A float32 array to fill: in memory, a new ``.npy`` memmap at ``path``, or (``resume``) the one there; on disk
    its blocks are allocated first (:func:`~pyterrier_lsr.core.arrays.array_file`), so a full disk is an ``OSError``
    before any work, not a crash in the middle of it."""
    return np.empty(shape, np.float32) if path is None else arrays.array_file(path, shape, np.float32, resume)


def cache_key(latent_terms: LatentTerms, texts: Sequence, mode: str | None = None) -> str:
    """Identifies the embeddings of ``texts`` by dense model, mode (``mode`` overrides the model's), max_length,
    precision and the texts themselves."""
    lt, mode = latent_terms, mode or latent_terms.mode
    settings = {'dense': lt.dense_name, 'mode': mode, 'max_length': lt.max_length, 'precision': lt.precision}
    digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode())
    for text in texts:
        digest.update(b'\0' + str(text).encode())
    return f'{Path(latent_terms.dense_name).name}.{mode}.{digest.hexdigest()[:16]}'


def claim_cache(cache_dir) -> Path:
    """``cache_dir`` as an embedding cache of ours (see :func:`pyterrier_lsr.core.storage.claim_folder`), before any
    work:
    a user's folder is refused (its files are never replaced or removed), naming ``cache_dir``."""
    try:
        return storage.claim_folder(cache_dir, CACHE_KIND, 'embedding cache')
    except FileExistsError as ex:
        raise FileExistsError(f'cache_dir: {ex}') from None


def cached_embeddings(latent_terms: LatentTerms, texts: Sequence, cache_dir, verbose: bool = True):
    """:meth:`LatentTerms.embed` of ``texts``, stored as ``<key>.vectors.npy`` + ``<key>.offsets.npy`` in
    ``cache_dir`` (a folder of ours, see :func:`claim_cache`) and memory-mapped from there on later calls; an
    interrupted pass resumes (see :meth:`embed`).  A ``multi``-mode pass stores the ``single``-mode (pooled)
    embeddings of the same texts too, from the same pass."""
    cache_dir = claim_cache(cache_dir)

    def files(mode):
        key = cache_key(latent_terms, texts, mode)
        return tuple(cache_dir / f'{key}.{part}.npy' for part in ('vectors', 'offsets', 'vectors.partial'))
    vectors_path, offsets_path, partial = files(latent_terms.mode)
    if not offsets_path.exists():  # written last, so its presence means the vectors are complete
        pooled = files('single') if latent_terms.mode == 'multi' else None
        pooled = pooled if pooled and not pooled[1].exists() else None
        # resumed by a later call if this one is interrupted
        vectors, offsets = latent_terms.embed(texts, path=partial, verbose=verbose,
                                              pooled_path=pooled[2] if pooled else None)
        del vectors  # the memmap is closed before its file moves
        if pooled:
            storage.move_file(pooled[2], pooled[0])
            storage.write_array(pooled[1], np.concatenate([[0], np.cumsum(np.diff(offsets) > 0)]))
        storage.move_file(partial, vectors_path)
        storage.write_array(offsets_path, offsets)
        storage.remove_temporary(f'{partial}.progress.json')
    return np.load(vectors_path, mmap_mode='r'), np.load(offsets_path)
