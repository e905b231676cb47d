"""What the token-level stores (:class:`~pyterrier_lsr.index.maxsim.MaxSimIndex`,
:class:`~pyterrier_lsr.index.ssr.SSRIndex`) share: a PyTerrier artifact holding documents' token rows, built by
streaming documents through a model, opened lazily, and tied to one build.

A store folder holds its marker (the artifact type, a build id and every file's size and digest, see
:func:`~pyterrier_lsr.core.storage.record_files`), ``pt_meta.json`` (type and format, so ``pt.Artifact.load(path)``
opens it), a settings file (``num_docs``, ``num_tokens``, ...), ``docnos.json`` and ``offsets.npy`` (document ``i``
owns token rows ``offsets[i]:offsets[i + 1]``), plus what the store keeps per token.

* **Unbuilt artifacts**: ``Store(path)`` reads nothing; on a missing or empty folder it is a store to build
  (:meth:`TokenStore.built` is False) with ``Store(path, model).indexer().index(docs)`` or
  ``Store(path).indexer(model).index(docs)``.
* **Streaming**: documents are validated one by one (:func:`~pyterrier_lsr.core.checks.documents`), encoded
  ``shard_size`` at a time and their rows appended to the files being built
  (:class:`~pyterrier_lsr.core.arrays.ArrayWriter`); the folder is built beside its final name and swapped in.
* **One build at a time**: what was read from the folder is cached with the marker it was read under and read again
  when the folder was rebuilt since; an array read lazily (a store's vectors) is refused if the folder changed
  between opening and reading it, and a retriever made before a rebuild refuses to run, so no result ever mixes
  two builds' docnos and rows.
"""
import copy
import hashlib
import json
import uuid
from pathlib import Path

import more_itertools
import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
from tqdm.auto import tqdm

from ..core import storage
from ..core.checks import UniqueDocnos, check_bool, check_docnos, check_int, check_matrix, check_str, documents
from ..core.encoding import as_texts
from .ranking import docno_ranks, fusable_cutoff

DOCNOS_FILE = 'docnos.json'
OFFSETS_FILE = 'offsets.npy'
PT_META_FILE = 'pt_meta.json'

__all__ = ['TokenStore', 'TopK', 'load_npy', 'layout_problem', 'result_frame', 'DOCNOS_FILE', 'OFFSETS_FILE']


def load_npy(path: Path, mmap_mode=None) -> np.ndarray:
    """A ``.npy`` array (never unpickled), or an error naming the file."""
    try:
        return np.load(path, allow_pickle=False, mmap_mode=mmap_mode)
    except FileNotFoundError:
        raise FileNotFoundError(f'{path}: missing') from None
    except (ValueError, OSError) as ex:
        raise ValueError(f'{path} is not a readable .npy array ({ex})') from None


def layout_problem(docnos: list, offsets: np.ndarray, num_docs: int, num_tokens: int) -> str | None:
    """What keeps docnos and offsets from describing ``num_docs`` documents of ``num_tokens`` token rows (offsets from
    0, non-decreasing, ending at the number of rows: none reads past them), or ``None``."""
    if len(docnos) != num_docs:
        return f'{len(docnos)} docnos for {num_docs} documents'
    if offsets.shape != (num_docs + 1,) or not np.issubdtype(offsets.dtype, np.integer):
        return f'offsets of shape {offsets.shape} ({offsets.dtype}) for {num_docs} documents'
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] != num_tokens:
        return f'offsets must start at 0, never decrease and end at the number of token rows ({num_tokens})'
    return None


def result_frame(rows: list[tuple[int, str, float]], inp: pd.DataFrame) -> pd.DataFrame:
    """``(input row, docno, score)`` results, best first per input row, as a ``qid, docno, score, rank`` frame
    keeping each input row's query columns: rows are joined by position, never by qid (empty input: empty
    output)."""
    columns = [c for c in inp.columns if c not in ('docno', 'score', 'rank')]
    positions = np.array([r[0] for r in rows], dtype=np.int64)
    out = inp[columns].iloc[positions].reset_index(drop=True)
    return out.assign(docno=pd.Series([r[1] for r in rows], dtype=object),
                      score=np.array([r[2] for r in rows], dtype=np.float64),
                      rank=pd.Series(positions).groupby(positions).cumcount().to_numpy(dtype=np.int64))


class TopK:
    """A retriever that computes its top ``num_results`` itself: ``retriever % k`` is this retriever asking for the
    top ``k`` (PyTerrier's rank cutoff protocol), never ranking more to cut them."""
    num_results: int

    def fuse_rank_cutoff(self, k: int):
        if not fusable_cutoff(k, self.num_results):  # k <= 0: PyTerrier's RankCutoff, no rows
            return None
        fused = copy.copy(self)
        fused.num_results = k
        return fused


def _build_of(marker: dict) -> str:
    """The build id a store's marker records; stores written before build ids are told apart by their files' digests
    (their embeddings are costly to compute again)."""
    build = marker.get('build')
    if isinstance(build, str):
        return build
    return hashlib.sha256(json.dumps(marker['files'], sort_keys=True).encode()).hexdigest()


class TokenStore(pta.Artifact, pt.Indexer):
    """A folder of documents' token rows (see the module docs); subclasses say what they keep per token.

    Args:
        path: the folder.
        model: the model that encodes documents (when indexing) and queries; subclasses name and check it.
        overwrite: let :meth:`index` replace an existing store of this kind at ``path`` (never any other folder).
        text_field, shard_size, verbose: for :meth:`index`: the text column, documents encoded together, progress.

    A subclass sets ``kind`` (its marker type), ``meta_file``, ``label`` and the artifact type/format, and
    implements :meth:`_open` (its own files, read on first use), :meth:`_sink` (what it writes per chunk of token
    rows) and :meth:`_embed`.
    """
    kind: str
    meta_file: str
    label: str
    ARTIFACT_PACKAGE_HINT = 'pyterrier-lsr'

    def __init__(self, path, model=None, *, overwrite: bool = False, text_field: str = 'text',
                 shard_size: int = 1024, verbose: bool = True):
        super().__init__(path)
        self._model = model
        # the indexing settings, checked; indexer() hands them to the copy it makes (a subclass adds its own)
        self._settings = dict(overwrite=check_bool('overwrite', overwrite), text_field=check_str('text_field',
                              text_field), shard_size=check_int('shard_size', shard_size, 1),
                              verbose=check_bool('verbose', verbose))
        self._loaded = None  # (marker, what was read under it)
        self._seen = None  # (the marker file's stat, its content)

    # -- reading -------------------------------------------------------------------------------------------------
    def built(self) -> bool:
        """Whether a store of this kind exists at ``path``."""
        return storage.is_artifact(self.path, self.kind)

    def _marker(self) -> dict:
        key = storage.marker_stamp(self.path)
        if key is not None and self._seen is not None and self._seen[0] == key:
            return self._seen[1]
        marker = storage.read_marker(self.path)
        if marker is None or marker['artifact'] != self.kind:
            raise FileNotFoundError(f'no {self.label} at {self.path} (no {storage.MARKER} naming {self.kind!r}); '
                                    f'build one with {type(self).__name__}(path, model).indexer()'
                                    '.index(docs)')
        if not isinstance(marker.get('files'), dict):
            raise ValueError(f'{self.label} {self.path}: its {storage.MARKER} records no files (written by an older '
                             'pyterrier-lsr, or edited); write it again')
        self._seen = key, marker
        return marker

    def build_id(self) -> str:
        """The id of the build now at ``path`` (new whenever the store is written again)."""
        return _build_of(self._marker())

    def _state(self) -> dict:
        """What was read from the folder for the build now there (read again after a rebuild)."""
        marker = self._marker()
        if self._loaded is None or self._loaded[0] != marker:
            self._loaded = marker, self._open(marker)
        return self._loaded[1]

    def _open(self, marker: dict) -> dict:
        """The common files, checked (sizes, and digests of small files; every digest in :meth:`verify`)."""
        files = marker['files']
        storage.check_files(self.path, files, f'the {self.label}')
        meta = storage.read_json(self.path / self.meta_file, f'{self.label} settings')
        docnos = storage.read_json(self.path / DOCNOS_FILE, f'{self.label} docnos', expect=list)
        offsets = load_npy(self.path / OFFSETS_FILE)
        try:
            for key in ('num_docs', 'num_tokens'):
                check_int(key, meta.get(key), 0)
        except (TypeError, ValueError) as ex:
            raise ValueError(f'{self.path / self.meta_file}: {ex}') from None
        problem = layout_problem(docnos, offsets, meta['num_docs'], meta['num_tokens'])
        if problem:
            raise ValueError(f'{self.label} {self.path}: {problem}')
        return {'build': _build_of(marker), 'files': files, 'meta': meta, 'docnos': docnos,
                'offsets': offsets.astype(np.int64, copy=False)}

    def _lazy_array(self, state: dict, name: str, convert=lambda a: a):
        """``name`` read on first use for the build of ``state``: refused if the folder was rebuilt since ``state``
        was read (its rows would not be those of ``state``'s docnos and offsets)."""
        if name not in state:
            array = convert(load_npy(self.path / name))
            if self.build_id() != state['build']:
                raise RuntimeError(f'{self.path} was rebuilt while it was being read; open it again')
            state[name] = array
        return state[name]

    def _check_build(self, build: str) -> dict:
        """The state of the build ``build``, which a retriever was made for, or an error if it was rebuilt since."""
        state = self._state()
        if state['build'] != build:
            raise RuntimeError(f'{self.path} was rebuilt after this retriever was made; make a new one '
                               '(store.retriever())')
        return state

    def _docno_ranks(self, state: dict) -> np.ndarray:
        """Each document's place in docno order (:func:`~.ranking.docno_ranks`): the tie key of every ranking, computed
        once per build."""
        if 'docno_ranks' not in state:
            state['docno_ranks'] = docno_ranks(state['docnos'])
        return state['docno_ranks']

    @property
    def files(self) -> dict:
        return self._state()['files']

    @property
    def meta(self) -> dict:
        return self._state()['meta']

    @property
    def docnos(self) -> list[str]:
        return self._state()['docnos']

    @property
    def offsets(self) -> np.ndarray:
        return self._state()['offsets']

    def verify(self) -> 'TokenStore':
        """Checks the digest of every file (a full read); raises a ``ValueError`` naming the damaged files.  Opening
        checks sizes and small files only."""
        storage.check_files(self.path, self.files, f'the {self.label}', full=True)
        return self

    def num_docs(self) -> int:
        return self.meta['num_docs']

    def __len__(self):
        return self.num_docs()

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """The store as its own default retriever: ``self.retriever()(inp)``."""
        return self.retriever()(inp)

    def fuse_rank_cutoff(self, k: int):
        """``store % k``: the default retriever asking for the top ``k`` (PyTerrier's rank cutoff protocol)."""
        return self.retriever().fuse_rank_cutoff(k)

    # -- building ------------------------------------------------------------------------------------------------
    def indexer(self, model=None, **settings) -> 'TokenStore':
        """This store as an indexer: ``model`` (default: the one given) encodes the documents; ``settings``
        (overwrite, text_field, shard_size, verbose, ...) replace the store's own."""
        return type(self)(self.path, model if model is not None else self._model, **{**self._settings, **settings})

    def index_inputs(self):
        return [['docno', self._settings['text_field']]]

    def index(self, it) -> 'TokenStore':
        """Encodes documents (an iterable of dicts with ``docno`` and the text field, or a DataFrame), streamed
        ``shard_size`` at a time, and writes the store atomically; returns ``self``."""
        model = self._indexing_model()
        field, size = self._settings['text_field'], self._settings['shard_size']
        where = f'the documents indexed into {self.path}'
        docs, total = documents(it, ['docno', field], where)
        storage.check_replaceable(self.path, self.kind, self._settings['overwrite'], self.label)  # before encoding
        unique = UniqueDocnos(where)

        def chunks():
            with tqdm(total=total, desc=f'indexing {self.path.name}', unit='doc', smoothing=0.1,
                      disable=not self._settings['verbose']) as pbar:
                for chunk in more_itertools.chunked(docs, size):
                    docnos = [unique.add(doc['docno']) for doc in chunk]
                    vectors, offsets = self._embed(model, as_texts([doc[field] for doc in chunk], f'column {field!r}'))
                    pbar.update(len(chunk))
                    yield docnos, vectors, offsets
        self._write(chunks(), model)
        return self

    def _indexing_model(self):
        if self._model is None:
            name = type(self).__name__
            raise ValueError(f'{self.path}: no model to encode the documents; pass it: {name}(path, model).indexer() '
                             f'or {name}(path).indexer(model)')
        return self._model

    @classmethod
    def _from_arrays(cls, path, docnos, vectors, offsets, model, **settings) -> 'TokenStore':
        """A store written from token rows already computed, checked first (docnos: non-empty unique strings;
        offsets: from 0, non-decreasing, ending at the number of rows; vectors: finite)."""
        store = cls(path, model, **settings)
        vectors = check_matrix('vectors', vectors)
        docnos = check_docnos(docnos, f'the documents of {store.path}')
        offsets = np.asarray(offsets)
        problem = layout_problem(docnos, offsets, len(docnos), len(vectors))
        if problem:
            raise ValueError(f'offsets of {store.path}: {problem}')
        store._write(iter([(docnos, vectors, offsets)]), model)
        return store

    def _write(self, chunks, model) -> None:
        """Builds the folder from ``(docnos, vectors, offsets)`` chunks (offsets within the chunk)."""
        with storage.build_folder(self.path, self.kind, self._settings['overwrite'], what=self.label) as tmp:
            sink = self._sink(tmp, model)
            docnos, offsets, tokens = [], [np.zeros(1, np.int64)], 0
            for chunk_docnos, vectors, chunk_offsets in chunks:
                sink.add(check_matrix('vectors', vectors))
                docnos.extend(chunk_docnos)
                offsets.append(tokens + np.asarray(chunk_offsets[1:], dtype=np.int64))
                tokens += len(vectors)
            if not docnos:
                raise ValueError(f'cannot build the {self.label} {self.path} from an empty collection')
            meta = sink.close()
            storage.write_array(tmp / OFFSETS_FILE, np.concatenate(offsets))
            storage.write_json(tmp / DOCNOS_FILE, docnos, indent=None)
            storage.write_json(tmp / self.meta_file, {'num_docs': len(docnos), 'num_tokens': tokens, **meta})
            storage.write_json(tmp / PT_META_FILE, {'type': self.ARTIFACT_TYPE, 'format': self.ARTIFACT_FORMAT,
                                                    'package_hint': self.ARTIFACT_PACKAGE_HINT})
            storage.mark(tmp, self.kind, build=uuid.uuid4().hex, files=storage.record_files(tmp))

    def _embed(self, model, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _sink(self, folder: Path, model):
        raise NotImplementedError

    def __repr__(self):
        return f'{type(self).__name__}({str(self.path)!r})'
