"""The index artifact: an encoded corpus (engine-neutral vectors), the engines built from it, and its model.

An index folder holds

* ``pt_meta.json``: the artifact type and format (``sparse_index`` / ``lsr``), so ``pt.Artifact.load(path)`` and the
  artifact sharing routes (``to_hf``/``from_hf``, packages) know it;
* ``lsr.json``: ``scale``, ``num_docs``, ``scoring`` (``{"kind": "dot"}``, or ``{"kind": "bm25", "k1", "b"}`` for
  term-frequency models such as Latent Terms), the model, the engines built, and the size of every file written at
  build time (checked on open, so a truncated or missing file is a clear error instead of a crash);
* ``vectors/``: the documents' float vectors (:mod:`.vectors`), ``df.json``: document frequencies of quantized terms;
* ``model/``: a copy of the model that encoded the documents, so the index reloads it from any directory, in any
  process, without the network and without ever picking up other weights;
* the engines' files: PISA's at the root, others in their own subfolder (see :mod:`.engines`).

Writes are atomic and guarded: an index is built in a temporary sibling folder and moved into place only when complete;
``overwrite`` replaces only a folder that is a pyterrier-lsr index (or empty), and a failed rebuild leaves the old
index as it was; a lock file next to the folder makes a concurrent writer fail with a clear error.
"""
import fcntl
import json
import os
import shutil
import uuid
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

import more_itertools
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
from tqdm.auto import tqdm

from ..checks import check_docno, check_int, check_vector
from ..loading import load_model
from ..quiet import quiet_native
from .engines import get_engine
from .quantization import quantize
from .vectors import VectorStore, VectorWriter, write_json_atomic

META_FILE = 'lsr.json'
DF_FILE = 'df.json'
VECTORS_FOLDER = 'vectors'
MODEL_FOLDER = 'model'
PT_META_FILE = 'pt_meta.json'
FORMAT_VERSION = 2

__all__ = ['LsrIndex', 'SpladeIndexer']


def is_lsr_index(path) -> bool:
    path = Path(path)
    if (path / PT_META_FILE).is_file():
        try:
            meta = json.loads((path / PT_META_FILE).read_text())
        except ValueError:
            return False
        return meta.get('type') == LsrIndex.ARTIFACT_TYPE and meta.get('format') == LsrIndex.ARTIFACT_FORMAT
    return (path / META_FILE).is_file()


def _file_sizes(folder: Path) -> Dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob('*')) if p.is_file()}


@contextmanager
def _write_lock(path: Path):
    """An exclusive, non-blocking lock on ``.<name>.lock`` next to ``path``: a second writer fails at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f'.{path.name}.lock', 'w') as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f'another process is writing {path}; wait for it to finish') from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def atomic_folder(path: Path, overwrite: bool, what: str = 'index'):
    """Yields a temporary sibling of ``path`` to fill; moves it to ``path`` when the block succeeds, removes it when
    it fails. An existing ``path`` is replaced only with ``overwrite`` and only if it is empty or an index."""
    path = Path(path).absolute()
    with _write_lock(path):
        if path.exists() and not path.is_dir():
            raise FileExistsError(f'{path} exists and is not a folder')
        existing = path.exists() and any(path.iterdir())
        if existing and not overwrite:
            raise FileExistsError(f'{path} already exists; pass overwrite=True to replace it (or reuse it: '
                                  'LsrIndex(path).built())')
        if existing and not is_lsr_index(path):
            raise FileExistsError(f'{path} is not a pyterrier-lsr {what} (no {PT_META_FILE}/{META_FILE}); '
                                  'refusing to replace it: choose another path or remove it yourself')
        tmp = path.parent / f'.{path.name}.building-{uuid.uuid4().hex[:8]}'
        tmp.mkdir()
        try:
            yield tmp
            if path.exists():
                old = path.parent / f'.{path.name}.old-{uuid.uuid4().hex[:8]}'
                os.rename(path, old)
                os.rename(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, path)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


class LsrIndex(pta.Artifact, pt.Indexer):
    """A learned-sparse index: stored vectors + engines + the model; a PyTerrier artifact and indexer.

    Args:
        path: the index folder.
        model: the model that encodes queries (and, when indexing text, documents): any model of the project
            (:class:`~pyterrier_lsr.Splade`, :class:`~pyterrier_lsr.LatentTerms`, ...). Default: the copy stored in
            the index.
        scale: quantization scale for a new index (see :mod:`.quantization`); an existing index keeps its own.
        engines: engines to build with a new index (more can be added later with :meth:`build_engine`).
        overwrite: let :meth:`index` replace an existing index at ``path`` (never any other folder).
        save_model: store a copy of ``model`` in the index (so it retrieves on its own); ``False`` for throw-away
            indexes (the returned object still knows the model).
        scoring: how a new index scores, when the model does not say (``{'kind': 'dot'}`` or
            ``{'kind': 'bm25', 'k1': ..., 'b': ...}`` for term-frequency vectors).
        text_field, batch_size, verbose: for :meth:`index` with a model: the text column, documents encoded per
            chunk, progress bar.
    """
    ARTIFACT_TYPE = 'sparse_index'
    ARTIFACT_FORMAT = 'lsr'
    ARTIFACT_PACKAGE_HINT = 'pyterrier-lsr'

    def __init__(self, path, model=None, *, scale: float = 100., engines: Sequence[str] = ('pisa',),
                 overwrite: bool = False, save_model: bool = True, scoring: Optional[dict] = None,
                 text_field: str = 'text', batch_size: int = 1024, verbose: bool = True, encoder=None):
        super().__init__(path)
        if encoder is not None:  # the 0.1 keyword, kept for one release
            warnings.warn('LsrIndex(path, encoder=...) is deprecated; pass model=', DeprecationWarning, stacklevel=2)
            model = encoder
        self.save_model = save_model
        self._scoring = scoring
        self._model = model
        self._scale = float(scale)
        if not self._scale > 0 or self._scale == float('inf'):
            raise ValueError(f'scale must be a finite number > 0, got {scale}')
        if isinstance(engines, str):
            engines = (engines,)
        for name in engines:
            get_engine(name)
        self.new_engines = tuple(engines)
        self.overwrite = overwrite
        self.text_field = text_field
        if batch_size < 1:
            raise ValueError(f'batch_size must be >= 1, got {batch_size}')
        self.batch_size = batch_size
        self.verbose = verbose
        self._meta = None

    # -- reading -------------------------------------------------------------------------------------------------
    def built(self) -> bool:
        """Whether an index exists at ``path`` (the re-runnable pattern: ``index if index.built() else build``)."""
        return (self.path / META_FILE).is_file()

    @property
    def meta(self) -> dict:
        if self._meta is None:
            if not self.built():
                raise FileNotFoundError(f'no pyterrier-lsr index at {self.path} (missing {META_FILE})')
            meta = json.loads((self.path / META_FILE).read_text())
            if meta.get('version') != FORMAT_VERSION:
                raise ValueError(f'{self.path} is an index of format version {meta.get("version")}; this version of '
                                 f'pyterrier-lsr reads version {FORMAT_VERSION}: rebuild it')
            damaged = [f'{name} ({"missing" if not (self.path / name).is_file() else "size differs"})'
                       for name, size in meta['files'].items()
                       if not (self.path / name).is_file() or (self.path / name).stat().st_size != size]
            if damaged:
                raise ValueError(f'the index at {self.path} is damaged: {", ".join(damaged[:5])}; rebuild it')
            self._meta = meta
        return self._meta

    @property
    def scale(self) -> float:
        return self.meta['scale']

    @property
    def scoring(self) -> dict:
        return self.meta['scoring']

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def __len__(self):
        return self.num_docs()

    def vectors(self) -> VectorStore:
        """The documents' float vectors, in corpus order (the engine-neutral form)."""
        return VectorStore(self.path / VECTORS_FOLDER)

    def document_frequencies(self) -> Dict[str, int]:
        """Number of documents in which each term has a non-zero (quantized) impact."""
        return json.loads((self.path / DF_FILE).read_text())

    def model(self):
        """The model that encodes queries: the one given, else the copy stored in the index."""
        if self._model is None:
            recorded = self.meta.get('model')
            if not recorded:
                raise ValueError(f'{self.path} records no model (built from toks); pass model= to LsrIndex')
            self._model = load_model(self.path / recorded['path'])
            if recorded.get('name'):  # the name it was indexed under, not the copy's folder ('model'), in reprs
                self._model.name = recorded['name']
        return self._model

    def pisa(self):
        """The PISA index at the root of the folder (a ``pyterrier_pisa.PisaIndex``)."""
        import pyterrier_pisa
        return pyterrier_pisa.PisaIndex(str(self.path), stemmer='none', stops='none')

    # -- retrieval -----------------------------------------------------------------------------------------------
    def toks_retriever(self, num_results: int = 1000, engine: str = 'pisa', **params) -> pt.Transformer:
        """Retrieval for frames that already carry ``query_toks`` (floats, model units); ``params`` go to the engine
        (PISA: ``threads``, ``query_algorithm``, ``k1``/``b`` for BM25-scored indexes; see each engine)."""
        num_results = check_int('num_results', num_results, minimum=1)
        if engine not in self.meta['engines']:
            raise ValueError(f'{self.path} has no {engine!r} engine (built: {sorted(self.meta["engines"])}); '
                             f'add it with LsrIndex(path).build_engine({engine!r})')
        impl = get_engine(engine)
        if self.scoring['kind'] not in impl.scorings:
            raise ValueError(f'the {engine} engine cannot score a {self.scoring["kind"]!r} index')
        with quiet_native(params.get('verbose', False)):
            inner = impl.retriever(self, self.path / impl.subfolder, num_results, **params)
        return QueryToksRetriever(inner, self, engine)

    def retriever(self, num_results: int = 1000, engine: str = 'pisa', query_encoder: pt.Transformer = None,
                  **params) -> pt.Transformer:
        """``model.query_encoder() >> toks_retriever()``: end-to-end retrieval from ``query`` text. ``query_encoder``
        replaces the model's own query side (e.g. ``IDFQueryEncoder.from_index(index)``)."""
        if query_encoder is None:
            model = self.model()
            query_encoder, name = model.query_encoder(), model
        else:
            name = query_encoder
        return Retriever(name, query_encoder, self.toks_retriever(num_results, engine, **params))

    # -- building ------------------------------------------------------------------------------------------------
    def index_inputs(self):
        return [['docno', 'toks'], ['docno', self.text_field]] if self._model is not None else [['docno', 'toks']]

    def indexer(self, model=None, **kwargs) -> 'SpladeIndexer':
        """A :class:`SpladeIndexer` writing this index (``kwargs``: scale, engines, overwrite, ...)."""
        return SpladeIndexer(self.path, model if model is not None else self._model, **kwargs)

    def _encoded(self, docs: Iterable[dict]):
        """Lists of ``(docno, vector)`` pairs, one per chunk, validated. Documents carrying ``toks`` (encoded
        upstream) are taken as they are; others are encoded from ``text_field`` in chunks by the index's model."""
        for chunk in more_itertools.chunked(docs, self.batch_size):
            encode = 'toks' not in chunk[0] and self._model is not None
            field = self.text_field if encode else 'toks'
            for doc in chunk:
                missing = [c for c in ('docno', field) if c not in doc]
                if missing:
                    raise KeyError(f'documents must have columns {missing}; got {sorted(doc)}')
            docnos = [check_docno(doc['docno']) for doc in chunk]
            vectors = self._model.encode([doc[field] for doc in chunk]) if encode else [doc['toks'] for doc in chunk]
            yield [(docno, check_vector(vector, f'document {docno!r}')) for docno, vector in zip(docnos, vectors)]

    def index(self, it: Iterable[dict]) -> 'LsrIndex':
        """Encodes (with a model) or takes ``toks`` and builds the index atomically; returns ``self``."""
        total = len(it) if hasattr(it, '__len__') else None
        with atomic_folder(self.path, self.overwrite) as tmp:
            writer, df, count = VectorWriter(tmp / VECTORS_FOLDER), Counter(), 0
            # Advanced once per encoded chunk: per-document updates made the first one report the time of a whole
            # chunk per document (hours of ETA).
            with tqdm(total=total, desc=f'indexing {self.path.name}', unit='doc', disable=not self.verbose,
                      smoothing=0.1) as pbar:
                for chunk in self._encoded(it):
                    for docno, vector in chunk:
                        writer.add(docno, vector)
                        df.update(quantize(vector, self._scale).keys())
                    count += len(chunk)
                    pbar.update(len(chunk))
            if count == 0:
                raise ValueError('cannot index an empty collection')
            if not df:
                raise ValueError(f'every one of the {count} documents is empty after quantization (all weights below '
                                 f'1/scale = {1 / self._scale:g}); nothing could be retrieved')
            writer.close()
            write_json_atomic(tmp / DF_FILE, dict(df))
            self._finish(tmp, count)
        self._meta = None
        self.meta  # noqa: B018  (validates what was just written)
        return self

    def _finish(self, tmp: Path, count: int):
        """Saves the model, builds the engines and writes the metadata into the temporary folder ``tmp``."""
        model = self._model
        scoring = check_scoring(getattr(model, 'scoring', None) or self._scoring or {'kind': 'dot'})
        recorded = None
        if model is not None and self.save_model:
            with quiet_native():
                model.save_pretrained(tmp / MODEL_FOLDER)
            recorded = {'path': MODEL_FOLDER, 'kind': getattr(model, 'kind', None),
                        'name': getattr(model, 'name', None)}
        meta = {'version': FORMAT_VERSION, 'scale': self._scale, 'num_docs': count, 'scoring': scoring,
                'model': recorded, 'engines': {}, 'files': {}}
        building = _Building(tmp, meta)
        for name in self.new_engines:
            engine = get_engine(name)
            if scoring['kind'] not in engine.scorings:
                raise ValueError(f'the {name} engine cannot score a {scoring["kind"]!r} index')
            folder = tmp / engine.subfolder
            folder.mkdir(exist_ok=True)
            with quiet_native():
                meta['engines'][name] = engine.build(building, folder)
        # PISA keeps its settings (stemmer, stops...) in pt_meta.json: they stay, under our type and format, so the
        # folder loads as this artifact and PISA still reads its own configuration.
        pt_meta = json.loads((tmp / PT_META_FILE).read_text()) if (tmp / PT_META_FILE).is_file() else {}
        write_json_atomic(tmp / PT_META_FILE, dict(pt_meta, type=self.ARTIFACT_TYPE, format=self.ARTIFACT_FORMAT,
                                                   package_hint=self.ARTIFACT_PACKAGE_HINT))
        meta['files'] = _file_sizes(tmp)
        write_json_atomic(tmp / META_FILE, meta)

    def build_engine(self, name: str, overwrite: bool = False, **params) -> 'LsrIndex':
        """Builds another engine from the stored vectors (e.g. ``'bmp'``, ``'seismic'``) into its subfolder."""
        engine = get_engine(name)
        meta = self.meta
        if name in meta['engines'] and not overwrite:
            raise FileExistsError(f'{self.path} already has the {name!r} engine; pass overwrite=True to rebuild it')
        if not engine.subfolder:
            raise ValueError(f'the {name!r} engine is built with the index; rebuild the index to change it')
        if meta['scoring']['kind'] not in engine.scorings:
            raise ValueError(f'the {name} engine cannot score a {meta["scoring"]["kind"]!r} index')
        with _write_lock(self.path):
            target = self.path / engine.subfolder
            tmp = self.path / f'.{engine.subfolder}.building-{uuid.uuid4().hex[:8]}'
            tmp.mkdir()
            try:
                settings = engine.build(self, tmp, **params)
                if target.exists():
                    shutil.rmtree(target)
                os.rename(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            meta = dict(meta, engines={**meta['engines'], name: settings})
            meta['files'] = {k: v for k, v in meta['files'].items() if not k.startswith(engine.subfolder + '/')}
            meta['files'].update({f'{engine.subfolder}/{k}': v for k, v in _file_sizes(target).items()})
            write_json_atomic(self.path / META_FILE, meta)
            self._meta = None
        return self

    def __repr__(self):
        return f'LsrIndex({str(self.path)!r})'


def check_scoring(scoring: dict) -> dict:
    kind = scoring.get('kind') if isinstance(scoring, dict) else None
    if kind == 'dot' and set(scoring) == {'kind'}:
        return scoring
    if kind == 'bm25' and set(scoring) == {'kind', 'k1', 'b'} and scoring['k1'] >= 0 and 0 <= scoring['b'] <= 1:
        return scoring
    raise ValueError(f"scoring must be {{'kind': 'dot'}} or {{'kind': 'bm25', 'k1': >= 0, 'b': in [0, 1]}}, "
                     f'got {scoring!r}')


class _Building:
    """What an engine sees of an index that is being built (its folder is not in place yet)."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta
        self.scale, self.scoring = meta['scale'], meta['scoring']

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def vectors(self) -> VectorStore:
        return VectorStore(self.folder / VECTORS_FOLDER)


class QueryToksRetriever(pt.Transformer):
    """Validates ``query_toks`` (naming the query and value of any bad weight), runs an engine, and returns
    ``qid, docno, score, rank`` plus the input's other columns (not ``query_toks``)."""

    def __init__(self, engine_retriever: pt.Transformer, index: LsrIndex, engine: str):
        self.engine_retriever = engine_retriever
        self.index = index
        self.engine = engine

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.query_frame(inp, extra_columns=['query_toks'])
        columns = [c for c in inp.columns if c != 'query_toks'] + ['docno', 'score', 'rank']
        if not len(inp):
            return pd.DataFrame(columns=columns)
        toks = [dict(check_vector(q, f'query {qid!r}')) for qid, q in zip(inp['qid'], inp['query_toks'])]
        out = self.engine_retriever(inp.assign(query_toks=toks))
        return out.drop(columns=['query_toks'], errors='ignore')[columns]

    def __repr__(self):
        return f'{self.engine.upper()}({self.index.path.name})'


class Retriever(pt.Compose):
    """A query encoder composed with an index's retriever, named ``Splade('x') on PISA(index)`` after the model (or
    the query encoder): a default ``pt.Experiment`` name that ``save_dir`` accepts (no ``>>``, no path)."""

    def __init__(self, name, *transformers: pt.Transformer):
        super().__init__(*transformers)
        self.name = name

    def __repr__(self):
        return f'{self.name!r} on {self._transformers[-1]!r}'


class SpladeIndexer(pt.Indexer):
    """Encodes documents (when given a model) and writes an :class:`LsrIndex`.

    Args:
        path: index folder to create.
        encoder: a model of the project (anything with ``encode(texts) -> [{term: weight}]`` and
            ``save_pretrained``). Without one, input documents must carry ``toks`` already (e.g.
            ``(splade.doc_encoder() >> SpladeIndexer(path)).index(corpus)``: the doc encoder hands its model over, so
            the index records it all the same).
        scale: quantization scale (see :mod:`.quantization`). Stored with the index.
        overwrite: replace an existing index at ``path`` (never another folder), atomically.
        engines: engines to build (default PISA; ``'bmp'``, ``'seismic'`` with the ``engines`` extra).
        text_field: the document text column to encode.
        batch_size: documents encoded per chunk (the encoder sorts each chunk by length).
        verbose: progress bar over documents, and the engines' own output.
    """

    def __init__(self, path, encoder=None, scale: float = 100., overwrite: bool = False, text_field: str = 'text',
                 batch_size: int = 1024, verbose: bool = True, engines: Sequence[str] = ('pisa',),
                 save_model: bool = True, scoring: Optional[dict] = None):
        self.artifact = LsrIndex(path, encoder, scale=scale, engines=engines, overwrite=overwrite,
                                 save_model=save_model, scoring=scoring, text_field=text_field,
                                 batch_size=batch_size, verbose=verbose)

    @property
    def path(self) -> Path:
        return self.artifact.path

    def with_model(self, model) -> 'SpladeIndexer':
        """This indexer with ``model`` recorded in the index (``toks`` are still taken as given), so that the index
        retrieves on its own; ``doc_encoder >> SpladeIndexer(path)`` calls it."""
        a = self.artifact
        return SpladeIndexer(a.path, model, a._scale, a.overwrite, a.text_field, a.batch_size, a.verbose, a.new_engines,
                             a.save_model, a._scoring)

    def index_inputs(self):
        return self.artifact.index_inputs()

    def index(self, it: Iterable[dict]) -> LsrIndex:
        return self.artifact.index(it)

    def __repr__(self):
        return f'SpladeIndexer({str(self.path)!r})'
