"""Every method of the project built in re-runnable calls (the course kit, ``examples/course.py``).

Each builder leaves its result in a folder and a later call returns it from there without training or encoding
again, only when it was built from the same model (by its weights and settings), corpus (by its key) and settings,
which the folder records: a folder built with others is an error naming what differs, never reused silently.
Indexes are reopened when :meth:`~pyterrier_lsr.LsrIndex.built`, a trained model is reloaded from
``<folder>/model``.  Every builder shows progress bars (counts and an estimate) by default and is silent with
``verbose=False``.  Models that train go through :func:`~pyterrier_lsr.train.domain_adapt` (pseudo-queries from
the corpus, BM25 + dense teacher, held-out selection with the never-worse guard), whose log ``domain_adapt.json`` is
written last and so marks a folder as complete; with one ``cache_dir`` the trained systems share the BM25 index,
dense embeddings, examples and teacher scores.  Nothing here looks at test queries.
"""
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from ..core.checks import check_bool, check_documents, check_settings
from ..core.collection import corpus_key
from ..core.names import resolve_model
from ..core.offline import installed
from ..core.quiet import quiet_native
from ..core.storage import model_digest, read_json, write_json
from ..index import LsrIndex
from ..index.bm25 import BM25, bm25
from ..kinds.loading import load_model
from ..kinds.sae_splade import SaeSplade
from ..kinds.splade import Splade
from ..models.heads import calibrate_activation
from ..models.vocab_transfer import transfer_vocabulary
from ..models.vocabularies import extend_vocabulary, new_rows_only
from ..train.domain import DONE_FILE, DomainConfig, claim_output, domain_adapt, logged_config
from ..train.sae import LATENT_TERMS, build_latent_terms, train_token_sae

__all__ = ['BM25', 'bm25', 'sparse_index', 'latent_terms_index', 'best_dense', 'adapted', 'new_head_splade',
           'vt_splade', 'sae_splade']

SYSTEM_FILE = 'system.json'
# What built an index (builder, model fingerprint, corpus key, settings): a later call with others is refused.
BUILD_FILE = 'builder.json'
# SAE-SPLADE's stage-1 SAE: chosen on held-out pseudo-queries over 4,096 latents / 1 epoch on both development
# collections (the record of 2026-12-01: git show df4b050:benchmarks/claims/domain-adaptation.md)
SAE_SPLADE = {'n_latents': 16384, 'k': 4, 'epochs': 6}
# Its sample: every token state of the corpus up to this many.  The held-out pseudo-queries prefer all of Vaswani's
# 547,792 states to a 200,000 sample (+0.057 / +0.029 first-stage nDCG@10, two seeds; CISI's 219,115 against 200,000:
# level); the cap bounds stage 1's time on large corpora (docs/results.md, Trained models).
SAE_SPLADE_STATES = 800_000
# Offline dense bases, strongest first (all-mpnet-base-v2 needs the demo extra's five part packages).
DENSE_BASES = ('all-mpnet-base-v2', 'all-MiniLM-L6-v2')


def _texts(corpus: Sequence[dict]) -> list:
    return [d['text'] for d in corpus]


# Written by transformers into tokenizer_config.json after a model was loaded from a folder: how it was loaded, not
# what it is (the same model saved before and after a reload differs there).
_LOADER_STATE = ('is_local', 'local_files_only')


def _model_digest(model) -> str:
    """The fingerprint of a model object: :func:`~..core.storage.model_digest` of its folder as ``save_pretrained``
    writes it, each JSON file in one canonical form (keys sorted, loader state left out: a reloaded model writes its
    settings in another order), so that it is equal for the same weights and settings however the model was made,
    named or reloaded."""
    with tempfile.TemporaryDirectory(prefix='lsr-fingerprint-') as folder:
        with quiet_native():
            model.save_pretrained(folder)
        for file in Path(folder).rglob('*.json'):
            value = json.loads(file.read_text(encoding='utf8'))
            if isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in _LOADER_STATE}
            file.write_text(json.dumps(value, sort_keys=True), encoding='utf8')
        return model_digest(folder)


def _dense_identity(name: str) -> str:
    """A dense base by its weights when it resolves to a local folder (an offline short name, a path), else by
    name."""
    folder = resolve_model(name)
    return model_digest(folder) if os.path.isdir(folder) else name


def _reusable(path: Path, wanted: dict, overwrite: bool) -> bool:
    """Whether the index at ``path`` was built by this builder with ``wanted`` (its model, corpus and settings,
    recorded in :data:`BUILD_FILE`), so that it may be returned as it is.  One built with others is an error saying
    what differs (reuse is never silent), or, with ``overwrite``, to be rebuilt (``False``)."""
    saved = read_json(path / BUILD_FILE, 'the builder settings') if (path / BUILD_FILE).is_file() else None
    wanted = json.loads(json.dumps(wanted))
    if saved == wanted:
        return True
    if overwrite:
        return False
    if saved is None:
        raise ValueError(f'{path} holds an index this builder did not record (no {BUILD_FILE}: built by LsrIndex '
                         'directly, or an interrupted call), so it cannot tell which model, corpus and settings built '
                         'it; choose another path, or pass overwrite=True to rebuild it')
    flat = [{**{k: v for k, v in record.items() if k != 'settings'},
             **{f'settings.{k}': v for k, v in (record.get('settings') or {}).items()}} for record in (saved, wanted)]
    changed = [k if not k.startswith('settings.') else f'{k} ({flat[0].get(k)!r:.60} recorded, {flat[1].get(k)!r:.60} '
               'now)' for k in {**flat[0], **flat[1]} if flat[0].get(k) != flat[1].get(k)]
    raise ValueError(f'{path} holds an index built with a different {", ".join(changed)} (recorded in its '
                     f'{BUILD_FILE}); choose another path for this one, or pass overwrite=True to replace it')


def _build_record(builder: str, model: str, docs: list, settings: dict) -> dict:
    return {'builder': builder, 'model': model, 'corpus': corpus_key(dict(docs)), 'documents': len(docs),
            'settings': settings}


def sparse_index(path, model, corpus: Sequence[dict], verbose: bool = True, overwrite: bool = False,
                 **kwargs) -> LsrIndex:
    """An :class:`~pyterrier_lsr.LsrIndex` of ``corpus`` encoded by ``model``, built once: a second call with the
    same model (by its weights and settings), corpus and settings returns it; one with others is an error naming what
    differs (reuse is never silent).

    Args:
        path: the index folder.
        model: any :class:`~pyterrier_lsr.SparseModel`; the index records a copy of it.
        corpus: the documents, ``{'docno', 'text'}`` dicts (docnos unique strings).
        verbose: a progress bar while documents are encoded, and the engines' output; ``False``: silent.
        overwrite: rebuild an index of ours built with other settings instead of refusing it.
        kwargs: settings of a new index (``scale``, ``engines``, ...; see :class:`~pyterrier_lsr.LsrIndex`).

    Returns:
        The :class:`~pyterrier_lsr.LsrIndex`.

    Raises:
        ValueError: invalid documents or index settings, a folder built with others (naming what differs), or a
            ``path`` that is not an index of ours.

    Example::

        index = sparse_index("vaswani.lsr", Splade.from_pretrained("splade-tiny"), corpus)
        index.retriever().search("radio waves")
    """
    path = Path(path)
    index = LsrIndex(path, model, verbose=check_bool('verbose', verbose), overwrite=overwrite, **kwargs)
    call = inspect.signature(LsrIndex).bind(path, model, **kwargs)
    call.apply_defaults()
    unrecorded = ('path', 'model', 'shard_size', 'verbose', 'overwrite')  # how it is built, not what
    settings = {k: v for k, v in call.arguments.items() if k not in unrecorded}
    settings['engines'] = [settings['engines']] if isinstance(settings['engines'], str) else list(settings['engines'])
    docs = check_documents(corpus, index.text_field, f'the corpus of {path}')
    wanted = _build_record('sparse_index', _model_digest(model), docs, settings)
    if index.built() and _reusable(path, wanted, check_bool('overwrite', overwrite)):
        return index
    with quiet_native(progress=verbose):  # the engines' native build logs; our progress bars (verbose) come through
        index.index([{'docno': docno, index.text_field: text} for docno, text in docs])
    write_json(path / BUILD_FILE, wanted)
    return index


def best_dense() -> str:
    """The strongest dense base of :data:`DENSE_BASES` whose packages are installed (MiniLM, which the package's
    demo extra always brings, otherwise).

    Returns:
        An offline name, ``'all-mpnet-base-v2'`` or ``'all-MiniLM-L6-v2'``.

    Example::

        index = latent_terms_index("vaswani.latent.lsr", corpus, dense=best_dense())
    """
    return next((name for name in DENSE_BASES if installed(name)), DENSE_BASES[-1])


def latent_terms_index(path, corpus: Sequence[dict], dense: str = 'all-MiniLM-L6-v2', cache_dir=None,
                       verbose: bool = True, overwrite: bool = False, **settings) -> LsrIndex:
    """A Latent Terms index (:func:`~..train.build_latent_terms`; ``settings`` override :data:`LATENT_TERMS`, and a
    ``sae`` dict its SAE settings key by key; embeddings cached in ``cache_dir``, default ``<path>.cache``), built
    once: a second call with the same dense base (by its weights), corpus and settings returns it, one with others is
    an error naming what differs; it records its model.

    Args:
        path: the index folder.
        corpus: the documents, ``{'docno', 'text'}`` dicts (docnos unique strings).
        dense: the dense retriever read through the SAE (offline name, hub name or sentence-transformers folder).
        cache_dir: the embeddings' folder (shared with :func:`~pyterrier_lsr.systems.dense_retriever`).
        verbose: progress bars (embedding, SAE training, indexing) with estimates; ``False``: silent.
        overwrite: rebuild an index of ours built with other settings instead of refusing it.
        settings: overrides of :data:`LATENT_TERMS` (``mode``, ``sqrt_tf``, ``k1``, ``b``, ``max_train_vectors``,
            ``sae={...}``).

    Returns:
        The :class:`~pyterrier_lsr.LsrIndex` (BM25 over latent term frequencies).

    Raises:
        ValueError: invalid documents, an unknown setting or SAE setting (naming it), or a folder built with others.

    Example::

        index = latent_terms_index("vaswani.latent.lsr", corpus, cache_dir="embeddings")
        index.retriever().search("radio waves")       # first run: embeddings, SAE and index; later runs: reopened
    """
    path = Path(path)
    check_bool('verbose', verbose)
    cache_dir = cache_dir if cache_dir is not None else f'{path}.cache'
    sae = {**LATENT_TERMS['sae'], **check_settings('sae', settings.pop('sae', None), 'SAEConfig')}
    settings = {**LATENT_TERMS, **settings, 'sae': sae}
    docs = check_documents(corpus, where=f'the corpus of {path}')
    # device and batch size change where and how fast the vectors are computed, not the index
    recorded = {k: v for k, v in settings.items() if k not in ('device', 'batch_size')}
    wanted = _build_record('latent_terms_index', _dense_identity(dense), docs, recorded)
    if LsrIndex(path).built() and _reusable(path, wanted, check_bool('overwrite', overwrite)):
        return LsrIndex(path)
    with quiet_native(progress=verbose):
        index = build_latent_terms([{'docno': docno, 'text': text} for docno, text in docs], path, dense,
                                   cache_dir=cache_dir, verbose=verbose, overwrite=overwrite, **settings)[1]
    write_json(path / BUILD_FILE, wanted)
    return index


def _finished(folder, config: DomainConfig, system: dict) -> bool:
    """Whether ``folder`` holds a finished :func:`domain_adapt` run with ``config``, built by the builder settings
    ``system`` (what ``start`` builds and the corpus, recorded in ``system.json`` when the run starts); one with other
    settings, or a finished run that records none, is an error (never silently reused)."""
    folder = Path(folder)
    saved_system = folder / SYSTEM_FILE
    if saved_system.is_file():
        _same(folder, read_json(saved_system, 'the system settings'), system)
    done = folder / DONE_FILE
    if not done.is_file():
        return False
    _same(folder, logged_config(read_json(done, 'the adaptation log')['config']), asdict(config))
    if not saved_system.is_file():
        raise ValueError(f'{folder} holds a finished run that records no {SYSTEM_FILE} (its base model and corpus), '
                         'so it cannot be checked; use another folder or remove it')
    return True


def _with_corpus(system: dict | None, corpus: Sequence[dict]) -> dict:
    """``system`` with the key of ``corpus`` (its documents checked): a run on another corpus is never reused."""
    return {**(system or {}), 'corpus': corpus_key(dict(check_documents(corpus, where='the corpus')))}


def _same(folder, saved: dict, wanted: dict):
    wanted = json.loads(json.dumps(wanted))
    if saved != wanted:
        changed = sorted(k for k in {**saved, **wanted} if saved.get(k) != wanted.get(k))
        raise ValueError(f'{folder} holds a model built with other settings ({", ".join(changed)}); '
                         'use another folder or remove it')


def adapted(start: Callable[[], Splade], corpus: Sequence[dict], folder, config: DomainConfig | None = None,
            cache_dir=None, verbose: bool = True, system: dict | None = None, documents=None) -> Splade:
    """``domain_adapt(start(), corpus, folder, config, cache_dir, documents=documents)`` once: when ``folder`` holds a
    finished run, its model is reloaded and ``start`` is not called.  ``system`` (JSON-able settings of what ``start``
    builds, e.g. the base model) is recorded in the folder with the key of ``corpus`` and checked like ``config``: a
    run with other settings or on another corpus is an error (never silently reused); choose another folder.
    ``documents``: an index of ``corpus`` built with ``start()``'s model, read instead of encoding the documents
    (query-side configs).

    A query-side stage after a two-sided one (for the methods whose documents must train first) is a second call::

        vt = vt_splade(corpus, 'vt')
        vt_index = sparse_index('vt.lsr', vt, corpus)
        vt_queries = adapted(lambda: vt, corpus, 'vt/queries', DomainConfig(), documents=vt_index)
        retriever = vt_index.retriever(query_encoder=vt_queries.query_encoder())

    Args:
        start: builds the starting model (not called when ``folder`` holds a finished run).
        corpus: the documents, ``{'docno', 'text'}`` dicts; no queries are needed.
        folder: the run's folder (new, empty or one of ours).
        config: the :class:`~pyterrier_lsr.train.DomainConfig` (default: the query-side recipe).
        cache_dir: BM25 index, dense embeddings and teacher scores, shared between runs on one corpus.
        verbose: show progress and training logs.
        system: the builder's settings, recorded and checked.
        documents: an index of ``corpus`` built with ``start()``'s model.

    Returns:
        The adapted model (an :class:`~pyterrier_lsr.AsymmetricSplade` for the query-side recipe, the starting model
        itself when the never-worse guard fires).

    Raises:
        ValueError: ``folder`` holds a run with other settings, or ``config`` is invalid.
        FileExistsError: ``folder`` or ``cache_dir`` is a folder of other files.

    Example::

        splade = adapted(lambda: Splade.from_pretrained("splade-tiny"), corpus, "runs/adapted")
    """
    config, system = config or DomainConfig(), _with_corpus(system, corpus)
    if _finished(folder, config, system):
        splade = load_model(Path(folder) / 'model')
    else:  # into a folder of ours only, like the run's own files
        write_json(claim_output(folder) / SYSTEM_FILE, system, indent=None)
        splade = domain_adapt(start(), corpus, folder, config, cache_dir, verbose=verbose, documents=documents)[0]
    splade.name = str(folder)  # named by its folder on the first run and after reloading alike
    return splade


def _two_sided(config: DomainConfig | None, method: str) -> DomainConfig:
    """``config`` (default :meth:`DomainConfig.two_sided`) for a method whose documents must train: its new head,
    vocabulary or latents are what documents are written in, and a query-only run would leave them untrained."""
    config = config or DomainConfig.two_sided()
    if config.side != 'both':
        raise ValueError(f"{method} trains its document side too: pass DomainConfig.two_sided(...), not "
                         f"side={config.side!r}")
    return config


def new_head_splade(corpus: Sequence[dict], folder, config: DomainConfig | None = None,
                    encoder: str = 'all-MiniLM-L6-v2', target_active: float = 0.005, calibration_docs: int = 256,
                    cache_dir=None, verbose: bool = True) -> Splade:
    """SPLADE on a dense encoder without an MLM head (e.g. MiniLM-SPLADE): a new head
    (:meth:`~pyterrier_lsr.Splade.from_encoder`), calibrated so that ``target_active`` of the (document, term) pairs of
    the corpus's first ``calibration_docs`` documents start active
    (:func:`~pyterrier_lsr.models.heads.calibrate_activation`), then trained by :func:`adapted` (``config``: default
    :meth:`DomainConfig.two_sided`); a query-side stage can follow (:func:`adapted`'s example).

    Args:
        corpus, folder, cache_dir, verbose: as for :func:`adapted`.
        config: a two-sided :class:`~pyterrier_lsr.train.DomainConfig`.
        encoder: the dense encoder the head is put on.
        target_active: the fraction of (document, term) pairs active before training.
        calibration_docs: how many documents calibrate the head.

    Returns:
        The trained :class:`~pyterrier_lsr.Splade`, reloaded from ``folder`` on a second call.

    Raises:
        ValueError: a query-side ``config``, or ``folder`` built with other settings.

    Example::

        minilm_splade = new_head_splade(corpus, "runs/minilm-splade")
        index = sparse_index("runs/minilm-splade.lsr", minilm_splade, corpus)
    """
    config = _two_sided(config, 'new_head_splade')

    def start():
        splade = Splade.from_encoder(encoder)
        calibrate_activation(splade.model, splade.tokenizer, _texts(corpus[:calibration_docs]), target_active)
        return splade
    return adapted(start, corpus, folder, config, cache_dir, verbose,
                   {'method': 'new-head', 'encoder': encoder, 'target_active': target_active,
                    'calibration_docs': calibration_docs})


def vt_splade(corpus: Sequence[dict], folder, config: DomainConfig | None = None, base: str = 'splade-tiny',
              extend: int = 1000, warmup: DomainConfig | None = None, cache_dir=None,
              verbose: bool = True) -> Splade:
    """VT-SPLADE by domain extension: ``base``'s WordPiece vocabulary gains the ``extend`` most frequent corpus
    words it splits (:func:`~..models.vocabularies.extend_vocabulary`), the model moves to it
    (:func:`~..models.vocab_transfer.transfer_vocabulary`: old tokens copied, new words composed), then SPLADE training
    (:func:`adapted`; ``config``: default :meth:`DomainConfig.two_sided`). With ``warmup`` (e.g.
    ``DomainConfig.two_sided(steps=40, lr=1e-3)``) a first run in ``<folder>/warmup`` trains only the added words'
    embedding rows and output biases (:func:`~pyterrier_lsr.models.vocabularies.new_rows_only`), with the same
    held-out selection and guard. A query-side stage can follow (:func:`adapted`'s example; ``examples/course.py``).

    Args:
        corpus, folder, cache_dir, verbose: as for :func:`adapted`.
        config: a two-sided :class:`~pyterrier_lsr.train.DomainConfig`.
        base: the SPLADE model whose vocabulary is extended.
        extend: how many corpus words to add.
        warmup: an optional two-sided config for training the new rows alone first.

    Returns:
        The trained VT-SPLADE :class:`~pyterrier_lsr.Splade`, reloaded from ``folder`` on a second call.

    Raises:
        ValueError: a query-side config, ``folder`` built with other settings (or with/without a warm-up), or a
            corpus with no word to add.

    Example::

        vt = vt_splade(corpus, "runs/vt", DomainConfig.two_sided(steps=120))
        index = sparse_index("runs/vt.lsr", vt, corpus)
    """
    config = _two_sided(config, 'vt_splade')
    warmup = warmup and _two_sided(warmup, 'the vt_splade warm-up')
    system = _with_corpus({'method': 'vt-splade', 'base': base, 'extend': extend}, corpus)
    warm_folder = Path(folder) / 'warmup'
    if warmup is not None:
        _finished(warm_folder, warmup, system)  # a warm-up with other settings is refused before any work
    if _finished(folder, config, system) and (warmup is not None) != (warm_folder / DONE_FILE).is_file():
        raise ValueError(f'{folder} holds a VT-SPLADE model trained {"without" if warmup else "with"} an embedding '
                         'warm-up; use another folder or remove it')

    def start():
        splade = Splade.from_pretrained(base)
        target, words = extend_vocabulary(splade.tokenizer, _texts(corpus), extend)
        if not words:
            raise ValueError(f"no corpus word that {base}'s vocabulary splits occurs twice or more: nothing to add")
        model, tokenizer, _ = transfer_vocabulary(splade.model, splade.tokenizer, target)
        extended = Splade(model, tokenizer, name=f'{base}+{extend}')
        if warmup is None:
            return extended
        with new_rows_only(model, splade.model.vocab_size):
            return adapted(lambda: extended, corpus, warm_folder, warmup, cache_dir, verbose, system)
    return adapted(start, corpus, folder, config, cache_dir, verbose, system)


def sae_splade(corpus: Sequence[dict], folder, config: DomainConfig | None = None, backbone: str = 'splade-tiny',
               sae: dict | None = None, max_train_vectors: int | None = SAE_SPLADE_STATES, cache_dir=None,
               verbose: bool = True, stage1_extra: Sequence[dict] = ()) -> SaeSplade:
    """SAE-SPLADE: stage 1 a TopK SAE on ``backbone``'s token states of the corpus (:func:`train_token_sae`,
    ``sae``: :class:`~pyterrier_lsr.models.sae.SAEConfig` settings, default :data:`SAE_SPLADE`, trained on a seeded
    sample of at most ``max_train_vectors`` token states, default :data:`SAE_SPLADE_STATES`, None for all; token states
    cached in ``<folder>/token_cache``), stage 2 :meth:`SaeSplade.from_backbone` trained by :func:`adapted`
    (``config``: default :meth:`DomainConfig.two_sided`); a query-side stage can follow (:func:`adapted`'s example).

    ``stage1_extra``: more documents (``docno``, ``text``) whose token states join the corpus's in stage 1's sample
    only, e.g. a related collection for a small corpus; stage 2 and the index see ``corpus`` alone.

    Args:
        corpus, folder, cache_dir, verbose: as for :func:`adapted`.
        config: a two-sided :class:`~pyterrier_lsr.train.DomainConfig`.
        backbone: the encoder whose token states the SAE reads.
        sae: stage 1's SAE settings; max_train_vectors: stage 1's sample size.
        stage1_extra: more documents for stage 1 only.

    Returns:
        The trained :class:`~pyterrier_lsr.SaeSplade`, reloaded from ``folder`` on a second call.

    Raises:
        ValueError: a query-side config, invalid SAE settings, or ``folder`` built with other settings.

    Example::

        sae = sae_splade(corpus, "runs/sae-splade")
        index = sparse_index("runs/sae-splade.lsr", sae, corpus)
    """
    config = _two_sided(config, 'sae_splade')
    sae = sae or dict(SAE_SPLADE)
    system = {'method': 'sae-splade', 'backbone': backbone, 'sae': sae, 'max_train_vectors': max_train_vectors}
    if stage1_extra:  # recorded only when given, so that folders built before this option still match
        system['stage1_extra'] = corpus_key(dict(check_documents(stage1_extra, where='stage1_extra')))

    def start():
        stage1, _ = train_token_sae(backbone, _texts(corpus) + _texts(stage1_extra), sae,
                                    cache_dir=Path(folder) / 'token_cache', max_train_vectors=max_train_vectors,
                                    verbose=verbose)
        return SaeSplade.from_backbone(backbone, stage1)
    return adapted(start, corpus, folder, config, cache_dir, verbose, system)
