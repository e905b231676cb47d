"""The checks every surface applies to user input before any work: parameters, docnos, terms and weights.

Each check returns the value in its canonical form or raises one error (``TypeError`` for the wrong type,
``ValueError`` for a value out of range) whose message names the argument and says what is allowed, so that native
code (PISA, BMP, Seismic) and long jobs never see an unchecked value.

The rules shared by every index, store and encoder:

* **docnos** are non-empty ``str`` without surrounding whitespace, line breaks or NUL; anything else (None, NaN,
  pd.NA, bytes, numbers, lists) is refused rather than turned into a string, so ``1`` and ``'1'`` never collide;
  duplicates within one collection are an error naming the first one (:class:`UniqueDocnos`);
* **terms** are non-empty ``str`` without whitespace or NUL;
* **weights** are finite numbers in ``[0, MAX_WEIGHT]``;
* **qids**: a query frame given to a retriever holds one row per query (:func:`check_query_frame`), a result frame
  given to a re-ranker one query text per qid and each docno once per qid (:func:`check_result_frame`); a missing
  qid is refused, and qids are compared as strings (``1`` and ``'1'`` are one qid, as they are once evaluated).
  Otherwise two queries' rankings would be served under one qid, or ranked together, and merged silently downstream.
"""
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyterrier_alpha as pta

# The largest term weight (model units) that an index, a query or a query table accepts. PISA repeats a query term
# int(w * scale) times (a weight of 1e7 runs for minutes, inf aborts the process) and stores impacts as 32-bit
# integers. No model comes near it: log(1 + relu(x)) of any float32 logit is below 89, BM25's idf is below 20 for a
# billion documents, and Latent Terms' summed activations of a 256-token text stay in the hundreds at most.
MAX_WEIGHT = 1000.0
# The largest index scale: impacts int(w * scale) of weights up to MAX_WEIGHT then fit PISA's and the engines' 32 bits.
MAX_SCALE = (2 ** 31 - 1) / MAX_WEIGHT

__all__ = ['MAX_WEIGHT', 'MAX_SCALE', 'WeightError', 'check_int', 'check_float', 'check_choice', 'check_bool',
           'check_str', 'checked_batch_size', 'check_bm25', 'check_docno', 'UniqueDocnos', 'check_docnos', 'documents',
           'check_document', 'check_documents', 'check_term', 'check_weights', 'check_vector', 'is_missing',
           'check_query_frame', 'check_result_frame', 'check_matrix', 'check_max_length', 'check_not_text',
           'column_array']


def is_missing(value) -> bool:
    """None, NaN (float or numpy) and pandas' NA/NaT: a value that is not there."""
    return (
        value is None
        or value is pd.NA
        or value is pd.NaT
        or (isinstance(value, (float, np.floating)) and math.isnan(value))
    )


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]`` (either bound optional); bools and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f'{name} must be an integer, got {type(value).__name__} {value!r:.40}')
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f'{name} must be {_range(minimum, maximum)}, got {value}')
    return value


def check_float(name: str, value, minimum: float | None = None, maximum: float | None = None,
                exclusive_minimum: bool = False, exclusive_maximum: bool = False) -> float:
    """``value`` as a finite ``float`` in the range (bounds optional, inclusive unless said); bools refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f'{name} must be a number, got {type(value).__name__} {value!r:.40}')
    value = float(value)
    low = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
    high = maximum is not None and (value >= maximum if exclusive_maximum else value > maximum)
    if not math.isfinite(value) or low or high:
        bounds = _range(minimum, maximum, exclusive_minimum, exclusive_maximum)
        raise ValueError(f'{name} must be a finite number{" " + bounds if bounds != "any" else ""}, got {value}')
    return value


def check_choice(name: str, value, choices: Sequence):
    """``value`` if it is one of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # unhashable
        ok = False
    if not ok:
        raise ValueError(f'{name} must be one of {", ".join(repr(c) for c in choices)}; got {value!r:.60}')
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f'{name} must be True or False, got {type(value).__name__} {value!r:.40}')
    return bool(value)


def checked_batch_size(value, default: int) -> int:
    """A per-call ``batch_size``: ``default`` for None, else an integer >= 1 (``0``, ``2.5`` and ``'8'`` are errors,
    not the default silently)."""
    return default if value is None else check_int('batch_size', value, 1)


def check_bm25(k1, b) -> tuple[float, float]:
    """BM25's ``k1`` (a number >= 0) and ``b`` (a number in [0, 1]) as floats; strings (``"0.9"``), bools, NaN and
    values out of range are refused here, before native code sees them."""
    return check_float('k1', k1, minimum=0), check_float('b', b, 0, 1)


def check_settings(name: str, value, what: str) -> dict:
    """``value``, a dict of keyword settings (``what`` says whose), or ``{}`` for None."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f'{name} must be a dict of {what} settings, got {type(value).__name__}')
    return value


def check_str(name: str, value, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f'{name} must be a string, got {type(value).__name__} {value!r:.40}')
    if not allow_empty and not value:
        raise ValueError(f'{name} must be a non-empty string')
    return value


def _range(minimum, maximum, exclusive_minimum=False, exclusive_maximum=False) -> str:
    low = None if minimum is None else f'{">" if exclusive_minimum else ">="} {minimum}'
    high = None if maximum is None else f'{"<" if exclusive_maximum else "<="} {maximum}'
    if low and high:
        return f'{low} and {high}'
    return low or high or 'any'


def check_docno(docno, where: str = 'docno') -> str:
    """``docno`` if it is a non-empty ``str`` an index can store (one per line), else an error naming it."""
    if is_missing(docno):
        raise ValueError(f'{where} is missing ({docno!r}); every document needs a docno')
    if not isinstance(docno, str):
        raise TypeError(f'{where} {docno!r:.60} is a {type(docno).__name__}; docnos must be strings, never converted '
                        'here (convert them yourself, e.g. df.docno.astype(str), or write "7" rather than 7 in a '
                        'JSON file, so that 1 and "1" cannot collide)')
    if not docno or docno != docno.strip() or any(c in docno for c in '\n\r\x00'):
        raise ValueError(f'{where} {docno!r:.60} is empty, has surrounding whitespace or contains a line break or '
                         'NUL, which an index cannot store')
    if not docno.isascii():
        try:
            docno.encode('utf-8')
        except UnicodeEncodeError:
            raise ValueError(f'{where} {docno!r:.60} holds a lone surrogate (invalid Unicode), which no index file '
                             'can store; decode the docnos properly') from None
    return str(docno)


class UniqueDocnos:
    """Checks docnos one by one (:func:`check_docno`) and refuses the first duplicate, naming it."""

    def __init__(self, where: str = 'the collection'):
        self.seen = set()
        self.where = where

    def add(self, docno, where: str = 'docno') -> str:
        """``docno`` checked and new; ``where`` names it in errors (e.g. ``'docs.jsonl, line 3: docno'``)."""
        docno = check_docno(docno, where)
        if docno in self.seen:
            raise ValueError(f'{where} {docno!r} occurs twice in {self.where}; docnos must be unique')
        self.seen.add(docno)
        return docno


def documents(it, fields: Sequence[str], where: str):
    """The documents given to an indexer's ``index(it)``, each checked as it is read: an iterable of dicts or a
    DataFrame (its rows as dicts: iterating a frame would yield its column names); strings and single dicts are
    refused.  Every document must be a dict holding ``fields`` (a ``TypeError`` / ``KeyError`` naming the document's
    position and the columns it has).  Returns ``(iterator, number of documents or None)``: nothing is read ahead."""
    if isinstance(it, pd.DataFrame):
        columns = list(it.columns)
        missing = [c for c in fields if c not in columns]
        if missing:
            raise KeyError(f'{where}: documents must have columns {missing}; the DataFrame has {columns}')
        rows = (dict(zip(columns, row)) for row in it.itertuples(index=False, name=None))
        return rows, len(it)
    if isinstance(it, (str, bytes, Mapping)) or not isinstance(it, Iterable):
        raise TypeError(f'{where}: index() takes an iterable of documents (dicts with {list(fields)}) or a DataFrame, '
                        f'got {type(it).__name__}')

    def checked():
        for position, doc in enumerate(it):
            yield check_document(doc, position, fields, where)
    return checked(), (len(it) if hasattr(it, '__len__') else None)


def check_document(doc, position: int, fields: Sequence[str], where: str) -> Mapping:
    """``doc`` if it is a dict holding ``fields``, else an error naming its position and what it holds."""
    if not isinstance(doc, Mapping):
        raise TypeError(f'{where}: document {position} is a {type(doc).__name__}, not a dict with {list(fields)}')
    missing = [c for c in fields if c not in doc]
    if missing:
        raise KeyError(f'{where}: documents must have columns {missing}; document {position} has {sorted(doc)}')
    return doc


def check_docnos(docnos: Iterable, where: str = 'the collection') -> list:
    """Every docno checked, unique; the first duplicate is an error naming it."""
    unique = UniqueDocnos(where)
    return [unique.add(d) for d in docnos]


def check_documents(docs, text_field: str = 'text', where: str = 'the corpus') -> list[tuple[str, str]]:
    """``(docno, text)`` of every document of ``docs`` (as :func:`documents` reads them: dicts or a DataFrame), read
    once and checked before any work: docnos as :class:`UniqueDocnos` checks them, texts strings (a missing one, None
    or NaN, is the empty text, as an index encodes it); an empty corpus is an error too.  Errors name the document's
    position."""
    rows, _ = documents(docs, ('docno', text_field), where)
    unique, pairs = UniqueDocnos(where), []
    for position, doc in enumerate(rows):
        text = doc[text_field]
        if is_missing(text):
            text = ''
        elif not isinstance(text, str):
            raise TypeError(f'document {position} of {where}: {text_field} is a {type(text).__name__} '
                            f'{text!r:.40}, not a string')
        pairs.append((unique.add(doc['docno'], f'document {position} of {where}: docno'), text))
    if not pairs:
        raise ValueError(f'{where} holds no documents; cannot index an empty collection')
    return pairs


class WeightError(ValueError, TypeError):
    """A ``{term: weight}`` vector an index cannot store: not a mapping, a term that is not a non-empty string without
    whitespace or NUL, or a weight that is not a number in ``[0, MAX_WEIGHT]``.  Both a ``ValueError`` and a
    ``TypeError`` (like numpy's ``AxisError``), so callers catching either see it."""


def check_term(term, where: str = 'term') -> str:
    # str.split() cuts at exactly the characters str.isspace() accepts, in C: every stored document's terms pass here
    # (a character loop in Python cost ~4 us a term, minutes at a million documents).
    if not isinstance(term, str) or '\x00' in term or term.split() != [term]:
        raise WeightError(f'{where}: term {term!r:.60} is not a non-empty string without whitespace or NUL')
    return term


def check_weights(weights, where: str = 'query weights') -> dict[str, float]:
    """``weights`` as a new ``{term: float}`` dict, or :class:`WeightError` naming ``where`` and the bad term
    (NaN, infinities, negatives, strings and booleans are refused; see :data:`MAX_WEIGHT` for why there is a cap:
    PISA repeats a query term ``int(w * scale)`` times, so an unbounded weight hangs or exhausts memory)."""
    if not isinstance(weights, Mapping):
        raise WeightError(f'{where}: must be a {{term: weight}} mapping, got {type(weights).__name__}')
    checked = {}
    for term, weight in weights.items():
        check_term(term, where)
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)):
            raise WeightError(
                f'{where}: the weight of term {term!r} is {type(weight).__name__} {weight!r:.40}, not a number'
            )
        if not 0 <= weight <= MAX_WEIGHT:  # also False for NaN
            raise WeightError(
                f'{where}: the weight of term {term!r} is {weight!r}; weights must lie in [0, {MAX_WEIGHT:g}]'
            )
        checked[term] = float(weight)
    return checked


def check_vector(vector, where: str) -> dict[str, float]:
    """Like :func:`check_weights`; a missing vector (None/NaN) is an empty one."""
    if is_missing(vector):
        return {}
    return check_weights(vector, where)


def check_max_length(name: str, value, tokenizer, default: int) -> int:
    """A truncation length: an int from 3 (a special token on each side and one real token: anything shorter
    encodes every text as empty) up to the tokenizer's ``model_max_length`` (the model has no positions past it: a
    longer text would crash inside the model at encoding time, not here).  Tokenizers that set no limit (transformers
    then reports ~1e30) set no upper bound.  ``None``: ``default``, or the limit when it is smaller (a small model's
    own length, not an error for a setting the user never gave)."""
    limit = getattr(tokenizer, 'model_max_length', None)
    limit = limit if isinstance(limit, int) and limit < 1_000_000 else None
    if value is None:
        return default if limit is None else min(default, limit)
    return check_int(name, value, 3, limit)


def check_matrix(name: str, array) -> np.ndarray:
    """``array`` as a 2-d float numpy array (rows x dim) of finite values, else an error naming ``name``: token
    embeddings to store or to train an SAE on (NaN would train or score silently)."""
    array = np.asarray(array)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f'{name} must be a 2-d float array (rows x dim), got shape {array.shape} of {array.dtype}')
    if not np.isfinite(array).all():
        raise ValueError(f'{name} must be finite (no NaN or infinity)')
    return array


def column_array(frame: pd.DataFrame, name: str):
    """The array of ``frame``'s column ``name`` without the Series ``frame[name]`` builds (20 us in pandas 3: most
    of what reading one query's text from a one-row frame costs), through pandas' own accessor where it has one."""
    get = getattr(frame, '_get_column_array', None)
    if get is None or not frame.columns.is_unique:
        return frame[name].array
    return get(frame.columns.get_loc(name))


def _qid_keys(frame: pd.DataFrame, where: str) -> list:
    """The qids of ``frame`` as strings (the form they are evaluated in); a missing qid is an error naming its row.
    Plain lists, not pandas: a one-query call (the engines' per-query timing) pays about a microsecond."""
    qids = column_array(frame, 'qid').tolist()
    for row, qid in enumerate(qids):
        if is_missing(qid):
            raise ValueError(f'{where}: the qid of row {row} is missing ({qid!r}); every query needs a qid')
    return [str(qid) for qid in qids]


def check_not_text(inp, what: str = 'a retriever') -> None:
    """A string where a frame of queries belongs: ``retriever.transform("radio waves")``, or ``retriever("radio
    waves")``, whose characters PyTerrier makes into the rows of a one-column frame.

    Raises:
        TypeError: naming what takes a frame, and the call that was meant (``.search("radio waves")``).
    """
    text = inp if isinstance(inp, str) else None
    if text is None and isinstance(inp, pd.DataFrame) and list(inp.columns) == [0] and len(inp) \
            and all(isinstance(c, str) and len(c) == 1 for c in inp[0]):
        text = ''.join(inp[0])
    if text is not None:
        raise TypeError(f'{what} takes a frame of queries (columns qid and query), not a string; for one query, '
                        f'use .search({text!r}), which returns its ranking')


def check_query_frame(frame: pd.DataFrame, extra_columns: Sequence[str], where: str = 'the query frame') -> None:
    """A retriever's input: ``qid`` plus ``extra_columns`` (an ``InputValidationError`` otherwise, or the TypeError
    of :func:`check_not_text` for a string), one row per query; the first duplicate qid is an error naming it."""
    check_not_text(frame)
    pta.validate.query_frame(frame, extra_columns=list(extra_columns))
    keys = _qid_keys(frame, where)
    if len(set(keys)) != len(keys):
        seen = set()
        for qid in keys:
            if qid in seen:
                raise ValueError(f'qid {qid!r} occurs twice in {where}; a retriever takes one row per query '
                                 '(drop or rename the duplicates)')
            seen.add(qid)


def _text_key(value) -> str:
    return value if isinstance(value, str) else '' if is_missing(value) else repr(value)


def check_result_frame(frame: pd.DataFrame, extra_columns: Sequence[str], where: str = 'the result frame') -> None:
    """A re-ranker's input: ``qid, docno`` plus ``extra_columns`` (an ``InputValidationError`` otherwise), one query
    text per qid and each docno once per qid; the first offending qid is an error naming it."""
    pta.validate.result_frame(frame, extra_columns=list(extra_columns))
    keys = _qid_keys(frame, where)
    if 'query' in frame.columns:
        queries = frame['query'].map(_text_key)
        pairs = pd.DataFrame({'qid': keys, 'query': queries.to_numpy()}).drop_duplicates()
        twice = pairs['qid'].duplicated().to_numpy()
        if twice.any():
            qid = pairs['qid'].iloc[int(twice.argmax())]
            texts = pairs.loc[pairs['qid'] == qid, 'query'].tolist()[:2]
            raise ValueError(f'qid {qid!r} has two query texts in {where} ({texts[0]!r:.40} and {texts[1]!r:.40}); '
                             'one qid is one query')
    docs = pd.DataFrame({'qid': keys, 'docno': frame['docno'].astype(str).to_numpy()})
    twice = docs.duplicated().to_numpy()
    if twice.any():
        qid, docno = docs.iloc[int(twice.argmax())]
        raise ValueError(f'docno {docno!r} occurs twice for qid {qid!r} in {where}; a re-ranker scores each document '
                         'once per query')
