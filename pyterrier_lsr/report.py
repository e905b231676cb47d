"""Effectiveness-cost reports: pt.Experiment plus retrieval-cost columns, a table and a plot.

Cost columns per system: mean/median/p95 ms per query (each query retrieved on its own), average non-zero terms per
query and per document, index size on disk, and postings per query: the summed document frequencies of the query's
terms, i.e. the postings an exhaustive traversal reads (PISA's dynamic pruning reads fewer but cannot count them).

``pyterrier-lsr report config.yaml`` runs :func:`run_config`; see ``examples/report_vaswani.yaml``.
"""

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt
from tqdm.auto import tqdm

from .index import pisa_term


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
    return sum(f.stat().st_size for f in Path(index_path).rglob('*') if f.is_file())


@dataclass
class System:
    """A retrieval system to report on.

    ``query_side`` produces ``query_toks`` (``None`` for a text retriever such as BM25, whose query terms are then
    PISA's tokens of the query text); ``retriever`` retrieves from the PISA index at ``index_path``.
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


# The columns costs() adds (in order).
COST_COLUMNS = ('ms_mean', 'ms_median', 'ms_p95', 'query_nnz', 'doc_nnz', 'postings_per_query', 'index_mb')


def query_times(pipeline: pt.Transformer, topics: pd.DataFrame) -> List[float]:
    """Milliseconds of one-query calls of ``pipeline`` over ``topics``, after a warm-up call (which loads indexes)."""
    pipeline(topics.iloc[:1])
    times = []
    for i in range(len(topics)):
        start = time.perf_counter()
        pipeline(topics.iloc[[i]])
        times.append((time.perf_counter() - start) * 1e3)
    return times


def costs(system: System, topics: pd.DataFrame) -> Dict[str, float]:
    """Cost columns of one system on ``topics`` (see the module docs)."""
    times = query_times(system.pipeline(), topics)
    df = posting_lengths(system.index_path)
    queries = system.query_terms(topics)
    num_docs = int(np.fromfile(Path(system.index_path) / 'inv.docs', dtype=np.uint32, count=2)[1])
    return {
        'ms_mean': statistics.mean(times),
        'ms_median': statistics.median(times),
        'ms_p95': float(np.percentile(times, 95)),
        'query_nnz': statistics.mean(len(q) for q in queries),
        'doc_nnz': sum(df.values()) / max(1, num_docs),
        'postings_per_query': statistics.mean(sum(df.get(pisa_term(t), 0) for t in q) for q in queries),
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
        name: size
        for name, size in meta['files'].items()
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
) -> pd.DataFrame:
    """Runs ``pt.Experiment`` on ``systems``, adds cost columns, writes ``report.md``, ``report.csv`` and
    ``report.png`` (the first of ``measures`` vs ``x``, one point per system) into ``output_dir``; returns the table."""
    if not systems:
        raise ValueError('no systems to report on')
    if x not in COST_COLUMNS + tuple(str(m) for m in measures):
        raise ValueError(f'x={x!r} is not a report column; choose one of {list(COST_COLUMNS)} or a measure')
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table = pt.Experiment(
        [s.pipeline() for s in systems], topics, qrels, list(measures), names=[s.name for s in systems]
    )
    cost_rows = [costs(s, topics) for s in tqdm(systems, desc='measuring costs', unit='system')]
    table = pd.concat([table.reset_index(drop=True), pd.DataFrame(cost_rows)], axis=1)
    table.to_csv(output_dir / 'report.csv', index=False)
    (output_dir / 'report.md').write_text(_markdown(table))
    _plot(table, str(measures[0]), x, output_dir / 'report.png', title)
    return table


def _markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
    for row in table.itertuples(index=False):
        lines.append('| ' + ' | '.join(f'{v:.4g}' if isinstance(v, float) else str(v) for v in row) + ' |')
    return '\n'.join(lines) + '\n'


def _plot(table: pd.DataFrame, y: str, x: str, path: Path, title: str):
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    groups = table['name'].str.split(' @ ').str[0]
    for group in dict.fromkeys(groups):
        part = table[groups == group].sort_values(x)
        ax.plot(part[x], part[y], marker='o', label=group)
        for _, row in part.iterrows():
            ax.annotate(
                row['name'].split(' @ ')[-1] if ' @ ' in row['name'] else '',
                (row[x], row[y]),
                textcoords='offset points',
                xytext=(4, 4),
                fontsize=7,
            )
    ax.set_xscale('log')
    ax.set_xlabel(x.replace('_', ' '))
    ax.set_ylabel(y)
    ax.set_title(title or f'{y} vs {x.replace("_", " ")}')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- YAML configs ------------------------------------------------------------------------------------------------

# key -> (required, type); every key is checked (type and value) before anything is loaded, indexed or written.
TOP_KEYS = {
    'dataset': (True, str),
    'systems': (True, list),
    'output': (True, str),
    'measures': (False, list),
    'workdir': (False, str),
    'irds_cache': (False, str),
    'x': (False, str),
    'title': (False, str),
    'num_results': (False, int),
}
SYSTEM_KEYS = {
    'name': (True, str),
    'type': (True, str),
    'model': (False, str),
    'doc_pruning': (False, dict),
    'query_pruning': (False, dict),
    'levels': (False, list),
}
LEVEL_KEYS = {'doc_pruning': (False, dict), 'query_pruning': (False, dict)}
PRUNING_KEYS = {'top_n': (False, int), 'ratio': (False, float), 'threshold': (False, float)}
TYPES = {'bm25', 'splade', 'inference_free'}
DEFAULT_MEASURES = ['nDCG@10', 'AP', 'R@100']
TYPE_NAMES = {str: 'a string', list: 'a list', dict: 'a mapping', int: 'an integer', float: 'a number'}


def config_help() -> str:
    """Every config key, for ``pyterrier-lsr report --help`` (built from the same tables the validation uses)."""

    def keys(spec: Dict[str, tuple]) -> str:
        return ', '.join(f'{k}{"" if required else "?"} ({TYPE_NAMES[kind]})' for k, (required, kind) in spec.items())

    return '\n'.join([
        'config keys (? = optional):',
        f'  top level: {keys(TOP_KEYS)}',
        f'  systems[i]: {keys(SYSTEM_KEYS)}; type is one of {", ".join(sorted(TYPES))}',
        f'  systems[i].levels[j]: {keys(LEVEL_KEYS)}',
        f'  doc_pruning / query_pruning: {keys(PRUNING_KEYS)}',
        'paths are relative to the config file; output and workdir must stay inside its folder.',
    ])


class ConfigError(ValueError):
    """An invalid report config; the message is one line naming the key."""


def _key(where: str, key) -> str:
    return f'{where}.{key}' if where else str(key)


def _check_value(value, kind: type, key: str):
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
    if config.get('num_results', 1) < 1:
        raise ConfigError(f'config key num_results must be >= 1, got {config["num_results"]}')
    for i, system in enumerate(config['systems']):
        where = f'systems[{i}]'
        _check_keys(system, SYSTEM_KEYS, where)
        if system['type'] not in TYPES:
            raise ConfigError(f'config key {where}.type must be one of {sorted(TYPES)}, got {system["type"]!r}')
        if system['type'] != 'bm25' and 'model' not in system:
            raise ConfigError(f'missing config key {where}.model (needed by type {system["type"]})')
        if system['type'] == 'bm25' and set(system) - {'name', 'type'}:
            raise ConfigError(f'config key {where}: a bm25 system takes only name and type, got {sorted(system)}')
        for key in ('doc_pruning', 'query_pruning'):
            if key in system:
                _check_pruning(system[key], f'{where}.{key}')
        for j, level in enumerate(system.get('levels', [])):
            _check_keys(level, LEVEL_KEYS, f'{where}.levels[{j}]')
            for key in level:
                _check_pruning(level[key], f'{where}.levels[{j}].{key}')
    return config


def load_config(path) -> dict:
    """Reads and validates a report config (:func:`check_config`); errors name the offending key."""
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


def run_config(path) -> pd.DataFrame:
    """Builds the systems of a YAML config (indexing what is missing, with document encodings cached in ``workdir``)
    and writes the report. Each ``levels`` entry of a system adds one point (its pruning settings).

    The whole config is validated and every model loaded before anything is indexed or written. Paths are relative to
    the config file (``output`` and ``workdir`` must stay inside its folder). Index folders are created under
    ``workdir`` and reused when they hold an index; an existing folder that is not a pyterrier-lsr index is an error,
    never overwritten."""
    config = load_config(path)
    if config.get('irds_cache'):
        from .offline import use_irds_cache

        use_irds_cache(str(Path(path).parent / config['irds_cache']))
    from ir_measures import parse_measure

    dataset = pt.get_dataset(config['dataset'])
    workdir = Path(config['workdir'])
    measures = [parse_measure(m) for m in config.get('measures', DEFAULT_MEASURES)]
    builder = _SystemBuilder(dataset, workdir, config.get('num_results', 1000))
    for spec in config['systems']:
        if 'model' in spec:
            builder._model(spec['model'])
    systems = [s for spec in config['systems'] for s in builder.build(spec)]
    return report(
        systems,
        dataset.get_topics(),
        dataset.get_qrels(),
        measures,
        config['output'],
        x=config.get('x', 'postings_per_query'),
        title=config.get('title', ''),
    )


class _SystemBuilder:
    def __init__(self, dataset, workdir: Path, num_results: int):
        self.dataset, self.workdir, self.num_results = dataset, workdir, num_results
        self.models = {}

    def _model(self, name: str):
        if name not in self.models:
            from .loading import load_model
            from .offline import resolve_model

            self.models[name] = load_model(resolve_model(name))
        return self.models[name]

    def _doc_vectors(self, model_name: str) -> List[Tuple[str, Dict[str, float]]]:
        """Document encodings of the whole corpus, cached on disk per model as JSON lines ``{"docno", "toks"}``
        (plain data: reading a cache runs no code)."""
        cache = self.workdir / f'{Path(model_name).name}.toks.jsonl'
        if cache.exists():
            try:
                with cache.open(encoding='utf8') as fin:
                    return [(row['docno'], row['toks']) for row in map(json.loads, fin)]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f'the encoding cache {cache} is damaged ({e}); delete it to re-encode') from None
        docs = list(self.dataset.get_corpus_iter(verbose=False))
        vectors = self._model(model_name).encode([d['text'] for d in docs], verbose=True, desc='encoding corpus')
        result = [(d['docno'], v) for d, v in zip(docs, vectors)]
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + '.tmp')
        with tmp.open('w', encoding='utf8') as fout:
            for docno, vec in result:
                fout.write(json.dumps({'docno': docno, 'toks': vec}, ensure_ascii=False) + '\n')
        os.replace(tmp, cache)  # a cache file is always complete
        return result

    def _index(self, model_name: str, doc_pruning: dict):
        from .index import LsrIndex, SpladeIndexer
        from .pruning import prune

        tag = '-'.join(f'{k}{v}' for k, v in sorted(doc_pruning.items())) or 'full'
        path = self.workdir / f'{Path(model_name).name}.{tag}.lsr'
        if not (path / 'lsr.json').exists():
            if path.exists():
                raise FileExistsError(
                    f'{path} exists but is not a pyterrier-lsr index (no lsr.json); the report '
                    'builds its indexes there and never deletes a folder it did not make: move it '
                    'away or choose another workdir'
                )
            docs = (
                {'docno': docno, 'toks': prune(vec, **doc_pruning) if doc_pruning else vec}
                for docno, vec in self._doc_vectors(model_name)
            )
            SpladeIndexer(path, self._model(model_name), verbose=False).index(docs)  # toks as given; model recorded
        return LsrIndex(path, self._model(model_name))

    def build(self, spec: dict) -> List[System]:
        from .pruning import Prune
        from .query import IDFQueryEncoder

        if spec['type'] == 'bm25':
            import pyterrier_pisa

            index = pyterrier_pisa.PisaIndex(str(self.workdir / 'bm25.pisa'), text_field='text')
            if not index.built():
                index.index(self.dataset.get_corpus_iter())
            return [System(spec['name'], index.bm25(num_results=self.num_results), str(index.path), stemmer='porter2')]
        levels = spec.get('levels') or [{}]
        systems = []
        for level in levels:
            doc_pruning = {**spec.get('doc_pruning', {}), **level.get('doc_pruning', {})}
            query_pruning = {**spec.get('query_pruning', {}), **level.get('query_pruning', {})}
            index = self._index(spec['model'], doc_pruning)
            query_side = (
                IDFQueryEncoder.from_index(index)
                if spec['type'] == 'inference_free'
                else self._model(spec['model']).query_encoder()
            )
            if query_pruning:
                query_side = query_side >> Prune(**query_pruning, fields=['query_toks'])
            label = ', '.join(
                f'{side[0]}:{k}={v}'
                for side, p in [('doc', doc_pruning), ('query', query_pruning)]
                for k, v in p.items()
            )
            name = f'{spec["name"]} @ {label}' if label else spec['name']
            systems.append(
                System(name, index.toks_retriever(num_results=self.num_results), str(index.path), query_side)
            )
        return systems
