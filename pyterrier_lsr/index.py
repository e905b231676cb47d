"""PISA glue: the one quantization convention, the indexer and the index object.

Quantization convention (the only place a scale is applied)
-----------------------------------------------------------
Encoders emit float weights in the model's own units (SPLADE: ``log(1 + relu(logit))``, roughly 0-5).
An index has one ``scale`` (default 100), stored in its ``lsr.json``:

* document impact  = ``int(weight * scale)``; terms whose impact is 0 are not indexed;
* query weight     = ``int(weight * scale)`` (PISA repeats a query term that many times);
* score            = ``sum_t int(q_t * scale) * int(d_t * scale)``, i.e. ``scale**2`` times the dot product
  up to rounding.

Encoders never scale; the indexer and the retrievers read the same ``scale``.

PISA lowercases query terms (pre-tokenized ones too), so a term with uppercase letters (cased vocabularies) is stored
and queried in an escaped form (:func:`pisa_term`); lowercase terms are stored as they are.  A document whose vector is
empty (or quantizes to nothing) is still indexed, with no postings, so it keeps its docno and the index's
document count equals the input's; it is simply never retrieved.
"""
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable

import more_itertools
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
from tqdm.auto import tqdm

META_FILE = 'lsr.json'
DF_FILE = 'df.json'


def quantize(vector: Dict[str, float], scale: float) -> Dict[str, int]:
    """``{term: int(weight * scale)}`` without the zeros, exactly as PISA stores document impacts."""
    out = {}
    for term, weight in vector.items():
        impact = int(weight * scale)
        if impact > 0:
            out[term] = impact
    return out


def pisa_term(term: str) -> str:
    """The form of ``term`` PISA stores: each uppercase letter becomes ``^`` + its lowercase and ``^`` becomes ``^^``,
    so distinct terms stay distinct after PISA lowercases queries."""
    if '^' not in term and not any(c.isupper() for c in term):
        return term
    return ''.join('^^' if c == '^' else '^' + c.lower() if c.isupper() else c for c in term)


class _PisaQueryTerms(pt.Transformer):
    """Maps ``query_toks`` keys to :func:`pisa_term` (a no-op for lowercase vocabularies)."""

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.columns(inp, includes=['query_toks'])
        return inp.assign(query_toks=[{pisa_term(t): w for t, w in q.items()} if isinstance(q, dict) else q
                                      for q in inp['query_toks']])


class LsrIndex:
    """A PISA index of sparse vectors written by :class:`SpladeIndexer`; hands out matching retrievers.

    Args:
        path: the index folder.
        encoder: the model that encoded the documents (e.g. a :class:`~pyterrier_lsr.Splade`); when omitted,
            :meth:`retriever` reloads the model recorded at indexing time.
    """

    def __init__(self, path, encoder=None):
        self.path = Path(path)
        if not (self.path / META_FILE).exists():
            raise FileNotFoundError(f'no pyterrier-lsr index at {self.path} (missing {META_FILE})')
        self.meta = json.loads((self.path / META_FILE).read_text())
        self.encoder = encoder

    @property
    def scale(self) -> float:
        return self.meta['scale']

    def pisa(self):
        import pyterrier_pisa
        return pyterrier_pisa.PisaIndex(str(self.path), stemmer='none', stops='none')

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def __len__(self):
        return self.num_docs()

    def document_frequencies(self) -> Dict[str, int]:
        """Number of documents in which each term has a non-zero (quantized) impact."""
        return json.loads((self.path / DF_FILE).read_text())

    def toks_retriever(self, num_results: int = 1000, threads: int = 1, verbose: bool = False, **kwargs) -> pt.Transformer:
        """PISA dot-product retrieval for frames that already carry ``query_toks`` (floats, unscaled)."""
        return _PisaQueryTerms() >> self.pisa().quantized(num_results=num_results, threads=threads, verbose=verbose,
                                                          toks_scale=self.scale, **kwargs)

    def model(self):
        """The document encoder: the one given, or the model recorded at indexing time."""
        if self.encoder is None:
            if not self.meta.get('model'):
                raise ValueError(f'{self.path} records no model; pass encoder= to LsrIndex')
            from .inference_free import load_model
            self.encoder = load_model(self.meta['model'])
        return self.encoder

    def retriever(self, num_results: int = 1000, **kwargs) -> pt.Transformer:
        """``model.query_encoder() >> toks_retriever()``: end-to-end retrieval from ``query`` text."""
        return self.model().query_encoder() >> self.toks_retriever(num_results=num_results, **kwargs)

    def __repr__(self):
        return f'LsrIndex({str(self.path)!r})'


class SpladeIndexer(pt.Indexer):
    """Encodes documents (when given an encoder) and writes a PISA index of their sparse vectors.

    Args:
        path: index folder to create.
        encoder: anything with ``encode(texts) -> [{term: weight}]`` (a :class:`~pyterrier_lsr.Splade`, a
            doc encoder...). Without one, input documents must carry ``toks`` already
            (e.g. ``(splade.doc_encoder() >> SpladeIndexer(path)).index(corpus)``).
        scale: quantization scale, see the module docs. Stored with the index.
        overwrite: replace an existing index at ``path`` instead of raising ``FileExistsError``.
        text_field: the document text column to encode.
        batch_size: documents encoded per call (the encoder sorts each such chunk by length).
        verbose: progress bar over documents.
    """

    def __init__(self, path, encoder=None, scale: float = 100., overwrite: bool = False, text_field: str = 'text',
                 batch_size: int = 4096, verbose: bool = True):
        if scale <= 0:
            raise ValueError(f'scale must be > 0, got {scale}')
        self.path = Path(path)
        self.encoder = encoder
        self.scale = float(scale)
        self.overwrite = overwrite
        self.text_field = text_field
        self.batch_size = batch_size
        self.verbose = verbose

    def index_inputs(self):
        return [['docno', self.text_field]] if self.encoder is not None else [['docno', 'toks']]

    def _vectors(self, docs: Iterable[dict]):
        field = self.text_field if self.encoder is not None else 'toks'
        for chunk in more_itertools.chunked(docs, self.batch_size):
            for doc in chunk:
                if 'docno' not in doc or field not in doc:
                    missing = [c for c in ('docno', field) if c not in doc]
                    raise KeyError(f'documents must have columns {missing}; got {sorted(doc)}')
            if self.encoder is not None:
                vectors = self.encoder.encode([doc[field] for doc in chunk])
            else:
                vectors = [doc['toks'] if isinstance(doc['toks'], dict) else {} for doc in chunk]
            for doc, vec in zip(chunk, vectors):
                yield str(doc['docno']), vec

    def index(self, it: Iterable[dict]) -> LsrIndex:
        import pyterrier_pisa
        if self.path.exists() and any(self.path.iterdir()):
            if not self.overwrite:
                raise FileExistsError(f'{self.path} already exists; pass overwrite=True to replace it')
            shutil.rmtree(self.path)
        total = len(it) if hasattr(it, '__len__') else None
        df, count = Counter(), 0

        def docs():
            nonlocal count
            with tqdm(total=total, desc=f'indexing {self.path.name}', unit='doc', disable=not self.verbose) as pbar:
                for docno, vec in self._vectors(it):
                    impacts = quantize(vec, self.scale)
                    for term in impacts.keys() - df.keys():
                        if not term or any(c.isspace() for c in term):
                            raise ValueError(f'term {term!r} of document {docno!r} is empty or contains whitespace, '
                                             'which PISA cannot store')
                    df.update(impacts.keys())
                    count += 1
                    pbar.update(1)
                    # Impacts are already integers, so PISA's own int(w * 1) keeps them as they are.
                    yield {'docno': docno, 'toks': {pisa_term(t): w for t, w in impacts.items()}}

        pisa = pyterrier_pisa.PisaIndex(str(self.path), stemmer='none')
        try:
            pisa.toks_indexer(mode='overwrite', scale=1.).index(docs())
        except (IndexError, UnboundLocalError) as ex:
            if count == 0:
                raise ValueError('cannot index an empty collection') from ex
            raise
        if pisa.num_docs() != count:
            raise RuntimeError(f'PISA indexed {pisa.num_docs()} documents out of {count}')
        model = getattr(self.encoder, 'splade', self.encoder)  # a doc encoder's model serves the queries too
        (self.path / DF_FILE).write_text(json.dumps(df))
        (self.path / META_FILE).write_text(json.dumps(
            {'scale': self.scale, 'num_docs': count, 'model': getattr(model, 'name', None)}, indent=1))
        return LsrIndex(self.path, model)
