"""Test collections by one name: an ``irds:`` dataset id or a folder of plain files.

A folder holds three files, read strictly (a course assignment starts from them, and a silently misread line would
shift or drop documents, queries or judgements):

* ``docs.jsonl``: one JSON object per line with a string ``docno`` and a string ``text`` (other fields are ignored);
  docnos are never converted (``7`` and ``null`` are errors, write ``"7"``) and must be unique;
* ``topics.tsv``: ``qid<TAB>query`` per line; a query may not contain a tab, qids are unique; a first line that
  names the columns (``qid<TAB>query``, or ``query_id``/``id`` and ``text``, in any case) is a header, skipped;
* ``qrels.txt``: TREC qrels, ``qid iteration docno label`` separated by whitespace, the label an integer; each
  (qid, docno) pair judged once.

All three are UTF-8 (a byte-order mark at the start of a line is dropped: files joined with ``cat`` keep each one's
mark) with LF or CRLF line ends; blank lines (empty or
whitespace only, e.g. a trailing one) are skipped.  Anything else is a ``ValueError`` (or the ``TypeError`` of
:func:`~.checks.check_docno`) naming the file, the line and the field.  ``irds:<id>`` is read through PyTerrier's
ir_datasets bridge, its documents checked the same way (:func:`~.checks.check_documents`).
"""
import codecs
import gzip
import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .checks import UniqueDocnos, check_docno, check_documents, check_int

_INTEGER = re.compile(r'[+-]?[0-9]+')
# Relevance labels are stored as int64 and read by trec_eval-style tools as C ints: anything outside is a typo.
LABEL_RANGE = (-2 ** 31, 2 ** 31 - 1)


@dataclass
class Collection:
    """A test collection in memory, as :func:`load_collection` returns it.

    Args:
        name: the dataset id or the folder's name.
        corpus: the documents, ``{'docno', 'text'}`` dicts in collection order (what indexers and builders take).
        topics: ``qid, query`` (PyTerrier's topics frame).
        qrels: ``qid, docno, label`` (PyTerrier's qrels frame).

    Example::

        vaswani = load_collection("irds:vaswani")
        small = vaswani.subset(docs=1000, topics=30)      # relevant documents first, for a quick run
        pt.Experiment([retriever], small.topics, small.qrels, [nDCG @ 10])
    """
    name: str
    corpus: list[dict]
    topics: pd.DataFrame
    qrels: pd.DataFrame

    def subset(self, docs: int | None = None, topics: int | None = None) -> 'Collection':
        """A smaller collection for quick runs: the first ``topics`` topics, and a corpus of ``docs`` documents
        made of the documents judged relevant to those topics first (so every query has something to find, up to
        ``docs`` of them), then the collection's first other documents; the corpus keeps collection order and the
        qrels keep only the chosen topics and documents.  ``None`` keeps all of either."""
        docs = None if docs is None else check_int('docs', docs, 1)
        topics = None if topics is None else check_int('topics', topics, 1)
        chosen = self.topics if topics is None else self.topics.head(topics)
        qrels = self.qrels[self.qrels['qid'].isin(set(chosen['qid']))]
        corpus = self.corpus
        if docs is not None and docs < len(corpus):
            held = {d['docno'] for d in corpus}  # judged documents missing from the corpus take no place
            relevant = [d for d in dict.fromkeys(qrels.loc[qrels['label'] > 0, 'docno']) if d in held][:docs]
            keep = set(relevant)
            others = (d['docno'] for d in corpus if d['docno'] not in keep)
            keep.update(itertools.islice(others, docs - len(keep)))
            corpus = [d for d in corpus if d['docno'] in keep]
            qrels = qrels[qrels['docno'].isin(keep)]
        name = f'{self.name}[{len(corpus)} docs, {len(chosen)} topics]'
        return Collection(name, corpus, chosen.reset_index(drop=True), qrels.reset_index(drop=True))


def corpus_key(docs: dict[str, str]) -> str:
    """A short digest of a corpus (``{docno: text}``, in order): the key of caches and builds made from it."""
    # one JSON pair a document: separators inside docnos and texts cannot make two corpora alike, and a lone
    # surrogate is escaped rather than failing to encode
    digest = hashlib.sha1('\n'.join(json.dumps([d, t]) for d, t in docs.items()).encode()).hexdigest()
    return hashlib.sha1(json.dumps([len(docs), digest]).encode()).hexdigest()[:12]


def irds_dataset(dataset_id: str):
    """``ir_datasets.load(dataset_id)``, or a one-line ``ValueError`` when ir_datasets has no such id (ir_datasets
    itself raises a bare ``KeyError``)."""
    import ir_datasets
    if dataset_id not in ir_datasets.registry:
        raise ValueError(f'irds:{dataset_id} is not an ir_datasets id (see https://ir-datasets.com for the ids)')
    return ir_datasets.load(dataset_id)


def load_collection(spec: str) -> Collection:
    """The corpus (a list of ``{docno, text}`` dicts, in collection order), topics and qrels of ``spec``.

    Args:
        spec: ``"irds:<id>"`` (an ir_datasets id, read through PyTerrier; offline with ``IR_DATASETS_HOME`` set to a
            prepared cache) or a folder holding ``docs.jsonl``, ``topics.tsv`` and ``qrels.txt`` (the format in
            this module's documentation).

    Returns:
        A :class:`Collection`.

    Raises:
        ValueError: an ``irds:`` id that ir_datasets does not know.
        FileNotFoundError: a folder without the three files (naming the missing ones).
        ValueError, TypeError: a malformed line of a file, naming the file, the line and the field.

    Example::

        from pyterrier_lsr import load_collection
        cisi = load_collection("path/to/cisi")
        index.index(cisi.corpus)
    """
    spec = str(spec)
    if spec.startswith('irds:'):
        import pyterrier as pt
        irds_dataset(spec[len('irds:'):])
        dataset = pt.get_dataset(spec)
        docs = check_documents(dataset.get_corpus_iter(verbose=False), where=spec)
        corpus = [{'docno': docno, 'text': text} for docno, text in docs]
        return Collection(spec[len('irds:'):], corpus, dataset.get_topics(), dataset.get_qrels())
    folder = Path(spec)
    missing = [f for f in ('docs.jsonl', 'topics.tsv', 'qrels.txt') if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f'{spec} is neither an irds: id nor a collection folder (missing {missing})')
    return Collection(folder.name, read_docs(folder / 'docs.jsonl'), read_topics(folder / 'topics.tsv'),
                      read_qrels(folder / 'qrels.txt'))


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the non-blank lines of ``path`` (gzip-compressed when its name ends in ``.gz``),
    decoded strictly as UTF-8, without their LF or CRLF end.  A BOM starting a line is dropped, on every line: two
    files joined end to end keep the second one's BOM, which would otherwise become part of a qid or docno that then
    matches nothing.  Split on LF bytes only: a JSON text may hold U+2028 or a form feed, which ``str.splitlines``
    would take for line ends."""
    opener = gzip.open if str(path).endswith('.gz') else open
    with opener(path, 'rb') as f:
        for number, raw in enumerate(f, 1):
            if raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                line = raw.decode('utf8')
            except UnicodeDecodeError as ex:
                raise ValueError(f'{path}, line {number}: not valid UTF-8 (byte {raw[ex.start:ex.start + 1]!r} at '
                                 f'column {ex.start + 1}); save the file as UTF-8') from None
            line = line[:-1] if line.endswith('\n') else line
            line = line[:-1] if line.endswith('\r') else line
            if line.strip():
                yield number, line


def _json_type(value) -> str:
    names = {dict: 'object', list: 'array', str: 'string', bool: 'boolean', type(None): 'null'}
    return names.get(type(value), 'number')


def json_records(path, what: str) -> Iterator[tuple[str, dict]]:
    """``(where, record)`` for each non-blank line of a JSON Lines file (``where``: ``"<path>, line <n>"``), each
    line decoded as :func:`_lines` does and required to be a JSON object (``what``: what the object should hold, for
    the error)."""
    for number, line in _lines(Path(path)):
        where = f'{path}, line {number}'
        try:
            record = json.loads(line)
        except json.JSONDecodeError as ex:
            raise ValueError(f'{where}: not valid JSON ({ex.msg} at column {ex.colno})') from None
        except (ValueError, RecursionError) as ex:  # an integer of thousands of digits, nesting too deep
            raise ValueError(f'{where}: JSON that cannot be read ({type(ex).__name__}: {ex})') from None
        if not isinstance(record, dict):
            raise ValueError(f'{where}: a JSON {_json_type(record)}, not an object with {what}')
        yield where, record


def read_docs(path) -> list[dict]:
    """The documents of a ``docs.jsonl`` file as ``{docno, text}`` dicts, in file order, checked line by line."""
    path, unique, corpus = Path(path), UniqueDocnos(str(path)), []
    for where, record in json_records(path, '"docno" and "text"'):
        for field in ('docno', 'text'):
            if field not in record:
                raise ValueError(f'{where}: no "{field}" field (the record has {sorted(record)})')
        docno = unique.add(record['docno'], f'{where}: docno')
        if not isinstance(record['text'], str):
            raise ValueError(f'{where}: "text" is a JSON {_json_type(record["text"])}, not a string')
        corpus.append({'docno': docno, 'text': record['text']})
    return corpus


# A first line naming the columns (pandas' to_csv and spreadsheets write one) is a header, not a topic whose qid is
# "qid": read as a topic, it would match no judgement and lower every mean without an error.
TOPICS_HEADER_QIDS = ('qid', 'query_id', 'id')
TOPICS_HEADER_QUERIES = ('query', 'text')


def read_topics(path) -> pd.DataFrame:
    """The ``qid, query`` frame of a ``topics.tsv`` file, in file order, checked line by line; a header line first
    (``qid<TAB>query``, see the module) is skipped."""
    path, rows, seen = Path(path), [], {}
    for index, (number, line) in enumerate(_lines(path)):
        where = f'{path}, line {number}'
        fields = line.split('\t')
        if index == 0 and len(fields) == 2 and fields[0].strip().lower() in TOPICS_HEADER_QIDS \
                and fields[1].strip().lower() in TOPICS_HEADER_QUERIES:
            continue
        if len(fields) != 2:
            raise ValueError(f'{where}: {len(fields)} tab-separated fields; a topic is qid<TAB>query (one tab: a '
                             'query may not contain a tab)')
        qid, query = fields
        if not qid or qid != qid.strip():
            raise ValueError(f'{where}: qid {qid!r} is empty or has surrounding whitespace')
        if qid in seen:
            raise ValueError(f'{where}: qid {qid!r} occurs twice (first on line {seen[qid]}); qids must be unique')
        if not query.strip():
            raise ValueError(f'{where}: the query of qid {qid!r} is empty')
        seen[qid] = number
        rows.append((qid, query))
    return pd.DataFrame(rows, columns=['qid', 'query'], dtype=str)


def read_qrels(path) -> pd.DataFrame:
    """The ``qid, docno, label`` frame (label an int) of a TREC qrels file, in file order, checked line by line."""
    path, rows, seen = Path(path), [], {}
    for number, line in _lines(path):
        where = f'{path}, line {number}'
        fields = line.split()
        if len(fields) != 4:
            raise ValueError(f'{where}: {len(fields)} fields; a TREC qrels line has 4 (qid, iteration, docno, label) '
                             'separated by whitespace')
        qid, _, docno, label = fields
        check_docno(docno, f'{where}: docno')
        if not _INTEGER.fullmatch(label):
            raise ValueError(f'{where}: label {label!r} is not an integer (relevance labels are 0, 1, 2...)')
        if len(label) > 12 or not LABEL_RANGE[0] <= int(label) <= LABEL_RANGE[1]:  # int() of 5,000 digits fails
            raise ValueError(f'{where}: label {label:.30} is out of range (relevance labels are small integers, '
                             f'{LABEL_RANGE[0]} to {LABEL_RANGE[1]} at most)')
        if (qid, docno) in seen:
            raise ValueError(f'{where}: qid {qid!r} and docno {docno!r} are judged twice (first on line '
                             f'{seen[qid, docno]})')
        seen[qid, docno] = number
        rows.append((qid, docno, int(label)))
    qrels = pd.DataFrame(rows, columns=['qid', 'docno', 'label'])
    return qrels.astype({'qid': str, 'docno': str, 'label': 'int64'})
