"""Engine settings chosen for the user: :meth:`LsrIndex.tune <pyterrier_lsr.LsrIndex.tune>` and the record it keeps.

``index.tune(topics)`` encodes the tuning queries once with the query encoder (the index model's, or
``query_encoder=``), ranks them exactly (PISA's top ``k``, ties included: a document scoring at least the exact
``k``-th score counts as found), then measures every setting of ``GRIDS`` on every engine built in the index,
cheapest first: CPU milliseconds per query (this process, all its threads, the engines' native code included; one
batched call after a warm-up, or one call per query with ``one_a_call=True``, the least of ``repeats`` passes) and
R@``k`` against that exact ranking. The cheapest setting whose R@``k`` reaches ``target_recall`` is recorded in the
index folder (``tuning.json``, written atomically), under the identity of the query encoder: an IDF query side's
choice is never served to SPLADE queries. The record holds the engine, its settings, the queries' count and digest,
the CPU model, the date, the build it was measured on and the engine's build settings; ``index.retriever()`` uses it
while these still hold (an index rebuilt, or the engine rebuilt with other settings, drops it), and an explicit
``engine=`` (or engine parameters) always wins.

The grids (query-time settings only; build settings such as BMP's block size stay the user's):

* ``pisa``: ``block_max_maxscore``, ``block_max_wand``, ``maxscore`` (all exact);
* ``bmp``: ``beta`` 0.8 then 1, each with ``alpha`` 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1 (``alpha = beta = 1`` exact);
* ``seismic``: ``query_cut`` 3, 5, 8, 10, 15, 20, 30, 50, each with ``heap_factor`` 1, 0.9, 0.8, 0.7, 0.5.

The CPU times are those of the machine and load of the tuning run: on a shared machine they carry its noise, which
``repeats`` reduces. The recall is measured at depth ``k`` only; retrieving deeper with the chosen setting is not
covered by the target.
"""
import hashlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt

from ..core import storage
from ..core.checks import check_bool, check_float, check_int, check_query_frame
from ..core.quiet import quiet_native

__all__ = ['GRIDS', 'TUNING_FILE', 'tune', 'recorded', 'stamp', 'encoder_identity', 'pareto_front']

TUNING_FILE = 'tuning.json'
TUNING_VERSION = 1
GRIDS = {
    'pisa': tuple({'query_algorithm': a} for a in ('block_max_maxscore', 'block_max_wand', 'maxscore')),
    'bmp': tuple({'alpha': a, 'beta': b} for b in (0.8, 1.) for a in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.)),
    'seismic': tuple({'query_cut': c, 'heap_factor': h} for c in (3, 5, 8, 10, 15, 20, 30, 50)
                     for h in (1., 0.9, 0.8, 0.7, 0.5)),
}


# -- identity of a query encoder -----------------------------------------------------------------------------------

def _hash_value(h, value) -> None:
    import torch
    if isinstance(value, torch.Tensor):
        tensor = value.int_repr() if value.is_quantized else value
        tensor = tensor.detach().cpu().contiguous()
        h.update(f'{tensor.dtype}{tuple(tensor.shape)}'.encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, (tuple, list)):
        for item in value:
            _hash_value(h, item)
    else:
        h.update(repr(value).encode())


def _describe(obj, h, depth: int = 0) -> None:
    """Feeds ``h`` what decides the vectors ``obj`` produces: its class, weights (torch modules' state, a query table),
    tokenizer vocabulary and plain settings; not its batch size, device or display name."""
    import torch
    h.update(f'<{type(obj).__module__}.{type(obj).__qualname__}>'.encode())
    if isinstance(obj, pt.Compose):
        for stage in obj._transformers:
            _describe(stage, h, depth + 1)
        return
    if isinstance(obj, torch.nn.Module):
        for name, value in obj.state_dict().items():
            h.update(name.encode())
            _hash_value(h, value)
        return
    if hasattr(obj, 'get_vocab') and hasattr(obj, 'all_special_tokens'):  # a tokenizer
        h.update(json.dumps(sorted(obj.get_vocab().items())).encode())
        h.update(repr(getattr(obj, 'do_lower_case', None)).encode())
        return
    attributes = getattr(obj, '__dict__', None)
    if attributes is None or depth > 3:
        h.update(repr(obj).encode())
        return
    for key in sorted(attributes):
        if key in ('batch_size', 'device', 'name', 'verbose', 'label') or key.startswith('__'):
            continue
        value = attributes[key]
        h.update(key.encode())
        if isinstance(value, (str, int, float, bool, type(None))):
            h.update(repr(value).encode())
        elif isinstance(value, dict) and all(isinstance(k, str) for k in value):
            h.update(json.dumps(value, sort_keys=True, default=repr).encode())
        elif isinstance(value, (set, frozenset)):
            h.update(json.dumps(sorted(map(repr, value))).encode())
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
            h.update(json.dumps(list(value)).encode())
        else:
            _describe(value, h, depth + 1)


def encoder_identity(query_encoder) -> str:
    """A digest of what decides the query vectors of ``query_encoder`` (a transformer, or a pipeline of them): equal
    for the same model (or query table) loaded again in another process, different when a weight, the tokenizer, a
    pruning rule or a setting that changes the vectors differs."""
    h = hashlib.sha256()
    _describe(query_encoder, h)
    return h.hexdigest()


def _queries_digest(topics: pd.DataFrame) -> str:
    h = hashlib.sha256()
    for qid, query in zip(topics['qid'], topics['query']):
        h.update(json.dumps([str(qid), str(query)]).encode())
    return h.hexdigest()


def _cpu_model() -> str:
    path = Path('/proc/cpuinfo')
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    import platform
    return platform.processor() or platform.machine()


# -- measuring -----------------------------------------------------------------------------------------------------

def _cost(retriever, frame: pd.DataFrame, repeats: int, one_a_call: bool = False) -> tuple[float, pd.DataFrame]:
    """CPU ms per query (the least of ``repeats`` passes, after a warm-up call) of one batched call, or with
    ``one_a_call`` of one call per query; and the results of a batched call."""
    retriever(frame.iloc[:1])
    best, results = None, None
    rows = [frame.iloc[[i]] for i in range(len(frame))] if one_a_call else [frame]
    for _ in range(repeats):
        cpu = time.process_time()
        for row in rows:
            results = retriever(row)
        ms = (time.process_time() - cpu) * 1e3 / len(frame)
        best = ms if best is None else min(best, ms)
    return best, (retriever(frame) if one_a_call else results)


def exact_tops(index, frame: pd.DataFrame, k: int) -> dict[str, tuple[set, int]]:
    """Per qid, the documents of the exact top ``k`` with ties (every one scoring at least the ``k``-th) and how many a
    perfect engine returns (``k``, or fewer when fewer documents match)."""
    engines = index.meta['engines']
    if 'pisa' in engines:
        engine, params = 'pisa', {}
    elif 'bmp' in engines:
        engine, params = 'bmp', {'alpha': 1., 'beta': 1.}
    else:
        engine, params = 'seismic', {'exact': True}
    with quiet_native():
        results = index.toks_retriever(max(2 * k, k + 90), engine, **params)(frame)
    tops = {str(q): (set(), 0) for q in frame['qid']}
    for qid, group in results.groupby('qid', sort=False):
        scores = group.sort_values('rank')
        kth = scores.score.iloc[min(k, len(scores)) - 1]
        tops[str(qid)] = (set(scores.docno[scores.score >= kth]), min(k, len(scores)))
    return tops


def recall(results: pd.DataFrame, tops: dict, k: int) -> float:
    """R@``k`` of ``results`` against :func:`exact_tops` (queries matching no document left out)."""
    got = {str(q): set(g.sort_values('rank').docno[:k]) for q, g in results.groupby('qid', sort=False)}
    values = [len(got.get(q, set()) & docs) / n for q, (docs, n) in tops.items() if n]
    return float(np.mean(values)) if values else 1.


def pareto_front(rows: list[dict]) -> list[dict]:
    """The rows no other row beats on both CPU ms (lower) and recall (higher), cheapest first."""
    front = []
    for row in sorted(rows, key=lambda r: (r['cpu_ms'], -r['recall'])):
        if not front or row['recall'] > front[-1]['recall']:
            front.append(row)
    return front


# -- the record ----------------------------------------------------------------------------------------------------

def _read(index) -> dict:
    path = index.path / TUNING_FILE
    if not path.is_file():
        return {'version': TUNING_VERSION, 'tunings': {}}
    content = storage.read_json(path, 'engine tuning record')
    if content.get('version') != TUNING_VERSION or not isinstance(content.get('tunings'), dict):
        raise ValueError(f'{path} is not a tuning record of this pyterrier-lsr (version {TUNING_VERSION}); remove it '
                         'and tune again')
    return content


def _query_encoder(index, query_encoder):
    return index.model().query_encoder() if query_encoder is None else query_encoder


def stamp(index) -> tuple:
    """What ``index.retriever()`` depends on beside its arguments, as a value that changes with it: the build and its
    engines (the index's marker, rewritten by every build) and the recorded tunings (their file's stat)."""
    try:
        stat = (index.path / TUNING_FILE).stat()
        tuned = stat.st_ino, stat.st_size, stat.st_mtime_ns
    except OSError:
        tuned = None
    return storage.marker_stamp(index.path), tuned


def recorded(index, query_encoder=None) -> dict | None:
    """The tuning recorded in ``index`` for ``query_encoder`` (default: the index model's), or ``None`` when there is
    none, or when the index or the chosen engine was rebuilt since."""
    if not (index.path / TUNING_FILE).is_file():
        return None
    record = _read(index)['tunings'].get(encoder_identity(_query_encoder(index, query_encoder)))
    if record is None:
        return None
    built = index.meta['engines']
    if record.get('build') != index.build_id() or record.get('engine') not in built \
            or built[record['engine']] != record.get('engine_build') or not isinstance(record.get('settings'), dict):
        return None
    return record


def tune(index, topics: pd.DataFrame, target_recall: float = 0.99, *, engines=None, query_encoder=None,
         k: int = 10, grids: dict | None = None, repeats: int = 1, one_a_call: bool = False,
         verbose: bool = True) -> dict:
    """Measures each engine's grid on ``topics`` and records the cheapest setting reaching ``target_recall``.

    Args:
        index: an :class:`~pyterrier_lsr.LsrIndex`.
        topics: the tuning queries (``qid``, ``query``): never the queries the results are reported on.
        target_recall: the R@``k`` (against the exact ranking of the same query encoder) to reach, in (0, 1].
        engines: the engines to tune (default: every engine built in the index).
        query_encoder: the query side (default: the index model's query encoder); the record is kept under its
            identity, so each query side has its own.
        k: the depth the recall is measured at.
        grids: ``{engine: [settings, ...]}`` replacing :data:`GRIDS` for the engines it names.
        repeats: passes over the queries per setting, the least CPU time kept.
        one_a_call: cost a setting by one call per query (as a search service calls it: an engine's fixed cost per
            call counts) instead of one batched call; slower to tune.
        verbose: print the Pareto front (CPU ms against R@``k``).

    Returns:
        The record written: ``engine``, ``settings``, ``recall``, ``cpu_ms``, ``rows`` (every setting measured) and
        ``front`` (the Pareto front), with the provenance fields described in the module notes.

    Raises:
        ValueError: bad arguments (named), an engine that is not built, or no setting reaching the target.
    """
    target_recall = check_float('target_recall', target_recall, 0, 1, exclusive_minimum=True)
    k = check_int('k', k, 1)
    repeats = check_int('repeats', repeats, 1)
    one_a_call = check_bool('one_a_call', one_a_call)
    check_query_frame(topics, ['query'])
    if not len(topics):
        raise ValueError('topics: no tuning queries given')
    built = index.meta['engines']
    engines = list(built) if engines is None else [engines] if isinstance(engines, str) else list(engines)
    for engine in engines:
        if engine not in built:
            raise ValueError(f'engines: {index.path} has no {engine!r} engine (built: {sorted(built)})')
    grids = {**GRIDS, **(grids or {})}
    encoder = _query_encoder(index, query_encoder)
    frame = encoder(topics[['qid', 'query']].reset_index(drop=True))[['qid', 'query_toks']]
    tops = exact_tops(index, frame, k)
    rows = []
    for engine in engines:
        for settings in grids.get(engine, ({},)):
            with quiet_native():
                ms, results = _cost(index.toks_retriever(k, engine, **settings), frame, repeats, one_a_call)
            rows.append({'engine': engine, 'settings': dict(settings), 'cpu_ms': round(ms, 4),
                         'recall': round(recall(results, tops, k), 5)})
    meeting = [r for r in rows if r['recall'] >= target_recall]
    if not meeting:
        best = max(rows, key=lambda r: r['recall'])
        raise ValueError(f'no setting reached R@{k} {target_recall} (the best: {best["engine"]} {best["settings"]}, '
                         f'{best["recall"]}); lower target_recall or add the exact engine')
    chosen = min(meeting, key=lambda r: r['cpu_ms'])
    record = {**chosen, 'k': k, 'target_recall': target_recall, 'one_a_call': one_a_call,
              'query_encoder': {'label': str(getattr(encoder, 'label', None) or repr(encoder)),
                                'identity': encoder_identity(encoder)},
              'queries': {'count': len(frame), 'digest': _queries_digest(topics)},
              'cpu': _cpu_model(), 'date': datetime.now(timezone.utc).isoformat(timespec='seconds'),
              'build': index.build_id(), 'engine_build': built[chosen['engine']],
              'front': pareto_front(rows), 'rows': rows}
    content = _read(index)
    content['tunings'][record['query_encoder']['identity']] = record
    storage.write_json(index.path / TUNING_FILE, content)
    if verbose:
        calls = 'one a call' if one_a_call else 'batched'
        print(f'Pareto front on {len(frame)} queries (CPU ms/query {calls}, R@{k} against the exact ranking):')
        for row in record['front']:
            mark = '  <- chosen' if row is chosen or row == chosen else ''
            print(f'  {row["engine"]:8} {json.dumps(row["settings"]):48} {row["cpu_ms"]:9.3f} ms  '
                  f'R@{k} {row["recall"]:.4f}{mark}')
    return record
