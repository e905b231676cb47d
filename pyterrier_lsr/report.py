"""Effectiveness-cost reports: pt.Experiment plus retrieval-cost columns, a table and a plot.

Cost columns per system: ms per query of query encoding and, separately, of retrieval from encoded queries (median
and p95 over queries of each query's median over repeated passes; each query on its own), average non-zero terms per
query and per document, index size on disk (less the model copy), and postings per query: the summed document
frequencies of the query's terms, i.e. the postings an exhaustive traversal reads (dynamic pruning reads fewer but
cannot count them); with an engine, its name, size and build time.

``pyterrier-lsr report config.yaml`` runs :func:`run_config`: document and topic subsets, any model kind or existing
index, any engine, indexes reused across runs (keyed on the model's content); see ``examples/report_*.yaml``.
"""

import hashlib
import inspect
import itertools
import re
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt
from tqdm.auto import tqdm

from .index import pisa_term
from .quiet import quiet_native


def posting_lengths(index_path) -> Dict[str, int]:
    """Document frequency of every term of a PISA index, read from its ``inv.docs`` and ``fwd.terms`` files."""
    path = Path(index_path)
    terms = path.joinpath('fwd.terms').read_text(encoding='utf8').split('\n')[:-1]
    docs = np.fromfile(path / 'inv.docs', dtype=np.uint32)
    lengths, pos = [], 2  # header: [1, num_docs]
    while pos < len(docs):
        lengths.append(int(docs[pos]))
        pos += int(docs[pos]) + 1
    return dict(zip(terms, lengths))


def index_size_bytes(index_path) -> int:
    """Bytes of an index folder's files, less the copy of the model a pyterrier-lsr index carries (``model/``)."""
    root = Path(index_path)
    return sum(f.stat().st_size for f in root.rglob('*') if f.is_file() and f.relative_to(root).parts[0] != 'model')


@dataclass
class System:
    """A retrieval system to report on.

    ``query_side`` produces ``query_toks`` (``None`` for a text retriever such as BM25, whose query terms are then
    PISA's tokens of the query text); ``retriever`` retrieves from the index at ``index_path`` (a pyterrier-lsr index,
    or a PISA index for a text retriever).
    """

    name: str
    retriever: pt.Transformer
    index_path: str
    query_side: Optional[pt.Transformer] = None
    stemmer: str = 'none'
    engine: Optional[str] = None  # the LsrIndex engine ``retriever`` searches with: adds the engine columns

    def pipeline(self) -> pt.Transformer:
        return self.retriever if self.query_side is None else self.query_side >> self.retriever

    def query_terms(self, topics: pd.DataFrame) -> List[Dict[str, float]]:
        if self.query_side is not None:
            return list(self.query_side(topics)['query_toks'])
        import pyterrier_pisa
        from pyterrier_pisa.stopwords import _STOPWORDS

        stops = set(_STOPWORDS['terrier'])
        return [
            {t: 1.0 for t in pyterrier_pisa.tokenize(q.lower(), self.stemmer) if t not in stops}
            for q in topics['query']
        ]

    def document_frequencies(self) -> Tuple[Dict[str, int], int, Callable[[str], str]]:
        """``(df, num_docs, key)``: document frequency per stored term, the number of documents, and the stored form
        of a query term (the index's own ``df.json`` for a pyterrier-lsr index, whatever its engines; PISA's
        posting lists for a text index)."""
        from .index import LsrIndex
        from .index.artifact import is_lsr_index

        if is_lsr_index(self.index_path):
            index = LsrIndex(self.index_path)
            return index.document_frequencies(), index.num_docs(), str
        num_docs = int(np.fromfile(Path(self.index_path) / 'inv.docs', dtype=np.uint32, count=2)[1])
        return posting_lengths(self.index_path), num_docs, pisa_term


# The columns costs() adds (in order). Latency is split: query encoding (the model's query side; NaN for a text
# retriever, whose tokenization is part of retrieval) and retrieval from precomputed query_toks, each the median and
# p95 over queries of a query's median time over the passes.
COST_COLUMNS = (
    'encode_ms_median',
    'encode_ms_p95',
    'retrieve_ms_median',
    'retrieve_ms_p95',
    'query_nnz',
    'doc_nnz',
    'postings_per_query',
    'index_mb',
)


def query_times(pipeline: pt.Transformer, topics: pd.DataFrame, passes: int = 1) -> List[float]:
    """Milliseconds of one-query calls of ``pipeline`` over ``topics``, after a warm-up call (which loads indexes):
    per query, the median of ``passes`` passes over all queries (so a stall in one pass does not count)."""
    if passes < 1:
        raise ValueError(f'passes must be >= 1, got {passes}')
    pipeline(topics.iloc[:1])
    times = np.empty((passes, len(topics)))
    for p in range(passes):
        for i in range(len(topics)):
            start = time.perf_counter()
            pipeline(topics.iloc[[i]])
            times[p, i] = (time.perf_counter() - start) * 1e3
    return np.median(times, axis=0).tolist()


def costs(system: System, topics: pd.DataFrame, passes: int = 3) -> Dict[str, float]:
    """Cost columns of one system on ``topics`` (see the module docs); latencies over ``passes`` passes."""
    if system.query_side is None:
        encode, toks = [float('nan')], topics
    else:
        encode = query_times(system.query_side, topics, passes)
        toks = system.query_side(topics)
    retrieve = query_times(system.retriever, toks, passes)
    df, num_docs, key = system.document_frequencies()
    queries = list(toks['query_toks']) if system.query_side is not None else system.query_terms(topics)
    return {
        'encode_ms_median': statistics.median(encode),
        'encode_ms_p95': float(np.percentile(encode, 95)),
        'retrieve_ms_median': statistics.median(retrieve),
        'retrieve_ms_p95': float(np.percentile(retrieve, 95)),
        'query_nnz': statistics.mean(len(q) for q in queries),
        'doc_nnz': sum(df.values()) / max(1, num_docs),
        'postings_per_query': statistics.mean(sum(df.get(key(t), 0) for t in q) for q in queries),
        'index_mb': index_size_bytes(system.index_path) / 2**20,
        **(engine_footprint(system.index_path, system.engine) if system.engine else {}),
    }


def engine_footprint(index_path, engine: str) -> Dict[str, object]:
    """The engine columns of a report: which engine of the :class:`~pyterrier_lsr.LsrIndex` at ``index_path``, the
    size of its files (MB; PISA's are those at the index root) and its build time (s, as recorded when built)."""
    from .index import LsrIndex, get_engine

    meta = LsrIndex(index_path).meta
    folder = get_engine(engine).subfolder
    files = {
        name: record['bytes']
        for name, record in meta['files'].items()
        if (name.startswith(folder + '/') if folder else '/' not in name and name not in ENGINE_NEUTRAL_FILES)
    }
    return {
        'engine': engine,
        'engine_mb': sum(files.values()) / 2**20,
        'engine_build_s': meta['engines'][engine].get('build_seconds', float('nan')),
    }


ENGINE_NEUTRAL_FILES = {'df.json', 'pt_meta.json', 'lsr.json'}


def engine_costs(index, engine: str, query_toks: pd.DataFrame, num_results: int = 1000, **params):
    """One engine of an :class:`~pyterrier_lsr.LsrIndex` on a frame that already carries ``query_toks``: returns
    ``(costs, results)``, the costs being the engine columns plus ms per query (median and p99 of one-query calls,
    and the mean of one call on every query), the results those of the call on every query."""
    retriever = index.toks_retriever(num_results, engine=engine, **params)
    times = query_times(retriever, query_toks)
    start = time.perf_counter()
    results = retriever(query_toks)
    batch = (time.perf_counter() - start) * 1e3 / max(1, len(query_toks))
    return {
        **engine_footprint(index.path, engine),
        'ms_median': statistics.median(times),
        'ms_p99': float(np.percentile(times, 99)),
        'ms_batch': batch,
    }, results


def report(
    systems: Sequence[System],
    topics: pd.DataFrame,
    qrels: pd.DataFrame,
    measures: Sequence,
    output_dir,
    x: str = 'postings_per_query',
    title: str = '',
    passes: int = 3,
    notes: Sequence[str] = (),
) -> pd.DataFrame:
    """Runs ``pt.Experiment`` on ``systems``, adds cost columns (latencies over ``passes`` passes), writes
    ``report.md`` (the table, then ``notes``), ``report.csv`` and ``report.png`` (the first of ``measures`` vs ``x``,
    one numbered point per system) into ``output_dir``; returns the table."""
    if not systems:
        raise ValueError('no systems to report on')
    if x not in COST_COLUMNS + tuple(str(m) for m in measures):
        raise ValueError(f'x={x!r} is not a report column; choose one of {list(COST_COLUMNS)} or a measure')
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table = pt.Experiment(
        [s.pipeline() for s in systems], topics, qrels, list(measures), names=[s.name for s in systems]
    )
    cost_rows = [costs(s, topics, passes) for s in tqdm(systems, desc='measuring costs', unit='system')]
    table = pd.concat([table.reset_index(drop=True), pd.DataFrame(cost_rows)], axis=1)
    table.to_csv(output_dir / 'report.csv', index=False)
    (output_dir / 'report.md').write_text(_markdown(table) + ''.join(f'\n{note}\n' for note in notes))
    fig = figure(table, str(measures[0]), x, title)
    fig.savefig(output_dir / 'report.png', dpi=120, bbox_inches='tight')
    import matplotlib.pyplot as plt

    plt.close(fig)
    return table


def _markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for row in table.itertuples(index=False):
        lines.append('| ' + ' | '.join(_cell(v) for v in row) + ' |')
    return '\n'.join(lines) + '\n'


def _cell(value) -> str:
    if isinstance(value, float):
        return '-' if np.isnan(value) else f'{value:.4g}'
    return str(value)


def figure(table: pd.DataFrame, y: str, x: str, title: str = ''):
    """The report plot: ``y`` vs ``x``, one line per system group (the name before ``' @ '``), each point a numbered
    marker; the legend, outside the axes, names every number. Points that would cover each other share one marker
    labelled with all their numbers, so no number sits on another."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = table['name'].str.split(' @ ').str[0]
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    colour_of = {group: colours[i % len(colours)] for i, group in enumerate(dict.fromkeys(groups))}
    for group, colour in colour_of.items():
        part = table[groups == group].sort_values(x)
        ax.plot(part[x], part[y], color=colour, alpha=0.5, linewidth=1.2)
    xs, ys = table[x].to_numpy(float), table[y].to_numpy(float)
    if (xs > 0).all() and xs.max() > 10 * xs.min():
        ax.set_xscale('log')
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f'{v:g}'))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.margins(0.08)
    ax.set_xlabel(x.replace('_', ' '))
    ax.set_ylabel(y)
    ax.set_title(title or f'{y} vs {x.replace("_", " ")}')
    ax.grid(alpha=0.3)
    handles = [
        Line2D([], [], marker='o', linestyle='none', color=colour_of[group], markersize=7, label=f'{number}  {name}')
        for number, (name, group) in enumerate(zip(table['name'], groups), start=1)
    ]
    ax.legend(handles=handles, loc='upper left', bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    ax.autoscale_view()
    ax.set_autoscale_on(False)  # the layout is final: marker distances in pixels are those of the saved figure
    diameter = MARKER_PT * fig.dpi / 72
    for members in _clusters(ax.transData.transform(np.column_stack([xs, ys])), diameter):
        point = (xs[members[0]], ys[members[0]])
        shared = {colour_of[groups.iloc[m]] for m in members}
        colour = shared.pop() if len(shared) == 1 else 'grey'  # points of several groups: no group's colour
        ax.plot(*point, marker='o', markersize=MARKER_PT, color=colour, linestyle='none')
        numbers = ','.join(str(m + 1) for m in members)
        if len(members) == 1:
            ax.annotate(numbers, point, ha='center', va='center', fontsize=7, color='white', fontweight='bold')
        else:
            ax.annotate(numbers, point, xytext=(MARKER_PT * 0.6, MARKER_PT * 0.6), textcoords='offset points',
                        fontsize=7, bbox=dict(boxstyle='round,pad=0.2', facecolor='white', edgecolor=colour))
    return fig


MARKER_PT = 14  # marker diameter (points); markers whose centres are closer than this would cover each other


def _clusters(pixels: np.ndarray, radius: float) -> List[List[int]]:
    """Indices of points grouped greedily: a point joins the first group whose first point is within ``radius``
    (pixels)."""
    groups: List[List[int]] = []
    for i, p in enumerate(pixels):
        if not np.isfinite(p).all():
            continue  # a NaN coordinate (e.g. BM25's encode_ms) is not drawn
        for g in groups:
            if np.hypot(*(pixels[g[0]] - p)) < radius:
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


# --- YAML configs ------------------------------------------------------------------------------------------------

# key -> (required, type); every key is checked (type and value) before anything is loaded, indexed or written.
TOP_KEYS = {
    'dataset': (True, str),
    'systems': (True, list),
    'output': (True, str),
    'measures': (False, list),
    'workdir': (False, str),
    'irds_cache': (False, str),
    'docs': (False, int),
    'topics': (False, (int, list)),
    'passes': (False, int),
    'x': (False, str),
    'title': (False, str),
    'num_results': (False, int),
}
SYSTEM_KEYS = {
    'name': (True, str),
    'type': (False, str),
    'model': (False, str),
    'index': (False, str),
    'engine': (False, str),
    'engine_params': (False, dict),
    'doc_pruning': (False, dict),
    'query_pruning': (False, dict),
    'levels': (False, list),
}
LEVEL_KEYS = {'doc_pruning': (False, dict), 'query_pruning': (False, dict), 'engine_params': (False, dict)}
PRUNING_KEYS = {'top_n': (False, int), 'ratio': (False, float), 'threshold': (False, float)}
# lsr: any model of the project with its own query side; idf_queries: the model's documents, IDF-weighted query tokens.
TYPES = {'bm25', 'lsr', 'idf_queries'}
TYPE_ALIASES = {'splade': 'lsr', 'inference_free': 'idf_queries'}  # the names of the first report configs
IDF_KINDS = {'splade', 'inference-free'}  # kinds whose terms are their tokenizer's tokens, as IDF queries need
DEFAULT_MEASURES = ['nDCG@10', 'AP', 'R@100']
DEFAULT_PASSES = 3
TYPE_NAMES = {
    str: 'a string',
    list: 'a list',
    dict: 'a mapping',
    int: 'an integer',
    float: 'a number',
    (int, list): 'an integer or a list',
}


def config_help() -> str:
    """Every config key, for ``pyterrier-lsr report --help`` (built from the same tables the validation uses)."""
    from .index.engines import ENGINES

    def keys(spec: Dict[str, tuple]) -> str:
        return ', '.join(f'{k}{"" if required else "?"} ({TYPE_NAMES[kind]})' for k, (required, kind) in spec.items())

    params = '; '.join(f'{engine}: {", ".join(engine_parameters(engine))}' for engine in ENGINES)
    return '\n'.join([
        'config keys (? = optional):',
        f'  top level: {keys(TOP_KEYS)}',
        '    docs: index the first N documents only; topics: the first N topics, or a list of qids;',
        f'    passes: timing passes over the topics (default {DEFAULT_PASSES})',
        f'  systems[i]: {keys(SYSTEM_KEYS)}',
        f'    type: one of {", ".join(sorted(TYPES))} (default lsr; older names: '
        f'{", ".join(f"{a}={t}" for a, t in TYPE_ALIASES.items())});',
        '    model: any model folder or offline name (splade, inference-free, sae-splade, latent-terms, ssr);',
        '    index: an existing pyterrier-lsr index folder instead of model (its own model encodes queries);',
        f'    engine: one of {", ".join(ENGINES)} (default pisa); engine_params: its query parameters ({params})',
        f'  systems[i].levels[j]: {keys(LEVEL_KEYS)}',
        f'  doc_pruning / query_pruning: {keys(PRUNING_KEYS)}',
        'paths are relative to the config file; output and workdir must stay inside its folder.',
    ])


class ConfigError(ValueError):
    """An invalid report config; the message is one line naming the key."""


def _key(where: str, key) -> str:
    return f'{where}.{key}' if where else str(key)


def _check_value(value, kind, key: str):
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:  # YAML writes 1 for 1.0
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(f'config key {key} must be {TYPE_NAMES[kind]}, got {type(value).__name__} {value!r:.60}')
    if kind is str and not value.strip():
        raise ConfigError(f'config key {key} must not be empty')


def _check_keys(section, spec: Dict[str, tuple], where: str):
    if not isinstance(section, dict):
        raise ConfigError(f'config key {where or "<top level>"} must be a mapping, got {type(section).__name__}')
    for key in section:
        if key not in spec:
            raise ConfigError(f'unknown config key {_key(where, key)} (allowed: {sorted(spec)})')
    for key, (required, kind) in spec.items():
        if key in section:
            _check_value(section[key], kind, _key(where, key))
        elif required:
            raise ConfigError(f'missing config key {_key(where, key)}')


def _check_pruning(section: dict, where: str):
    from .pruning import Prune

    _check_keys(section, PRUNING_KEYS, where)
    if section:
        try:
            Prune(**section)
        except (TypeError, ValueError) as e:
            raise ConfigError(f'config key {where}: {e}') from None


def engine_parameters(engine: str) -> List[str]:
    """The query parameters an engine's retriever takes (``threads``, ``alpha``, ``query_cut``...)."""
    from .index.engines import get_engine

    impl = get_engine(engine)
    signature = inspect.signature(impl.retriever)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):  # PISA forwards to its own builder
        signature = inspect.signature(impl._retriever)
    return [n for n, p in signature.parameters.items() if n not in ('index', 'folder', 'num_results', 'verbose')
            and p.kind is not p.VAR_KEYWORD]


def _check_engine_params(params: dict, engine: str, where: str):
    allowed = engine_parameters(engine)
    for key in params:
        if key not in allowed:
            raise ConfigError(f'unknown config key {where}.{key}: the {engine} engine takes {allowed}')


def _check_positive(config: dict, key: str):
    if config.get(key, 1) < 1:
        raise ConfigError(f'config key {key} must be >= 1, got {config[key]}')


def _check_topics(topics):
    if isinstance(topics, int):
        return _check_positive({'topics': topics}, 'topics')
    if not topics:
        raise ConfigError('config key topics must be a positive integer or a non-empty list of qids')
    for i, qid in enumerate(topics):
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise ConfigError(f'config key topics[{i}] must be a qid (string or integer), got {qid!r:.60}')
    repeated = sorted({str(q) for q in topics if [str(t) for t in topics].count(str(q)) > 1})
    if repeated:
        raise ConfigError(f'config key topics lists qids more than once: {repeated[:5]}')


def _check_system(system, where: str):
    from .index.engines import ENGINES

    _check_keys(system, SYSTEM_KEYS, where)
    kind = TYPE_ALIASES.get(system.get('type'), system.get('type', 'lsr'))
    if kind not in TYPES:
        raise ConfigError(f'config key {where}.type must be one of {sorted(TYPES)}, got {system["type"]!r}')
    if kind == 'bm25':
        if set(system) - {'name', 'type'}:
            raise ConfigError(f'config key {where}: a bm25 system takes only name and type, got {sorted(system)}')
        return
    if 'model' not in system and 'index' not in system:
        raise ConfigError(f'missing config key {where}.model (or {where}.index), needed by type {kind}')
    if 'model' in system and 'index' in system:
        raise ConfigError(f'config key {where}: model and index exclude each other (an index carries its model)')
    engine = system.get('engine', 'pisa')
    if engine not in ENGINES:
        raise ConfigError(f'config key {where}.engine must be one of {sorted(ENGINES)}, got {engine!r}')
    _check_engine_params(system.get('engine_params', {}), engine, f'{where}.engine_params')
    for key in ('doc_pruning', 'query_pruning'):
        if key in system:
            _check_pruning(system[key], f'{where}.{key}')
    for j, level in enumerate(system.get('levels', [])):
        _check_keys(level, LEVEL_KEYS, f'{where}.levels[{j}]')
        for key in ('doc_pruning', 'query_pruning'):
            if key in level:
                _check_pruning(level[key], f'{where}.levels[{j}].{key}')
        _check_engine_params(level.get('engine_params', {}), engine, f'{where}.levels[{j}].engine_params')


def check_config(config) -> dict:
    """Validates a parsed report config (types and values of every key); raises :class:`ConfigError` naming the key."""
    from ir_measures import parse_measure

    _check_keys(config, TOP_KEYS, '')
    if not config['systems']:
        raise ConfigError('config key systems must be a non-empty list')
    measures = []
    for i, measure in enumerate(config.get('measures', DEFAULT_MEASURES)):
        _check_value(measure, str, f'measures[{i}]')
        try:
            measures.append(str(parse_measure(measure)))
        except Exception as e:  # ir_measures raises several types
            raise ConfigError(
                f'config key measures[{i}]: {measure!r} is not a measure ({" ".join(str(e).split())[:200]})'
            ) from None
    if 'measures' in config and not measures:
        raise ConfigError('config key measures must be a non-empty list')
    if config.get('x', 'postings_per_query') not in COST_COLUMNS + tuple(measures):
        raise ConfigError(f'config key x must be one of {list(COST_COLUMNS) + measures}, got {config["x"]!r}')
    for key in ('num_results', 'docs', 'passes'):
        _check_positive(config, key)
    if 'topics' in config:
        _check_topics(config['topics'])
    for i, system in enumerate(config['systems']):
        _check_system(system, f'systems[{i}]')
    return config


def load_config(path) -> dict:
    """Reads and validates a report config (:func:`check_config`); errors name the offending key. Paths become
    absolute: ``output``/``workdir`` (confined to the config file's folder), ``index`` and ``model`` folders."""
    import yaml

    try:
        text = Path(path).read_text(encoding='utf8')
    except OSError as e:
        raise ConfigError(f'cannot read config {path}: {e.strerror or e}') from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f'{path} is not valid YAML: {" ".join(str(e).split())}') from None
    config = check_config(config)
    base = Path(path).resolve().parent
    for key in ('output', 'workdir'):
        config[key] = str(confined_path(base, config.get(key, 'indices'), key))
    for i, system in enumerate(config['systems']):
        if 'index' in system:
            from .index.artifact import is_lsr_index

            folder = (base / system['index']).resolve()
            if not is_lsr_index(folder):
                raise ConfigError(f'config key systems[{i}].index: {folder} is not a pyterrier-lsr index')
            system['index'] = str(folder)
        if 'model' in system and (base / system['model']).exists():  # else an offline or hub name
            system['model'] = str((base / system['model']).resolve())
    return config


def confined_path(base: Path, value: str, key: str) -> Path:
    """``value`` resolved against the config file's folder ``base``; the report writes there, so it must be a relative
    path that stays inside that folder (a config cannot point its writes at ``/`` or ``../..``)."""
    if Path(value).is_absolute():
        raise ConfigError(f'config key {key} must be a path relative to the config file, got {value!r}')
    resolved = (base / value).resolve()
    if resolved != base and base not in resolved.parents:
        raise ConfigError(f'config key {key} = {value!r} leads outside the config file\'s folder {base}')
    return resolved


def select_topics(topics: pd.DataFrame, selection) -> pd.DataFrame:
    """The first ``selection`` topics (an integer), or those with the listed qids in the listed order."""
    if selection is None:
        return topics
    if isinstance(selection, int):
        return topics.head(selection).reset_index(drop=True)
    wanted = [str(q) for q in selection]
    missing = sorted(set(wanted) - set(topics['qid']))
    if missing:
        raise ConfigError(f'config key topics: qids {missing[:5]} are not topics of the dataset')
    return topics.set_index('qid').loc[wanted].reset_index()


def run_config(path) -> pd.DataFrame:
    """Builds the systems of a YAML config and writes the report. Each ``levels`` entry of a system adds one point
    (its pruning and engine settings).

    The whole config is validated, every model loaded and every given index opened before anything is indexed or
    written. Paths are relative to the config file (``output`` and ``workdir`` must stay inside its folder). Indexes
    are built under ``workdir``, named by the model's identity (a hash of its files) and the documents indexed, and
    reused when built: a second run, or another system of the same model, encodes nothing. An existing folder that is
    not a pyterrier-lsr index is an error, never overwritten. With ``docs``, judgements of other documents are dropped
    (no system could retrieve them)."""
    config = load_config(path)
    if config.get('irds_cache'):
        from .offline import use_irds_cache

        use_irds_cache(str(Path(path).parent / config['irds_cache']))
    from ir_measures import parse_measure

    dataset = pt.get_dataset(config['dataset'])
    measures = [parse_measure(m) for m in config.get('measures', DEFAULT_MEASURES)]
    topics = select_topics(dataset.get_topics(), config.get('topics'))
    builder = _SystemBuilder(dataset, Path(config['workdir']), config.get('num_results', 1000), config.get('docs'))
    all_qrels = dataset.get_qrels()
    if config.get('docs'):
        all_qrels = all_qrels[all_qrels['docno'].isin({d['docno'] for d in builder.corpus()})]
    qrels = all_qrels[all_qrels['qid'].isin(topics['qid'])]
    judged = qrels[qrels['label'] > 0]['qid'].nunique()
    if not judged:
        useful = list(dict.fromkeys(all_qrels[all_qrels['label'] > 0]['qid']))[:10]
        raise ConfigError(f'config key topics: none of the {len(topics)} topics has a relevant document among '
                          f'{builder.describe_docs()}; choose some that do (e.g. topics: [{", ".join(useful)}]) '
                          'or index more docs')
    for i, spec in enumerate(config['systems']):
        builder.prepare(spec, f'systems[{i}]')
    systems = [s for i, spec in enumerate(config['systems']) for s in builder.build(spec, f'systems[{i}]')]
    passes = config.get('passes', DEFAULT_PASSES)
    notes = [
        f'{config["dataset"]}: {builder.describe_docs()}; {len(topics)} topics, {judged} of them with a relevant '
        f'document among those indexed (the measures average over these).',
        f'encode_ms: query encoding, retrieve_ms: retrieval from encoded queries; one query per call, per query the '
        f'median of {passes} passes, then the median and p95 over queries.',
    ]
    return report(
        systems,
        topics,
        qrels,
        measures,
        config['output'],
        x=config.get('x', 'postings_per_query'),
        title=config.get('title', ''),
        passes=passes,
        notes=notes,
    )


def model_fingerprint(folder) -> str:
    """A hash of a model folder's files (names and contents): the identity report indexes are keyed on, so a retrained
    model saved to the same folder never reuses the old model's index."""
    digest = hashlib.sha256()
    folder = Path(folder)
    for path in sorted(p for p in folder.rglob('*') if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode('utf8') + b'\0')
        with path.open('rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                digest.update(block)
        digest.update(b'\0')
    return digest.hexdigest()


def _slug(name: str) -> str:
    return re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(name.rstrip('/')).name) or 'model'


def _pruning_tag(doc_pruning: dict) -> str:
    return '-'.join(f'{k}{v}' for k, v in sorted(doc_pruning.items()))


class _SystemBuilder:
    """Builds (or reuses) the indexes of a config's systems under ``workdir``. An index the report builds is named
    ``<model>-<model hash>.<docs>[.<doc pruning>].lsr`` (``docs``: ``all`` or ``first<N>``); pruned indexes are made
    from the unpruned index's stored vectors, so each model encodes the corpus once."""

    def __init__(self, dataset, workdir: Path, num_results: int, docs: Optional[int] = None):
        self.dataset, self.workdir, self.num_results, self.docs = dataset, Path(workdir), num_results, docs
        self.models = {}  # model name (as in the config) -> model
        self.keys = {}  # model name or index folder -> the identity part of index names
        self._corpus = None

    @property
    def docs_tag(self) -> str:
        return 'all' if self.docs is None else f'first{self.docs}'

    def corpus(self) -> List[dict]:
        if self._corpus is None:
            docs = self.dataset.get_corpus_iter(verbose=False)
            self._corpus = list(docs if self.docs is None else itertools.islice(docs, self.docs))
        return self._corpus

    def describe_docs(self) -> str:
        return 'all documents' if self.docs is None else f'the first {len(self.corpus())} documents'

    def model(self, name: str):
        if name not in self.models:
            from .loading import load_model
            from .offline import resolve_model

            self.models[name] = load_model(resolve_model(name))
        return self.models[name]

    def model_key(self, name: str) -> str:
        if name not in self.keys:
            from .loading import local_folder

            self.keys[name] = f'{_slug(name)}-{model_fingerprint(local_folder(name))[:12]}'
        return self.keys[name]

    def prepare(self, spec: dict, where: str = 'systems[?]'):
        """Loads a system's model (or opens its index and loads the index's model): everything that can fail on a
        config's content, before anything is built."""
        if 'index' in spec:
            from .index import LsrIndex

            index = LsrIndex(spec['index'])
            try:
                self.models.setdefault(spec['index'], index.model())
            except ValueError as e:  # damaged, another format version, or built from toks without a model
                raise ConfigError(f'config key {where}.index: {" ".join(str(e).split())}') from None
            engine = spec.get('engine', 'pisa')
            unpruned = any(not {**spec.get('doc_pruning', {}), **level.get('doc_pruning', {})}
                           for level in spec.get('levels') or [{}])
            if unpruned and engine not in index.meta['engines']:  # the report never writes into a given index
                raise ConfigError(f'config key {where}.engine: {index.path} has no {engine} engine (built: '
                                  f'{sorted(index.meta["engines"])}); add it with '
                                  f'LsrIndex(path).build_engine({engine!r})')
            if self.docs is not None and index.num_docs() != len(self.corpus()):
                warnings.warn(f'{index.path} holds {index.num_docs()} documents, not the first {self.docs}: the '
                              'config\'s docs applies to the indexes the report builds', stacklevel=2)
            digest = hashlib.sha256((index.path / 'lsr.json').read_bytes()).hexdigest()
            self.keys.setdefault(spec['index'], f'{_slug(spec["index"])}-{digest[:12]}')
        elif 'model' in spec:
            self.model(spec['model'])
            self.model_key(spec['model'])

    def _fresh(self, path: Path):
        if path.exists():
            raise FileExistsError(
                f'{path} exists but is not a pyterrier-lsr index (no lsr.json); the report builds its indexes there '
                'and never deletes a folder it did not make: move it away or choose another workdir'
            )

    def _base_index(self, spec: dict):
        """The unpruned index of a system: the given ``index``, or the model's index of the documents (built once)."""
        from .index import LsrIndex

        if 'index' in spec:
            return LsrIndex(spec['index'], self.models[spec['index']])
        path = self.workdir / f'{self.model_key(spec["model"])}.{self.docs_tag}.lsr'
        index = LsrIndex(path, self.model(spec['model']), verbose=True)
        if not index.built():
            self._fresh(path)
            index.index(self.corpus())
        return index

    def _index(self, spec: dict, doc_pruning: dict):
        from .index import LsrIndex
        from .pruning import prune

        base = self._base_index(spec)
        if not doc_pruning:
            return base
        key = self.keys[spec.get('index') or spec['model']]
        docs_tag = 'given' if 'index' in spec else self.docs_tag
        path = self.workdir / f'{key}.{docs_tag}.{_pruning_tag(doc_pruning)}.lsr'
        # The unpruned index carries the model; a pruned copy only records the scoring (save_model=False).
        index = LsrIndex(path, base.model(), verbose=False, save_model=False)
        if not index.built():
            self._fresh(path)
            index.index({'docno': docno, 'toks': prune(vec, **doc_pruning)} for docno, vec in base.vectors())
        return index

    def _engine(self, index, engine: str):
        """Builds ``engine`` into an index the report built, if it lacks it (:meth:`prepare` checked given indexes)."""
        if engine not in index.meta['engines']:
            with quiet_native():
                index.build_engine(engine)

    def build(self, spec: dict, where: str = 'systems[?]') -> List[System]:
        from .pruning import Prune
        from .query import IDFQueryEncoder

        kind = TYPE_ALIASES.get(spec.get('type'), spec.get('type', 'lsr'))
        if kind == 'bm25':
            from .train.systems import bm25

            retriever = bm25(self.workdir / f'bm25.{self.docs_tag}.pisa', self.corpus(), num_results=self.num_results)
            return [System(spec['name'], retriever, str(retriever.index.path), stemmer='porter2')]
        model = self.models[spec.get('index') or spec['model']]
        if kind == 'idf_queries' and getattr(model, 'kind', None) not in IDF_KINDS:
            raise ConfigError(f'config key {where}.type: idf_queries needs a model whose terms are its tokenizer\'s '
                              f'({", ".join(sorted(IDF_KINDS))}), not a {getattr(model, "kind", None)} model')
        engine = spec.get('engine', 'pisa')
        systems = []
        for j, level in enumerate(spec.get('levels') or [{}]):
            settings = {
                key: {**spec.get(key, {}), **level.get(key, {})}
                for key in ('doc_pruning', 'query_pruning', 'engine_params')
            }
            index = self._index(spec, settings['doc_pruning'])
            self._engine(index, engine)
            try:
                retriever = index.toks_retriever(self.num_results, engine=engine, **settings['engine_params'])
            except (TypeError, ValueError) as e:
                at = f'{where}.levels[{j}]' if level.get('engine_params') else where
                raise ConfigError(f'config key {at}.engine_params: {" ".join(str(e).split())}') from None
            query_side = (
                IDFQueryEncoder.from_index(index, tokenizer=model.tokenizer)
                if kind == 'idf_queries'
                else model.query_encoder()
            )
            if settings['query_pruning']:
                query_side = query_side >> Prune(**settings['query_pruning'], fields=['query_toks'])
            label = ', '.join(
                f'{side}:{k}={v}'
                for side, key in [('d', 'doc_pruning'), ('q', 'query_pruning'), ('e', 'engine_params')]
                for k, v in settings[key].items()
            )
            name = f'{spec["name"]} @ {label}' if label else spec['name']
            systems.append(System(name, retriever, str(index.path), query_side, engine=engine))
        return systems
