"""PyTerrier transformers that add sparse vectors (``toks`` / ``query_toks``) to frames, and the SPLADE factory."""
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta

from .encoding import as_text, encode_texts, resolve_device, resolve_precision, vocabulary_terms
from .loading import update_settings
from .models.splade import ModelLoadError, SpladeModel
from .offline import resolve_model


class SparseTextEncoder(pt.Transformer):
    """Adds ``out_field`` = ``{term: weight}`` encoded from ``text_field``.

    Subclasses implement :meth:`encode`. Weights are floats in the model's own units; quantization to
    integers happens once, in the index (see :mod:`pyterrier_lsr.index`).
    """
    text_field = 'text'
    out_field = 'toks'

    def encode(self, texts: Sequence) -> List[Dict[str, float]]:
        raise NotImplementedError

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.columns(inp, includes=[self.text_field])
        texts = inp[self.text_field].tolist()
        return inp.assign(**{self.out_field: self.encode(texts) if texts else pd.Series(dtype=object)})

    def __rshift__(self, other):
        if self.out_field == 'toks':
            other = with_model(getattr(self, 'splade', None), other)
        return super().__rshift__(other)


def with_model(model, other):
    """A doc encoder hands its model to a following indexer, so that the index records (and reloads) it."""
    if model is not None and callable(getattr(other, 'with_model', None)):
        return other.with_model(model)
    return other


class SpladeEncoder(SparseTextEncoder):
    """Encodes a text column with a :class:`Splade` model (made by ``Splade.doc_encoder()/query_encoder()``)."""

    def __init__(self, splade: 'Splade', text_field: str, out_field: str, batch_size: int, verbose: bool):
        self.splade = splade
        self.text_field = text_field
        self.out_field = out_field
        self.batch_size = batch_size
        self.verbose = verbose

    def encode(self, texts: Sequence) -> List[Dict[str, float]]:
        return self.splade.encode(texts, batch_size=self.batch_size, verbose=self.verbose, desc=self.out_field)

    def __repr__(self):
        side = 'query' if self.out_field == 'query_toks' else 'doc'
        return f'{self.splade!r}.{side}'


def sparse_dot(query: Dict[str, float], doc: Dict[str, float]) -> float:
    if len(doc) < len(query):
        query, doc = doc, query
    return sum(w * doc.get(t, 0.) for t, w in query.items())


class SparseScorer(pt.Transformer):
    """Re-ranks ``qid, query, docno, text`` frames by the exact (float) dot product of the sparse vectors."""

    def __init__(self, query_encoder: SparseTextEncoder, doc_encoder: SparseTextEncoder):
        self.query_encoder = query_encoder
        self.doc_encoder = doc_encoder

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.result_frame(inp, extra_columns=['query', self.doc_encoder.text_field])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        # Missing texts become '' (encoded as empty vectors) so that they can key the caches below.
        query_col = [as_text(q, i) for i, q in enumerate(inp['query'])]
        text_col = [as_text(t, i) for i, t in enumerate(inp[self.doc_encoder.text_field])]
        queries, texts = list(dict.fromkeys(query_col)), list(dict.fromkeys(text_col))
        qvecs = dict(zip(queries, self.query_encoder.encode(queries)))
        dvecs = dict(zip(texts, self.doc_encoder.encode(texts)))
        scores = [sparse_dot(qvecs[q], dvecs[d]) for q, d in zip(query_col, text_col)]
        return pt.model.add_ranks(inp.assign(score=scores))


def check_tokenizer(tokenizer, vocab_size: int, where='the model') -> None:
    """Raises :class:`ModelLoadError` unless the tokenizer's ids fit a head over ``vocab_size`` terms and cover at
    least half of them. Heads may have a few unused rows (vocabularies padded to a multiple of 64 or 128), but a
    tokenizer with ids beyond the head cannot be encoded, and one far smaller (a folder whose tokenizer files are
    missing gives a 5-token tokenizer mapping every word to [UNK]) belongs to another model."""
    size = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    if size > vocab_size or size < vocab_size // 2:
        raise ModelLoadError(f'{where}: the tokenizer has {size} token ids but the MLM head scores {vocab_size} terms; '
                             'the tokenizer files are missing or belong to another model')


class Splade(pt.Transformer):
    """A SPLADE model and its tokenizer; hands out PyTerrier encoders and a scorer.

    As a transformer itself (like pyterrier_dr's bi-encoders) it re-ranks a frame with ``query`` and ``text``
    (:meth:`scorer`), and otherwise adds ``query_toks`` from ``query`` or ``toks`` from ``text``.

    The shared wrapper of every model kind (SPLADE, inference-free, SAE-SPLADE, Latent Terms): a kind sets ``kind``
    (recorded in its saved ``config.json``, read by :func:`~pyterrier_lsr.load_model`) and ``scoring`` (how its
    indexes score: ``{'kind': 'dot'}`` or BM25 over term frequencies), and wraps a model mapping
    ``(input_ids, attention_mask)`` to batch x terms weights.

    Args:
        model: a :class:`SpladeModel`, or any module mapping ``(input_ids, attention_mask)`` to batch x terms
            weights; a model with a ``terms`` attribute (e.g. SAE-SPLADE's latent ids) names its own terms.
        tokenizer: its HF tokenizer.
        device: ``'cpu'``, ``'cuda'``...; default: CUDA when available.
        max_length: texts are truncated to this many tokens, special tokens included (default 256,
            SPLADE's training length; queries are far shorter).
        batch_size: texts per forward pass.
        precision: ``'fp32'``, ``'bf16'`` or ``'fp16'`` autocast; default fp32 on CPU, bf16 (or fp16) on GPU.
            bf16 on a CPU with AMX is about 2-3x faster, with slightly different weights.
    """

    kind = 'splade'
    scoring = {'kind': 'dot'}

    def __init__(self, model: Optional[SpladeModel], tokenizer, device=None, max_length: int = 256,
                 batch_size: int = 32, precision: Optional[str] = None, name: Optional[str] = None):
        if max_length < 1 or batch_size < 1:
            raise ValueError(f'max_length and batch_size must be >= 1, got {max_length} and {batch_size}')
        self.device = resolve_device(device)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.precision = resolve_precision(precision, self.device)
        self.name = name
        self.model = self.terms = None
        if model is not None:
            self.model = model.to(self.device).eval()
            # Models with their own vocabulary (latent ids, ...) name their terms; SPLADE's terms are the tokenizer's.
            self.terms = getattr(model, 'terms', None) or vocabulary_terms(tokenizer, model.vocab_size)

    @classmethod
    def from_pretrained(cls, name_or_path: str, new_head: bool = False, **kwargs) -> 'Splade':
        """Loads any HF ``AutoModelForMaskedLM`` checkpoint (hub name or local folder) as a SPLADE model.

        Refuses (:class:`~pyterrier_lsr.models.splade.ModelLoadError`) a checkpoint without MLM head unless
        ``new_head=True``, invalid ``lsr`` settings, and a tokenizer that does not fit the head (see
        :func:`check_tokenizer`). ``kwargs`` go to :class:`Splade` (device, max_length, batch_size, precision).
        """
        from transformers import AutoTokenizer
        folder = resolve_model(str(name_or_path))  # offline short names ('splade-tiny') work everywhere
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = SpladeModel.from_pretrained(folder, special_token_ids=tokenizer.all_special_ids, new_head=new_head)
        check_tokenizer(tokenizer, model.vocab_size, name_or_path)
        return cls(model, tokenizer, name=str(name_or_path), **kwargs)

    @classmethod
    def from_encoder(cls, name_or_path: str, **kwargs) -> 'Splade':
        """SPLADE on an encoder without MLM head (e.g. ``'all-MiniLM-L6-v2'``) with a deliberately initialised new
        head (:func:`~pyterrier_lsr.models.heads.splade_from_encoder`: decoder tied to the input embeddings, identity
        transform, zero bias), and its tokenizer; ``kwargs`` go to :class:`Splade`.  Calibrate it with
        :func:`~pyterrier_lsr.models.heads.calibrate_activation` before training (such a head starts dense)."""
        from transformers import AutoTokenizer

        from .models.heads import splade_from_encoder
        folder = resolve_model(str(name_or_path))
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = splade_from_encoder(folder, tokenizer.all_special_ids)
        check_tokenizer(tokenizer, model.vocab_size, name_or_path)
        return cls(model, tokenizer, name=str(name_or_path), **kwargs)

    def save_pretrained(self, path: str):
        """Writes an ordinary HF folder (weights, tokenizer, config with our settings under ``lsr``, ``kind``
        included)."""
        self._check_model()
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        update_settings(path, kind=self.kind)

    def _check_model(self):
        if self.model is None:
            raise ValueError(f'{self!r} has no model yet')

    def encode(self, texts: Sequence, batch_size: Optional[int] = None, verbose: bool = False,
               desc: str = 'encoding') -> List[Dict[str, float]]:
        """Encodes texts to ``{term: weight}`` dicts; None/NaN/blank texts give ``{}``."""
        self._check_model()
        return encode_texts(self.model, self.tokenizer, texts, self.terms, batch_size=batch_size or self.batch_size,
                            max_length=self.max_length, device=self.device, precision=self.precision,
                            verbose=verbose, desc=desc)

    def doc_encoder(self, text_field: str = 'text', batch_size: Optional[int] = None,
                    verbose: bool = False) -> SpladeEncoder:
        """Transformer adding ``toks`` from ``text_field``."""
        return SpladeEncoder(self, text_field, 'toks', batch_size, verbose)

    def query_encoder(self, batch_size: Optional[int] = None, verbose: bool = False) -> SpladeEncoder:
        """Transformer adding ``query_toks`` from ``query``."""
        return SpladeEncoder(self, 'query', 'query_toks', batch_size, verbose)

    def scorer(self, text_field: str = 'text', batch_size: Optional[int] = None) -> SparseScorer:
        """Transformer re-ranking ``qid, query, docno, text`` by the exact dot product."""
        return SparseScorer(self.query_encoder(batch_size), self.doc_encoder(text_field, batch_size))

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        with pta.validate.any(inp) as v:
            v.result_frame(extra_columns=['query', 'text'], mode='scorer')
            v.columns(includes=['query'], mode='query_encoder')
            v.columns(includes=['text'], mode='doc_encoder')
        return getattr(self, v.mode)()(inp)

    def __rshift__(self, other):
        return super().__rshift__(with_model(self, other))

    def __repr__(self):
        name = Path(str(self.name)).name if self.name else '<model>'
        return f'{type(self).__name__}({name!r})'
