"""The engine-neutral form of an encoded corpus: the float vectors themselves, in Parquet shards.

A vector folder holds shards ``part-<n>.parquet`` with the columns ``docno`` (string), ``terms`` (list of string) and
``weights`` (list of float64, the encoder's own units, unquantized: kept exact, so every engine quantizes the values the
encoder emitted), and ``vectors.json`` listing the shards in corpus
order with their row counts and byte sizes.  Shards are written under a temporary name and renamed when complete, and
``vectors.json`` is written last, so a folder with a manifest is whole.  Every engine (PISA, BMP, Seismic) is built from
this form, so a corpus is encoded once; distributed writers produce shards independently (:func:`write_shard`) and one
manifest joins them (:func:`write_manifest`).  Any Parquet reader (pandas, pyarrow, Spark) reads the shards.
"""
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..core import storage
from .integrity import safe_relative

MANIFEST = 'vectors.json'
FORMAT = 'lsr-vectors/1'

__all__ = ['VectorStore', 'VectorWriter', 'write_shard', 'write_manifest', 'shard_name']


def _schema():
    import pyarrow as pa
    return pa.schema([('docno', pa.string()), ('terms', pa.list_(pa.string())), ('weights', pa.list_(pa.float64()))])


def shard_name(number: int) -> str:
    return f'part-{number:05d}.parquet'


def write_shard(folder, name: str, docnos: Sequence[str], vectors: Sequence[Mapping[str, float]]) -> dict:
    """Writes one shard atomically; returns its manifest entry (``file``, ``num_docs``, ``num_postings``, ``bytes``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({'docno': list(docnos), 'terms': [list(v.keys()) for v in vectors],
                      'weights': [list(v.values()) for v in vectors]}, schema=_schema())
    storage.write_file(folder / name, lambda tmp: pq.write_table(table, tmp))
    return {'file': name, 'num_docs': len(docnos), 'num_postings': int(sum(len(v) for v in vectors)),
            'bytes': (folder / name).stat().st_size}


def write_manifest(folder, shards: list[dict]) -> 'VectorStore':
    """Joins shards (in corpus order) into a vector folder; checks that each is present with its recorded size."""
    folder = Path(folder)
    _check_shards(folder, shards)
    storage.write_json(folder / MANIFEST, {'format': FORMAT, 'num_docs': sum(s['num_docs'] for s in shards),
                                          'shards': shards})
    return VectorStore(folder)


class VectorWriter:
    """Appends ``(docno, vector)`` pairs to a vector folder, ``shard_size`` documents per shard."""

    def __init__(self, folder, shard_size: int = 100_000):
        if shard_size < 1:
            raise ValueError(f'shard_size must be >= 1, got {shard_size}')
        self.folder = Path(folder)
        self.shard_size = shard_size
        self.shards: list[dict] = []
        self._docnos: list[str] = []
        self._vectors: list[Mapping[str, float]] = []

    def add(self, docno: str, vector: Mapping[str, float]) -> None:
        self._docnos.append(docno)
        self._vectors.append(vector)
        if len(self._docnos) >= self.shard_size:
            self._flush()

    def _flush(self):
        if self._docnos:
            self.shards.append(write_shard(self.folder, shard_name(len(self.shards)), self._docnos, self._vectors))
            self._docnos, self._vectors = [], []

    def close(self) -> 'VectorStore':
        self._flush()
        return write_manifest(self.folder, self.shards)


class VectorStore:
    """Reads a vector folder written by :class:`VectorWriter` or :func:`write_manifest`."""

    def __init__(self, folder):
        self.folder = Path(folder)
        if not (self.folder / MANIFEST).exists():
            raise FileNotFoundError(f'no vectors at {self.folder} (missing {MANIFEST})')
        self.manifest = storage.read_json(self.folder / MANIFEST, 'vector manifest')
        if self.manifest.get('format') != FORMAT:
            raise ValueError(f'{self.folder / MANIFEST}: unknown format {self.manifest.get("format")!r}')
        shards = self.manifest.get('shards')
        if not isinstance(shards, list) or not all(_is_entry(s) for s in shards) or \
                self.manifest.get('num_docs') != sum(s['num_docs'] for s in shards):
            raise ValueError(f'{self.folder / MANIFEST}: "shards" must list entries with a file name inside the '
                             'folder and integer num_docs and bytes adding up to "num_docs"')

    @property
    def num_docs(self) -> int:
        return self.manifest['num_docs']

    def __len__(self):
        return self.num_docs

    def _tables(self):
        import pyarrow.parquet as pq
        for shard in self.manifest['shards']:
            yield pq.read_table(self.folder / shard['file'])

    def __iter__(self) -> Iterator[tuple[str, dict[str, float]]]:
        """``(docno, {term: weight})`` in corpus order."""
        for table in self._tables():
            columns = table.to_pydict()
            for docno, terms, weights in zip(columns['docno'], columns['terms'], columns['weights']):
                yield docno, dict(zip(terms, weights))

    def docnos(self) -> list[str]:
        return [d for table in self._tables() for d in table.column('docno').to_pylist()]

    def lookup(self, docnos: Sequence[str]) -> dict[str, dict[str, float]]:
        """``{docno: {term: weight}}`` for ``docnos``, read from the shards that hold them (where each docno is, and
        each shard read, are kept for later calls on this object); an unknown docno is a ``KeyError`` naming it."""
        if not hasattr(self, '_where'):
            import pyarrow.parquet as pq
            self._where, self._columns = {}, {}
            for number, shard in enumerate(self.manifest['shards']):
                names = pq.read_table(self.folder / shard['file'], columns=['docno']).column('docno').to_pylist()
                self._where.update((docno, (number, row)) for row, docno in enumerate(names))
        out = {}
        for docno in docnos:
            try:
                number, row = self._where[docno]
            except (KeyError, TypeError):
                raise KeyError(f'docno {docno!r:.60} is not in the index at {self.folder.parent}') from None
            if number not in self._columns:
                import pyarrow.parquet as pq
                table = pq.read_table(self.folder / self.manifest['shards'][number]['file'],
                                      columns=['terms', 'weights'])
                self._columns[number] = (table.column('terms').to_pylist(), table.column('weights').to_pylist())
            terms, weights = self._columns[number]
            out[docno] = dict(zip(terms[row] or (), weights[row] or ()))
        return out

    def to_csr(self, convert: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray]:
        """``(docnos, terms, indptr, indices, values)``: the corpus as a CSR matrix over a term list (terms numbered
        in order of first appearance), for engines that build from arrays.  ``values`` are the weights (float64), or
        what ``convert`` makes of each shard's weights: applied shard by shard, so that a narrower form never needs
        the whole corpus's float64 weights in memory."""
        import pyarrow as pa
        import pyarrow.compute as pc
        docnos, term_ids, values, lengths = [], [], [], []
        vocabulary: dict[str, int] = {}
        for table in self._tables():
            docnos.extend(table.column('docno').to_pylist())
            terms = table.column('terms').combine_chunks()
            lengths.append(pc.list_value_length(terms).fill_null(0).to_numpy())
            encoded = pc.dictionary_encode(terms.flatten())
            local = np.array([vocabulary.setdefault(t, len(vocabulary)) for t in encoded.dictionary.to_pylist()],
                             dtype=np.int32)
            term_ids.append(local[encoded.indices.to_numpy()] if len(encoded) else np.zeros(0, np.int32))
            weights = table.column('weights').combine_chunks().flatten().to_numpy()
            values.append(convert(weights) if convert else weights)
        indptr = np.zeros(len(docnos) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=indptr[1:])
        ids = np.concatenate(term_ids) if term_ids else np.zeros(0, np.int32)
        del term_ids
        values = np.concatenate(values) if values else (convert or np.asarray)(np.zeros(0, np.float64))
        # Arrow's allocator keeps the freed shards for reuse; the engines' builds come next, so they go back now.
        pa.default_memory_pool().release_unused()
        return docnos, list(vocabulary), indptr, ids, values

    def total_bytes(self) -> int:
        return sum(s['bytes'] for s in self.manifest['shards'])

    def verify(self) -> None:
        """Raises if a shard is missing or its size differs from the manifest's."""
        _check_shards(self.folder, self.manifest['shards'])


def _is_entry(shard) -> bool:
    return isinstance(shard, dict) and safe_relative(shard.get('file')) and all(
        isinstance(shard.get(k), int) and not isinstance(shard.get(k), bool) and shard[k] >= 0
        for k in ('num_docs', 'bytes'))


def _check_shards(folder: Path, shards: Iterable[dict]) -> None:
    for shard in shards:
        path = folder / shard['file']
        size = path.stat().st_size if path.exists() else None
        if size != shard['bytes']:
            raise ValueError(f'vector shard {path} is missing or has {size} bytes, expected {shard["bytes"]}')
