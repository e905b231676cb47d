"""``pyterrier-lsr report config.yaml``: :func:`run_config` builds (or reuses) a config's systems and writes the
report: document and topic subsets, any model kind or existing index, any engine, indexes reused across runs (keyed
on the model's content); see ``examples/report_*.yaml``."""

import hashlib
import itertools
import re
import warnings
from pathlib import Path

import pandas as pd
import pyterrier as pt

from ..core.extras import require_extra
from ..core.quiet import quiet_native
from ..core.storage import claim_folder, model_digest
from .config import (
    DEFAULT_MEASURES,
    DEFAULT_PASSES,
    IDF_KINDS,
    REPORT_KIND,
    TYPE_ALIASES,
    ConfigError,
    load_config,
    select_topics,
)
from .costs import System
from .table import report


def run_config(path) -> pd.DataFrame:
    """Builds the systems of a YAML config and writes the report. Each ``levels`` entry of a system adds one point
    (its pruning and engine settings).

    The whole config is validated, every model loaded and every given index opened before anything is indexed or
    written. Paths are relative to the config file (``output`` and ``workdir`` must stay inside its folder). Indexes
    are built under ``workdir``, named by the model's identity (a hash of its files) and the documents indexed, and
    reused when built: a second run, or another system of the same model, encodes nothing. An existing folder that is
    not a pyterrier-lsr index is an error, never overwritten, and so is an ``output`` folder a report did not make.
    With ``docs``, judgements of other documents are dropped (no system could retrieve them)."""
    config = load_config(path)
    require_extra('report', 'matplotlib', needed_for='the report plot')  # drawn last, after the long part
    if config.get('irds_cache'):
        from ..core.offline import use_irds_cache

        use_irds_cache(str(Path(path).parent / config['irds_cache']))
    from ir_measures import parse_measure

    if config['dataset'].startswith('irds:'):
        from ..core.collection import irds_dataset
        try:
            irds_dataset(config['dataset'][len('irds:'):])
        except ValueError as e:
            raise ConfigError(f'config key dataset: {e}') from None
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
    # claimed before the indexing, so that a workdir inside it is built into a report folder, not a user's
    claim_folder(config['output'], REPORT_KIND, 'report folder')
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


def _slug(name: str) -> str:
    return re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(name.rstrip('/')).name) or 'model'


def _pruning_tag(doc_pruning: dict) -> str:
    return '-'.join(f'{k}{v}' for k, v in sorted(doc_pruning.items()))


class _SystemBuilder:
    """Builds (or reuses) the indexes of a config's systems under ``workdir``. An index the report builds is named
    ``<model>-<model hash>.<docs>-<corpus key>[.<doc pruning>].lsr`` (``docs``: ``all`` or ``first<N>``; the corpus
    key, :func:`~..core.collection.corpus_key`, tells another dataset's documents apart in a shared workdir, where an
    index of the same model would otherwise be reused for them); pruned indexes are made from the unpruned index's
    stored vectors, so each model encodes the corpus once."""

    def __init__(self, dataset, workdir: Path, num_results: int, docs: int | None = None):
        self.dataset, self.workdir, self.num_results, self.docs = dataset, Path(workdir), num_results, docs
        self.models = {}  # model name (as in the config) -> model
        self.keys = {}  # model name or index folder -> the identity part of index names
        self._corpus = None
        self._corpus_tag = None

    @property
    def docs_tag(self) -> str:
        return 'all' if self.docs is None else f'first{self.docs}'

    @property
    def corpus_tag(self) -> str:
        """The part of a built index's name that says which documents it holds (see the class docs)."""
        if self._corpus_tag is None:
            from ..core.collection import corpus_key
            self._corpus_tag = f'{self.docs_tag}-{corpus_key({d["docno"]: d["text"] for d in self.corpus()})}'
        return self._corpus_tag

    def corpus(self) -> list[dict]:
        if self._corpus is None:
            docs = self.dataset.get_corpus_iter(verbose=False)
            self._corpus = list(docs if self.docs is None else itertools.islice(docs, self.docs))
        return self._corpus

    def describe_docs(self) -> str:
        return 'all documents' if self.docs is None else f'the first {len(self.corpus())} documents'

    def model(self, name: str):
        if name not in self.models:
            from ..core.names import resolve_model
            from ..kinds.loading import load_model

            self.models[name] = load_model(resolve_model(name))
        return self.models[name]

    def model_key(self, name: str) -> str:
        if name not in self.keys:
            from ..core.folders import local_folder

            self.keys[name] = f'{_slug(name)}-{model_digest(local_folder(name))[:12]}'
        return self.keys[name]

    def prepare(self, spec: dict, where: str = 'systems[?]'):
        """Loads a system's model (or opens its index and loads the index's model): everything that can fail on a
        config's content, before anything is built."""
        if 'index' in spec:
            from ..index import LsrIndex

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
        from ..index import LsrIndex

        if 'index' in spec:
            return LsrIndex(spec['index'], self.models[spec['index']])
        path = self.workdir / f'{self.model_key(spec["model"])}.{self.corpus_tag}.lsr'
        index = LsrIndex(path, self.model(spec['model']), verbose=True)
        if not index.built():
            self._fresh(path)
            index.index(self.corpus())
        return index

    def _index(self, spec: dict, doc_pruning: dict):
        from ..index import LsrIndex
        from ..stages.pruning import prune

        base = self._base_index(spec)
        if not doc_pruning:
            return base
        key = self.keys[spec.get('index') or spec['model']]
        docs_tag = 'given' if 'index' in spec else self.corpus_tag
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

    def build(self, spec: dict, where: str = 'systems[?]') -> list[System]:
        from ..stages.pruning import Prune
        from ..stages.query import IDFQueryEncoder

        kind = TYPE_ALIASES.get(spec.get('type'), spec.get('type', 'lsr'))
        if kind == 'bm25':
            from ..index.bm25 import bm25

            retriever = bm25(self.workdir / f'bm25.{self.corpus_tag}.pisa', self.corpus(), num_results=self.num_results)
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
