"""The YAML schema of ``pyterrier-lsr report config.yaml``: every key's type and value checked before anything is
loaded, indexed or written (errors are one line naming the key), paths confined to the config file's folder, and
the topic selection."""

import inspect
from pathlib import Path

import pandas as pd

from ..core.extras import import_extra
from ..core.storage import check_claimable
from .costs import COST_COLUMNS

# the marked kind of a report's output folder: only a folder a report made is written into again
REPORT_KIND = 'report'

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
    from ..index.engines import ENGINES

    def keys(spec: dict[str, tuple]) -> str:
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


def _check_keys(section, spec: dict[str, tuple], where: str):
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
    from ..stages.pruning import Prune

    _check_keys(section, PRUNING_KEYS, where)
    if section:
        try:
            Prune(**section)
        except (TypeError, ValueError) as e:
            raise ConfigError(f'config key {where}: {e}') from None


def engine_parameters(engine: str) -> list[str]:
    """The query parameters an engine's retriever takes (``threads``, ``alpha``, ``query_cut``...)."""
    from ..index.engines import get_engine

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
    from ..index.engines import ENGINES

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
    named = {}
    for i, system in enumerate(config['systems']):
        _check_system(system, f'systems[{i}]')
        if system['name'] in named:  # rows of one name would be merged in the table and the plot
            raise ConfigError(f'config key systems[{i}].name: {system["name"]!r} is also the name of '
                              f'systems[{named[system["name"]]}]; each system needs its own name')
        named[system['name']] = i
    return config


def load_config(path) -> dict:
    """Reads and validates a report config (:func:`check_config`); errors name the offending key. Paths become
    absolute: ``output``/``workdir`` (confined to the config file's folder), ``index`` and ``model`` folders."""
    yaml = import_extra('report', 'yaml', needed_for='a report config')

    try:
        text = Path(path).read_text(encoding='utf8')
    except OSError as e:
        raise ConfigError(f'cannot read config {path}: {e.strerror or e}') from None
    except UnicodeDecodeError as e:
        raise ConfigError(f'config {path} is not UTF-8 text (byte {e.start} cannot be decoded); save it as UTF-8') \
            from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f'{path} is not valid YAML: {" ".join(str(e).split())}') from None
    config = check_config(config)
    base = Path(path).resolve().parent
    for key in ('output', 'workdir'):
        config[key] = str(confined_path(base, config.get(key, 'indices'), key))
        if Path(config[key]).exists() and not Path(config[key]).is_dir():  # else refused only after the indexing
            raise ConfigError(f'config key {key}: {config[key]} is a file, not a folder')
    try:  # a user's folder would be refused by report() only after every system was indexed and measured
        check_claimable(config['output'], REPORT_KIND, 'report folder')
    except FileExistsError as e:
        raise ConfigError(f'config key output: {e}') from None
    for i, system in enumerate(config['systems']):
        if 'index' in system:
            from ..index.artifact import is_lsr_index

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

