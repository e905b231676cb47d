"""The behaviour every public PyTerrier transformer of pyterrier-lsr guarantees (in the spirit of pyterrier_dr's
``_base_test``): ``check_transformer(transformer, inputs_kind)`` runs them all and fails naming the broken one.

Guarantees checked:

* a frame of ``inputs_kind`` keeps its rows and columns and gains the output columns; ``pt.inspect`` reports the
  input and output columns the transformer really has;
* an empty frame gives an empty frame with the same output columns;
* a missing input column raises ``pyterrier.validate.InputValidationError``;
* a re-ranker's result frame holds one query text per qid and each docno once per qid, with no missing qid
  (a ``ValueError`` naming the qid otherwise, rather than two queries ranked together);
* missing values (None, NaN, pd.NA in a ``string`` column) and blank texts give empty vectors (a re-ranker scores
  them 0); non-``str`` texts (bytes, lists, numbers) raise ``TypeError``; for vector inputs, a non-dict vector raises
  ``TypeError`` and a NaN weight ``ValueError``;
* non-ASCII texts encode, and texts of control characters only encode like ``''``; every output weight or score is a
  finite float;
* 4 threads calling the same transformer give exactly the sequential results.

Retrievers (one query in, a ranking out) have their own guarantees: :func:`check_retriever`.  A new transformer gets a
line in ``test_conformance.py`` (every model kind, every engine's retrievers); add a kind to ``KINDS`` if its input is
new.
"""
import math
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pyterrier as pt
import pytest

TEXTS = ['nuclear reactor physics', 'electron density in the ionosphere', 'dielectric constant of liquids',
         'radio wave noise in a transistor amplifier circuit', 'the cat sat on the mat']
VECTORS = [{'nuclear': 1.5, 'reactor': 0.75, 'physics': 0.25}, {'electron': 2.0, 'density': 0.5},
           {'dielectric': 1.0}, {'radio': 0.5, 'wave': 0.5, 'noise': 0.1, 'circuit': 1.25}, {}]
MISSING = [None, float('nan'), '', ' \t\n']
NOT_TEXT = [b'nuclear physics', ['nuclear', 'physics'], 5]
NON_ASCII = 'Über die Quantenmechanik: naïve café, 東京 and Ελληνικά'
CONTROL_ONLY = '\x00\x01\x07\x1b\x7f'


# kind -> (input columns, the columns holding the values that are checked, text or vector values)
KINDS = {
    'query': (['qid', 'query'], ['query'], 'text'),
    'doc': (['docno', 'text'], ['text'], 'text'),
    'result': (['qid', 'query', 'docno', 'text'], ['query', 'text'], 'text'),
    'stored_result': (['qid', 'query', 'docno'], ['query'], 'text'),  # a re-ranker of a store's documents, by docno
    'toks': (['docno', 'toks'], ['toks'], 'vector'),
    'query_toks': (['qid', 'query_toks'], ['query_toks'], 'vector'),
}


def _frame(kind: str, values) -> pd.DataFrame:
    columns, fields, _ = KINDS[kind]
    n = len(values)
    frame = pd.DataFrame({'qid': [f'q{i}' for i in range(n)], 'docno': [f'd{i}' for i in range(n)]})
    for field in fields:
        frame[field] = pd.Series(list(values), dtype=object)
    return frame[columns]


def _samples(kind: str):
    return TEXTS if KINDS[kind][2] == 'text' else VECTORS


def _empty_output(out: pd.DataFrame, outputs, row: int, what):
    for column in outputs:
        value = out[column].iloc[row]
        if column == 'score':
            assert value == 0, f'{what}: score {value} for an empty input, expected 0'
        elif isinstance(value, dict):
            assert value == {}, f'{what}: {column} = {value} for an empty input, expected {{}}'


def _finite_outputs(out: pd.DataFrame, outputs, what):
    for column in outputs:
        for value in out[column]:
            if isinstance(value, dict):
                assert all(isinstance(t, str) for t in value), f'{what}: non-str terms in {column}'
                assert all(isinstance(w, float) and math.isfinite(w) for w in value.values()), \
                    f'{what}: non-finite or non-float weights in {column}: {value}'
            elif column == 'score':
                assert math.isfinite(value), f'{what}: score {value}'


def check_transformer(transformer: pt.Transformer, inputs_kind: str, threads: int = 4, calls: int = 10):
    """Runs every guarantee of the module docs on ``transformer``, fed frames of ``inputs_kind`` (a key of
    :data:`KINDS`); ``calls`` single-row calls per thread in the thread check."""
    columns, fields, values = KINDS[inputs_kind]
    name = repr(transformer)
    frame = _frame(inputs_kind, _samples(inputs_kind))

    # a normal frame: rows and input columns kept, output columns added (vector transformers may rewrite their input)
    out = transformer(frame)
    outputs = [c for c in out.columns if c not in frame.columns] or (fields if values == 'vector' else [])
    assert outputs, f'{name} added no column'
    assert len(out) == len(frame), f'{name} returned {len(out)} rows for {len(frame)}'
    kept = [c for c in columns if c not in outputs]
    pd.testing.assert_frame_equal(out[kept].reset_index(drop=True), frame[kept], obj=f'{name} input columns')
    _finite_outputs(out, outputs, name)

    # pt.inspect sees the real columns
    inputs = pt.inspect.transformer_inputs(transformer)
    assert any(set(spec) <= set(columns) for spec in inputs), f'{name}: pt.inspect inputs {inputs} vs {columns}'
    assert pt.inspect.transformer_outputs(transformer, columns) == list(out.columns), f'{name}: pt.inspect outputs'

    # an empty frame keeps the output columns
    empty = transformer(frame.iloc[:0])
    assert len(empty) == 0 and list(empty.columns) == list(out.columns), \
        f'{name}: empty frame gave columns {list(empty.columns)}, expected {list(out.columns)}'

    # a missing input column is a validation error naming it
    for field in fields:
        with pytest.raises(pt.validate.InputValidationError):
            transformer(frame.drop(columns=[field]))

    # missing values and wrong types, in each value column, at row 1 of 3
    for field in fields:
        def with_value(value, dtype=object):
            changed = _frame(inputs_kind, _samples(inputs_kind)[:3])
            changed[field] = pd.Series([changed[field][0], value, changed[field][2]], dtype=dtype)
            return changed
        for missing in MISSING[:2] + (MISSING[2:] if values == 'text' else []):
            _empty_output(transformer(with_value(missing)), outputs, 1, f'{name} given {field}={missing!r}')
        if values == 'text':
            _empty_output(transformer(with_value(pd.NA, 'string')), outputs, 1, f'{name} given {field}=pd.NA')
            for wrong in NOT_TEXT:
                with pytest.raises(TypeError):
                    transformer(with_value(wrong))
            _finite_outputs(transformer(with_value(NON_ASCII)), outputs, f'{name} given non-ASCII text')
            control, blank = transformer(with_value(CONTROL_ONLY)), transformer(with_value(''))
            for column in outputs:
                assert control[column].iloc[1] == blank[column].iloc[1], \
                    f"{name}: a control-character text gives {column}={control[column].iloc[1]}, unlike ''"
        else:
            for wrong in ['nuclear physics', 5]:
                with pytest.raises(TypeError):
                    transformer(with_value(wrong))
            with pytest.raises(ValueError, match='nuclear'):
                transformer(with_value({'nuclear': float('nan')}))

    if 'docno' in columns and 'qid' in columns:  # one query per qid, each document once per query, no missing qid
        for change, message in [({'query': TEXTS[1]}, "qid 'q0' has two query texts"),
                                ({'docno': 'd0'}, "docno 'd0' occurs twice for qid 'q0'"),
                                ({'qid': None}, 'qid of row 1 is missing')]:
            rows = pd.concat([frame.iloc[[0]], frame.iloc[[0]].assign(**change)], ignore_index=True)
            if 'docno' not in change:  # another document of the frame (a stored re-ranker knows no other)
                rows.loc[1, 'docno'] = frame['docno'][1]
            with pytest.raises(ValueError, match=message):
                transformer(rows)

    # threads: the same single-row calls from 4 threads give the sequential results exactly
    _same_from_threads(transformer, [frame.iloc[[i % len(frame)]].reset_index(drop=True) for i in range(calls)],
                       threads, name)


def _same_from_threads(transformer, rows, threads: int, name: str):
    expected = [transformer(row) for row in rows]
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda _: [transformer(row) for row in rows], range(threads)))
    for result in results:
        for got, want in zip(result, expected):
            pd.testing.assert_frame_equal(got, want, obj=f'{name} from {threads} threads')


def check_retriever(retriever: pt.Transformer, inputs_kind: str, num_results: int, samples=None, threads: int = 4):
    """The guarantees of a retriever (one query in, up to ``num_results`` ranked documents out), fed frames of
    ``inputs_kind`` (``'query'`` for text, ``'query_toks'`` for vectors; ``samples``: 4 input values, default the
    module's texts or vectors):

    * ``qid, docno, score, rank`` plus the input's other columns (not ``query_toks``), in that order, on every frame,
      the empty one included, as ``pt.inspect`` reports; at most ``num_results`` rows per query, ranks 0, 1, ... in
      descending score order, finite scores, ``str`` docnos, no docno twice for a query;
    * a query that matches nothing (an empty vector, a blank text) gives no rows, and other queries are unaffected;
    * a missing input column is a validation error; a non-dict vector a ``TypeError``, a NaN weight a ``ValueError``;
    * a query frame holds one row per query: a duplicate qid (``1`` and ``'1'`` alike) or a missing one is a
      ``ValueError`` naming it, rather than two rankings served under one qid; 4 threads give the sequential results
      exactly.
    """
    columns, fields, values = KINDS[inputs_kind]
    name = repr(retriever)
    frame = _frame(inputs_kind, samples if samples is not None else _samples(inputs_kind)[:4])
    out = retriever(frame)
    extra = [c for c in frame.columns if c not in ('qid', 'query_toks')]
    assert list(out.columns)[:1] == ['qid'] and {'docno', 'score', 'rank'} <= set(out.columns), \
        f'{name}: columns {list(out.columns)}'
    assert set(extra) <= set(out.columns) and 'query_toks' not in out.columns, f'{name}: columns {list(out.columns)}'
    assert len(out), f'{name} retrieved nothing for {frame}'
    for qid, group in out.groupby('qid', sort=False):
        assert len(group) <= num_results, f'{name}: {len(group)} rows for {qid}, num_results={num_results}'
        assert list(group['rank']) == list(range(len(group))), f'{name}: ranks {list(group["rank"])}'
        scores = list(group['score'])
        assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores), f'{name}: {scores}'
        assert group['docno'].map(type).eq(str).all() and group['docno'].is_unique, f'{name}: docnos of {qid}'
    assert pt.inspect.transformer_outputs(retriever, columns) == list(out.columns), f'{name}: pt.inspect outputs'
    empty = retriever(frame.iloc[:0])
    assert len(empty) == 0 and list(empty.columns) == list(out.columns), f'{name}: empty frame columns'
    for field in fields:
        with pytest.raises(pt.validate.InputValidationError):
            retriever(frame.drop(columns=[field]))

    # nothing to match: no rows for that query, the same rows for the others
    nothing = frame.copy()
    nothing[fields[0]] = pd.Series([frame[fields[0]][0], {} if values == 'vector' else ' ', *frame[fields[0]][2:]],
                                   dtype=object)
    got = retriever(nothing)
    assert 'q1' not in set(got['qid']), f'{name}: rows for a query that matches nothing'
    pd.testing.assert_frame_equal(got.reset_index(drop=True),
                                  out[out['qid'] != 'q1'].reset_index(drop=True), obj=f'{name} other queries')
    if values == 'vector':
        for wrong in ['nuclear physics', 5]:
            with pytest.raises(TypeError):
                retriever(frame.assign(query_toks=[wrong] * len(frame)))
        with pytest.raises(ValueError, match='nuclear'):
            retriever(frame.assign(query_toks=[{'nuclear': float('nan')}] * len(frame)))

    # one row per query: a duplicate qid (1 and '1' are one qid once evaluated) or a missing one is refused, naming it
    for qids, message in [(['q0', 'q0'], "qid 'q0' occurs twice"), ([1, '1'], "qid '1' occurs twice"),
                          (['q0', None], 'qid of row 1 is missing'), (['q0', float('nan')], 'qid of row 1 is missing')]:
        with pytest.raises(ValueError, match=message):
            retriever(frame.iloc[:2].assign(qid=pd.Series(qids, dtype=object)))

    _same_from_threads(retriever, [frame.iloc[[i]].reset_index(drop=True) for i in range(len(frame))], threads, name)
