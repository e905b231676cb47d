"""The index artifact: an encoded corpus (engine-neutral vectors), the engines built from it, and its model.

An index folder holds

* ``.lsr-artifact.json``: the marker that makes the folder our index (type ``sparse_index.lsr``, a build id, the
  digest of ``lsr.json``; see :mod:`pyterrier_lsr.core.storage` and :mod:`.integrity`);
* ``pt_meta.json``: the artifact type and format (``sparse_index`` / ``lsr``), so ``pt.Artifact.load(path)`` and the
  artifact sharing routes (``to_hf``/``from_hf``, packages) know it;
* ``lsr.json``: ``scale``, ``num_docs``, ``scoring`` (``{"kind": "dot"}``, or ``{"kind": "bm25", "k1", "b"}`` for
  term-frequency models such as Latent Terms), the model, the engines built, and the size and sha256 of every file
  (checked on open and by :meth:`LsrIndex.verify`, see :mod:`.integrity`);
* ``vectors/``: the documents' float vectors (:mod:`.vectors`), ``df.json``: document frequencies of quantized terms;
* ``model/``: a copy of the model that encoded the documents, so the index reloads it from any directory, in any
  process, without the network and without ever picking up other weights;
* the engines' files: PISA's at the root, others in their own subfolder (see :mod:`.engines`).

Writes go through :func:`pyterrier_lsr.core.storage.build_folder`: an index is built in a temporary sibling folder and
swapped into place only when complete (adding an engine builds a new folder too, hard-linking the unchanged files, and
keeps the build id, so retrievers made before stay valid); ``overwrite`` replaces only a folder marked as a
pyterrier-lsr index (or an empty one); a failed rebuild leaves the old index as it was; a concurrent writer fails with
a clear error.  An :class:`LsrIndex` object compares the marker's build id on every use, so it never serves metadata
or a model cached from a folder that was rebuilt since.
"""
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import more_itertools
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
from tqdm.auto import tqdm

from ..core import storage
from ..core.checks import MAX_SCALE, UniqueDocnos, check_document, check_float, check_int, check_vector, documents
from ..core.quiet import quiet_native
from ..kinds.loading import load_model
from . import tuning
from .engines import ENGINES, check_engines, get_engine
from .integrity import check_meta, check_scoring
from .quantization import quantize
from .ranking import first_depth
from .retrievers import DefaultRetriever, QueryRetriever, QueryToksRetriever, StoredScorer, system_label
from .vectors import VectorStore, VectorWriter

META_FILE = 'lsr.json'
DF_FILE = 'df.json'
VECTORS_FOLDER = 'vectors'
MODEL_FOLDER = 'model'
PT_META_FILE = 'pt_meta.json'
# 3: the marker (.lsr-artifact.json) and the sha256 of every file; indexes of format 2 carry neither.
FORMAT_VERSION = 3
INDEX_KIND = 'sparse_index.lsr'

__all__ = ['LsrIndex', 'is_lsr_index']


def is_lsr_index(path) -> bool:
    """Whether ``path`` is a folder marked as a pyterrier-lsr index (never judged by the files it holds)."""
    return storage.is_artifact(path, INDEX_KIND)


class LsrIndex(pta.Artifact, pt.Indexer):
    """A learned-sparse index: stored vectors + engines + the model; a PyTerrier artifact, its own indexer
    (:meth:`index`, or a configured copy from :meth:`indexer`) and its own default retriever (``LsrIndex(path)(topics)``
    retrieves from ``query`` text, or from ``query_toks`` when the frame carries them).

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
        text_field, shard_size, verbose: for :meth:`index` with a model: the text column, documents encoded per
            chunk, progress bar.

    Example::

        index = LsrIndex("vaswani.lsr", Splade.from_pretrained("splade-tiny"))
        if not index.built():
            index.index(corpus)
        index(topics)                                # the index is its own retriever
        (index.retriever() % 10).search("radio waves")   # PISA asked for 10
    """
    ARTIFACT_TYPE = 'sparse_index'
    ARTIFACT_FORMAT = 'lsr'
    ARTIFACT_PACKAGE_HINT = 'pyterrier-lsr'

    def __init__(self, path, model=None, *, scale: float = 100., engines: Sequence[str] = ('pisa',),
                 overwrite: bool = False, save_model: bool = True, scoring: dict | None = None,
                 text_field: str = 'text', shard_size: int = 1024, verbose: bool = True):
        super().__init__(path)
        # as given, for indexer(): a configured copy takes them over, nothing else is copied
        self._settings = dict(scale=scale, engines=engines, overwrite=overwrite, save_model=save_model,
                              scoring=scoring, text_field=text_field, shard_size=shard_size, verbose=verbose)
        self.save_model = save_model
        self._scoring = scoring
        self._model = model
        self._model_from_index = False
        self._scale = check_float('scale', scale, 0, MAX_SCALE, exclusive_minimum=True)
        self.new_engines = check_engines(engines)
        self.overwrite = overwrite
        self.text_field = text_field
        self.shard_size = check_int('shard_size', shard_size, 1)
        self.verbose = verbose
        self._meta = None
        self._stamp = None  # the marker the cached metadata (and a model loaded from the index) belong to
        self._seen = None  # (the marker file's stat, its content): every retrieval call checks the build

    # -- reading -------------------------------------------------------------------------------------------------
    def built(self) -> bool:
        """Whether an index exists at ``path`` (the re-runnable pattern: ``index if index.built() else build``)."""
        return is_lsr_index(self.path) or (self.path / META_FILE).is_file()

    def _marker(self) -> dict:
        key = storage.marker_stamp(self.path)
        if key is not None and self._seen is not None and self._seen[0] == key:
            return self._seen[1]
        marker = storage.read_marker(self.path)
        if marker is not None and marker['artifact'] == INDEX_KIND:
            self._seen = key, marker
            return marker
        if (self.path / META_FILE).is_file():
            try:
                version = storage.read_json(self.path / META_FILE, 'index metadata').get('version')
            except ValueError:
                version = None
            if version != FORMAT_VERSION:
                raise ValueError(f'{self.path} is an index of format version {version} (an older pyterrier-lsr); '
                                 f'this version reads version {FORMAT_VERSION}: rebuild it (old indexes carry no '
                                 f'{storage.MARKER}, so remove the folder yourself; overwrite=True will not)')
            raise ValueError(f'{self.path} has a {META_FILE} but no {storage.MARKER} marking it as a pyterrier-lsr '
                             'index; rebuild it')
        found = 'nothing there' if not self.path.exists() else f'no {storage.MARKER} marking one'
        raise FileNotFoundError(f'no pyterrier-lsr index at {self.path} ({found}): build it with index.index(corpus), '
                                f'where index = LsrIndex({str(self.path)!r}, model)')

    def build_id(self) -> str:
        """The id of the build now at ``path``: it changes whenever the documents are indexed again, not when an engine
        is added (the files of the other engines, and of the model, stay the same)."""
        return str(self._marker().get('build'))

    @property
    def meta(self) -> dict:
        """``lsr.json``, checked (see :mod:`.integrity`); re-read whenever the folder was rebuilt since."""
        marker = self._marker()
        if self._meta is None or marker != self._stamp:
            file = self.path / META_FILE
            if not file.is_file() or storage.file_digest(file) != marker.get('meta_sha256'):
                raise ValueError(f'{file} is missing or was edited after the index was built (its digest differs '
                                 f'from the one in {storage.MARKER}); rebuild the index')
            meta = storage.read_json(file, 'index metadata')
            if meta.get('version') != FORMAT_VERSION:
                raise ValueError(f'{file}: format version {meta.get("version")!r}; this version of pyterrier-lsr '
                                 f'reads version {FORMAT_VERSION}: rebuild the index')
            check_meta(meta, file, ENGINES)
            storage.check_files(self.path, meta['files'], 'the index')
            rebuilt = self._stamp is not None and marker.get('build') != self._stamp.get('build')
            if rebuilt and self._model_from_index:  # a model loaded from the previous build is not this build's
                self._model, self._model_from_index = None, False
            self._meta, self._stamp = meta, marker
        return self._meta

    def verify(self) -> 'LsrIndex':
        """Checks the digest of every file of the index (a full read); raises a ``ValueError`` naming the damaged
        files. Opening an index checks sizes and small files only."""
        storage.check_files(self.path, self.meta['files'], 'the index', full=True)
        return self

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
        self.meta  # noqa: B018  (checks the folder first)
        return VectorStore(self.path / VECTORS_FOLDER)

    def document_frequencies(self) -> dict[str, int]:
        """Number of documents in which each term has a non-zero (quantized) impact."""
        self.meta  # noqa: B018
        df = storage.read_json(self.path / DF_FILE, 'document frequencies')
        for term, count in df.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f'{self.path / DF_FILE}: the frequency of {term!r:.40} is {count!r:.40}, not a '
                                 'count')
        return df

    def model(self):
        """The model that encodes queries: the one given, else the copy stored in the index (its files checked
        against their recorded digests first, so weights edited in place are noticed)."""
        meta = self.meta
        if self._model is None:
            recorded = meta.get('model')
            if not recorded:
                raise ValueError(f'{self.path} records no model (built from toks); pass model= to LsrIndex')
            folder = (self.path / recorded['path']).resolve()
            if self.path.resolve() not in folder.parents:
                raise ValueError(f'{self.path / META_FILE}: the model path {recorded["path"]!r} leads outside the '
                                 'index')
            storage.check_files(self.path, meta['files'], 'the model copy of the index', full=True,
                                prefix=recorded['path'].rstrip('/') + '/')
            model = load_model(folder, **({'precision': 'int8'} if recorded.get('precision') == 'int8' else {}))
            if recorded.get('name'):  # the name it was indexed under, not the copy's folder ('model'), in reprs
                model.name = recorded['name']
            self._model, self._model_from_index = model, True
        return self._model

    def pisa(self):
        """The PISA index at the root of the folder (a ``pyterrier_pisa.PisaIndex``)."""
        import pyterrier_pisa
        self.meta  # noqa: B018
        return pyterrier_pisa.PisaIndex(str(self.path), stemmer='none', stops='none')

    # -- retrieval -----------------------------------------------------------------------------------------------
    def toks_retriever(self, num_results: int = 1000, engine: str = 'pisa', **params) -> pt.Transformer:
        """Retrieval for frames that already carry ``query_toks`` (floats, model units); ``params`` go to the engine
        (PISA: ``threads``, ``query_algorithm``, ``k1``/``b`` for BM25-scored indexes; see each engine)."""
        num_results = check_int('num_results', num_results, 1)
        meta = self.meta
        if engine not in meta['engines']:
            raise ValueError(f'{self.path} has no {engine!r} engine (built: {sorted(meta["engines"])}); '
                             f'add it with LsrIndex(path).build_engine({engine!r})')
        impl = get_engine(engine)
        if self.scoring['kind'] not in impl.scorings:
            raise ValueError(f'the {engine} engine cannot score a {self.scoring["kind"]!r} index')
        build = str(self._stamp.get('build'))
        with quiet_native(params.get('verbose', False)):
            # deeper than asked: the tie rule (.ranking.top_hits) sees whether ties cross the cut
            inner = impl.retriever(self, self.path / impl.subfolder, first_depth(num_results, self.num_docs()),
                                   **params)
        return QueryToksRetriever(inner, self, engine, build, num_results, params)

    def retriever(self, num_results: int = 1000, engine: str | None = None, query_encoder: pt.Transformer = None,
                  **params) -> pt.Transformer:
        """``model.query_encoder() >> toks_retriever()``: end-to-end retrieval from ``query`` text. ``query_encoder``
        replaces the model's own query side (e.g. ``IDFQueryEncoder.from_index(index)``). Without ``engine`` and
        ``params``, the engine and settings :meth:`tune` recorded for this query encoder, else PISA."""
        record = tuning.recorded(self, query_encoder) if engine is None and not params else None
        engine, params = (record['engine'], dict(record['settings'])) if record else (engine or 'pisa', params)
        toks_retriever = self.toks_retriever(num_results, engine, **params)  # checks engine before it is labelled
        if query_encoder is None:
            query_encoder = self.model().query_encoder()
        return QueryRetriever(system_label(query_encoder, self, engine), query_encoder, toks_retriever)

    def tune(self, topics: pd.DataFrame, target_recall: float = 0.99, **options) -> dict:
        """Measures each built engine's settings on the tuning ``topics`` and records the cheapest reaching
        ``target_recall``, which :meth:`retriever` then uses; ``options``: see :func:`.tuning.tune`."""
        return tuning.tune(self, topics, target_recall, **options)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """The index as its own default retriever: :meth:`toks_retriever` for frames carrying ``query_toks`` (e.g.
        after the model's query encoder, ``model.query_encoder() >> index``), else :meth:`retriever`."""
        return self.__dict__.setdefault('_default', DefaultRetriever(self))(inp)

    def fuse_rank_cutoff(self, k: int):
        """``index % k``: the default retriever asking its engine for the top ``k`` (PyTerrier's rank cutoff
        protocol), never ranking 1,000 to cut them."""
        return DefaultRetriever(self).fuse_rank_cutoff(k)

    def scorer(self) -> pt.Transformer:
        """Re-ranks ``qid, query_toks, docno`` candidates (e.g. another system's top 100 after this index's model's
        ``query_encoder()``) with the documents' stored vectors, scored as this index's retrievers score them.  Only
        dot-scored indexes: a BM25-scored one (Latent Terms) is a ``ValueError``.

        Example::

            pipeline = bm25 % 100 >> splade.query_encoder() >> index.scorer()
        """
        if self.scoring['kind'] != 'dot':
            raise ValueError(f'{self.path} is scored by {self.scoring["kind"]!r}: scorer() re-ranks dot-scored '
                             'indexes only; use its retriever()')
        return StoredScorer(self)

    def get_corpus_iter(self, verbose: bool = True) -> Iterable[dict]:
        """The indexed documents as ``{'docno': ..., 'toks': {term: weight}}`` dicts, in corpus order, streamed from
        the stored float vectors (what ``LsrIndex(other).indexer().index(...)`` takes to index them again, e.g. at
        another ``scale``)."""
        store = self.vectors()
        for docno, toks in tqdm(store, total=store.num_docs, desc=f'reading {self.path.name}', unit='doc',
                                disable=not verbose):
            yield {'docno': docno, 'toks': toks}

    # -- building ------------------------------------------------------------------------------------------------
    def index_inputs(self):
        return [['docno', 'toks'], ['docno', self.text_field]] if self._model is not None else [['docno', 'toks']]

    def indexer(self, model=None, **settings) -> 'LsrIndex':
        """The one way to configure indexing: this index with ``model`` (default: the one given) encoding or
        recorded, and ``settings`` (scale, engines, overwrite, save_model, scoring, text_field, shard_size, verbose)
        replacing its own; ``.index(docs)`` builds it.  Documents that carry ``toks`` already (``model.doc_encoder()
        >> index.indexer(model)``) are indexed as given, and ``model`` is recorded so that the index retrieves on its
        own."""
        return LsrIndex(self.path, model if model is not None else self._model, **{**self._settings, **settings})

    def _encoded(self, docs: Iterable[dict]):
        """Lists of ``(docno, vector)`` pairs, one per chunk, validated (docnos: non-empty strings, unique).
        Documents carrying ``toks`` (encoded upstream) are taken as they are; others are encoded from ``text_field``
        in chunks by the index's model."""
        where = f'the documents indexed into {self.path}'
        unique = UniqueDocnos(where)
        position = 0
        for chunk in more_itertools.chunked(docs, self.shard_size):
            encode = isinstance(chunk[0], Mapping) and 'toks' not in chunk[0] and self._model is not None
            field = self.text_field if encode else 'toks'
            for doc in chunk:
                check_document(doc, position, ('docno', field), where)
                position += 1
            docnos = [unique.add(doc['docno']) for doc in chunk]
            texts = [doc[field] for doc in chunk]
            vectors = self._model.encode_docs(texts) if encode else texts
            yield [(docno, check_vector(vector, f'document {docno!r}')) for docno, vector in zip(docnos, vectors)]

    def index(self, it: Iterable[dict]) -> 'LsrIndex':
        """Encodes (with a model) or takes ``toks`` of documents (an iterable of dicts, or a DataFrame) and builds
        the index atomically; returns ``self``."""
        it, total = documents(it, (), f'the documents indexed into {self.path}')
        with storage.build_folder(self.path, INDEX_KIND, self.overwrite, what='index') as tmp:
            writer, df, count, empty = VectorWriter(tmp / VECTORS_FOLDER), Counter(), 0, 0
            # Advanced once per encoded chunk: per-document updates made the first one report the time of a whole
            # chunk per document (hours of ETA).
            with tqdm(total=total, desc=f'indexing {self.path.name}', unit='doc', disable=not self.verbose,
                      smoothing=0.1) as pbar:
                for chunk in self._encoded(it):
                    for docno, vector in chunk:
                        writer.add(docno, vector)
                        df.update(quantize(vector, self._scale).keys())
                        empty += not vector
                    count += len(chunk)
                    pbar.update(len(chunk))
            if count == 0:
                raise ValueError('cannot index an empty collection')
            if empty == count:  # missing texts (None, NaN) and blank ones encode as empty vectors, as documented
                raise ValueError(f'every one of the {count} documents has an empty vector (its text missing, e.g. '
                                 'None, or blank, or its toks empty); nothing could be retrieved')
            if not df:
                raise ValueError(f'every one of the {count} documents is empty after quantization (all weights below '
                                 f'1/scale = {1 / self._scale:g}); nothing could be retrieved')
            writer.close()
            storage.write_json(tmp / DF_FILE, dict(df))
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
                        'name': getattr(model, 'name', None),
                        # int8 weights differ from the folder's fp32 ones: queries must be encoded as documents were
                        **({'precision': 'int8'} if getattr(model, 'precision', None) == 'int8' else {})}
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
        pt_meta = storage.read_json(tmp / PT_META_FILE, 'PISA settings') if (tmp / PT_META_FILE).is_file() else {}
        storage.write_json(tmp / PT_META_FILE, dict(pt_meta, type=self.ARTIFACT_TYPE, format=self.ARTIFACT_FORMAT,
                                                    package_hint=self.ARTIFACT_PACKAGE_HINT))
        _write_meta(tmp, meta)

    def build_engine(self, name: str, overwrite: bool = False, **params) -> 'LsrIndex':
        """Builds another engine from the stored vectors (e.g. ``'bmp'``, ``'seismic'``) into its subfolder: a new
        index folder (the other files hard-linked) swapped into place, so readers never see a half-built engine."""
        engine = get_engine(name)
        meta = self.meta
        if name in meta['engines'] and not overwrite:
            raise FileExistsError(f'{self.path} already has the {name!r} engine; pass overwrite=True to rebuild it')
        if not engine.subfolder:
            raise ValueError(f'the {name!r} engine is built with the index; rebuild the index to change it')
        if meta['scoring']['kind'] not in engine.scorings:
            raise ValueError(f'the {name} engine cannot score a {meta["scoring"]["kind"]!r} index')
        stamp = self._stamp
        with storage.build_folder(self.path, INDEX_KIND, overwrite=True, what='index') as tmp:
            if storage.read_marker(self.path) != stamp:
                raise RuntimeError(f'{self.path} changed while the {name} engine was being added; try again')
            prefix = engine.subfolder + '/'
            storage.link_tree(self.path, tmp, skip=lambda n: n == META_FILE or n.startswith(prefix))
            (tmp / engine.subfolder).mkdir(exist_ok=True)
            new = dict(meta, engines={**meta['engines'], name: None})
            # verbose=True (an engine's build option) shows its progress and native output
            with quiet_native(params.get('verbose', False)):
                new['engines'][name] = engine.build(_Building(tmp, new), tmp / engine.subfolder, **params)
            _write_meta(tmp, new, build=stamp.get('build'))
        self._meta = None
        return self

    def __repr__(self):
        return f'LsrIndex({str(self.path)!r})'


def _write_meta(folder: Path, meta: dict, build: str | None = None) -> None:
    """Records every file of ``folder`` in ``lsr.json``, writes it, and marks the folder with the build id (a new one
    unless given) and the digest of ``lsr.json`` (see :mod:`.integrity`)."""
    meta['files'] = storage.record_files(folder, leave_out={META_FILE})
    storage.write_json(folder / META_FILE, meta)
    storage.mark(folder, INDEX_KIND, build=build or uuid.uuid4().hex,
                 meta_sha256=storage.file_digest(folder / META_FILE))


class _Building:
    """What an engine sees of an index that is being built (its folder is not in place yet)."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = folder, meta
        self.scale, self.scoring = meta['scale'], meta['scoring']

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def vectors(self) -> VectorStore:
        return VectorStore(self.folder / VECTORS_FOLDER)
