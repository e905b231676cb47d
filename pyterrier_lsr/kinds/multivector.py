"""The multi-vector (ColBERT-style) encoder: token embeddings of texts, and an exact MaxSim re-ranker over them.

A :class:`MultiVector` is not a :class:`~pyterrier_lsr.kinds.base.SparseModel` (it gives dense token vectors, not
``{term: weight}``): as a PyTerrier transformer it is its MaxSim scorer (a ``qid, query, docno, text`` frame is
re-ranked), and ``MaxSimIndex(path, model).indexer()`` embeds the documents with it;
:mod:`pyterrier_lsr.kinds.ssr` reads its token vectors through a sparse autoencoder.
"""
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import torch

from ..core import storage
from ..core.checks import check_int, check_max_length, check_result_frame
from ..core.encoding import as_texts, autocast, length_sorted_batches, resolve_device, resolve_precision
from ..core.folders import local_folder
from ..core.model_files import load_tokenizer
from ..core.quiet import quiet_transformers
from ..models.multivector import SETTINGS_FILE, MultiVectorModel
from ..models.sae_splade import structural_token_ids
from .base import MODEL_ARTIFACT


class MultiVector(pt.Transformer):
    """A :class:`~pyterrier_lsr.models.multivector.MultiVectorModel` and its tokenizer: token embeddings of texts and
    an exact MaxSim scorer (also as the encoder's own transformer); ``MaxSimIndex(path, model).indexer()`` indexes
    with it.

    Args:
        model, tokenizer: the encoder and its HF tokenizer.
        device, batch_size, precision: as for :class:`~pyterrier_lsr.Splade`.
        max_length, query_max_length: truncation lengths (special tokens included) of documents and queries
            (default 256 and 32, or the tokenizer's ``model_max_length`` when smaller; at most that).

    Example::

        encoder = MultiVector.from_pretrained("path/to/multivector")
        store = MaxSimIndex("vaswani.maxsim", encoder).index(corpus)
        (bm25 % 100 >> pt.text.get_text(dataset, "text") >> encoder).search("radio waves")   # exact MaxSim re-ranking
    """

    def __init__(self, model: MultiVectorModel, tokenizer, device=None, max_length: int | None = None,
                 query_max_length: int | None = None, batch_size: int = 32, precision: str | None = None,
                 name: str | None = None):
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.max_length = check_max_length('max_length', max_length, tokenizer, 256)
        self.query_max_length = check_max_length('query_max_length', query_max_length, tokenizer, 32)
        self.batch_size = check_int('batch_size', batch_size, 1)
        self.precision = resolve_precision(precision, self.device)
        self.name = name

    @property
    def dim(self) -> int:
        return self.model.dim

    @classmethod
    def from_backbone(cls, backbone: str = 'all-MiniLM-L6-v2', dim: int = 128, seed: int = 0,
                      **kwargs) -> 'MultiVector':
        """A new (untrained) encoder: an HF ``AutoModel`` (offline names resolve, see :mod:`pyterrier_lsr.core.offline`)
        with an orthogonally initialised ``hidden -> dim`` projection."""
        from ..models.features import load_dense
        dense, tokenizer = load_dense(local_folder(backbone))
        model = MultiVectorModel(dense, dim, structural_token_ids(tokenizer), seed=seed)
        return cls(model, tokenizer, **kwargs)

    @classmethod
    def from_pretrained(cls, name_or_path, **kwargs) -> 'MultiVector':
        """Loads a folder written by :meth:`save_pretrained` (or an offline or hub name of one, resolved as for every
        model kind); ``kwargs`` override the saved lengths, device..."""
        folder = local_folder(name_or_path)
        settings = storage.read_json(folder / SETTINGS_FILE, 'multi-vector settings')
        lengths = {k: settings[k] for k in ('max_length', 'query_max_length') if k in settings}
        return cls(MultiVectorModel.from_pretrained(folder), load_tokenizer(folder),
                   name=str(name_or_path), **{**lengths, **kwargs})

    def save_pretrained(self, path, overwrite: bool = True) -> Path:
        """Writes the folder atomically, replacing only a model folder of ours (as every model kind does); the
        encoder keeps its name."""
        with storage.build_folder(path, MODEL_ARTIFACT, overwrite=overwrite, what='model folder') as tmp, \
                quiet_transformers():
            self.write_folder(tmp)
        return Path(path)

    def write_folder(self, folder: Path):
        """Backbone HF folder + tokenizer + ``projection.safetensors`` + ``multivector.json`` (with the lengths)."""
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(str(folder))
        settings = {**self.model.settings, 'max_length': self.max_length,
                    'query_max_length': self.query_max_length}
        storage.write_json(Path(folder) / SETTINGS_FILE, settings)

    @torch.inference_mode()
    def embed(self, texts: Sequence, query: bool = False, verbose: bool = False,
              batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token embeddings of ``texts``: ``(vectors, offsets)``, float32 ``n x dim`` rows grouped by text in input
        order, text ``i`` owning ``vectors[offsets[i]:offsets[i + 1]]`` (no rows for blank texts).  Texts are
        length-sorted and padded per batch (``batch_size`` texts, default the encoder's): a result depends on the other
        texts of its batch only through the padding, in the last bits of its floats (measured: within 1e-3 after an
        SAE, tests/test_stores.py)."""
        max_length = self.query_max_length if query else self.max_length
        batch_size = self.batch_size if batch_size is None else check_int('batch_size', batch_size, 1)
        per_text: list[np.ndarray] = [np.zeros((0, self.dim), np.float32)] * len(texts)
        with autocast(self.device, self.precision):
            for batch in length_sorted_batches(self.tokenizer, texts, batch_size, max_length, self.device,
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

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """The encoder as its MaxSim scorer (:meth:`scorer`)."""
        return self.scorer()(inp)

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



def query_embeddings(encoder: MultiVector, queries: Sequence[str]) -> dict[str, torch.Tensor]:
    vectors, offsets = encoder.embed(queries, query=True)
    vectors = torch.from_numpy(vectors)
    return {q: vectors[offsets[i]:offsets[i + 1]] for i, q in enumerate(queries)}


class MaxSimScorer(pt.Transformer):
    """Re-ranks ``qid, query, docno, <text_field>`` by exact MaxSim of freshly encoded queries and documents."""

    def __init__(self, encoder: MultiVector, text_field: str = 'text'):
        self.encoder = encoder
        self.text_field = text_field

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query', self.text_field])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        texts = pd.Series(as_texts(inp[self.text_field], f'column {self.text_field!r}'), index=inp.index)
        unique = texts.unique().tolist()
        vectors, offsets = self.encoder.embed(unique)
        vectors, lengths = torch.from_numpy(vectors), torch.from_numpy(np.diff(offsets))
        row_of = {t: i for i, t in enumerate(unique)}
        query_texts = pd.Series(as_texts(inp['query'], 'column "query"'), index=inp.index)
        queries = query_embeddings(self.encoder, query_texts.unique().tolist())
        scores = np.zeros(len(inp))
        for query, idx in inp.groupby(query_texts).indices.items():
            docs = [row_of[t] for t in texts.iloc[idx]]
            sub, sub_lengths = gather_rows(vectors, offsets, lengths, np.asarray(docs))
            scores[idx] = maxsim_rows(queries[query], sub, sub_lengths).numpy()
        return pt.model.add_ranks(inp.assign(score=scores))

    def subtransformers(self) -> dict:
        return {'encoder': self.encoder}

    def __repr__(self):
        return f'{self.encoder!r}.scorer'


def gather_rows(vectors: torch.Tensor, offsets: np.ndarray, lengths: torch.Tensor, docs: np.ndarray):
    """The token rows of ``docs`` (internal ids, any order, repeats allowed), consecutive, and their lengths."""
    sub_lengths = lengths[torch.from_numpy(docs)]
    counts = sub_lengths.numpy()
    starts = np.repeat(offsets[docs], counts)
    within = np.arange(len(starts)) - np.repeat(np.cumsum(counts) - counts, counts)
    return vectors[torch.from_numpy(starts + within)], sub_lengths

