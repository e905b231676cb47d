"""The driver of domain adaptation: :class:`DomainAdaptation` runs one adaptation (data, training, held-out
selection, the never-worse guard, the saved model and log); :func:`domain_adapt` is the one-call form.

The recipe: pseudo-queries sampled from documents (:mod:`.queries`), candidates and teacher scores from BM25 and a
dense bi-encoder over the whole corpus (:mod:`.teacher`, cached with the examples by :mod:`.cache`), training with
the bundled loop (:func:`~pyterrier_lsr.train.loop.run_loop`) of the query encoder alone against frozen documents
(``side='query'``, the default; :mod:`.frozen`) or of the whole model (``side='both'``), and selection on held-out
pseudo-queries (:mod:`.heldout`): every ``eval_every`` steps the student ranks a sub-corpus of ``heldout_corpus``
documents and is scored against the teacher's ranking. The best step's weights are kept; if no step beats the
starting model by more than ``min_gain`` (the never-worse guard), the starting weights are restored and the log says
so. No test query is ever used, so the guard judges pseudo-queries only: it is no promise about real queries.
"""
import copy
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ...core import storage
from ...core.checks import UniqueDocnos
from ...core.encoding import is_blank
from ...core.quiet import quiet_native
from ...core.storage import write_json
from ...kinds.asymmetric import AsymmetricSplade
from ...kinds.base import MODEL_ARTIFACT
from ...kinds.inference_free import InferenceFreeSplade
from ...kinds.sae_splade import SaeSplade
from ...kinds.splade import Splade
from ...stages.query import StaticQueryWeights
from .. import losses as L
from ..data import Example
from ..loop import batch_loss, micro_batches, run_loop
from .cache import build_data
from .config import DomainConfig
from .frozen import frozen_documents, frozen_parameters
from .heldout import heldout_scores

DONE_FILE = 'domain_adapt.json'
# the marked kinds of the output folder (model/, train/, the log) and of the cache folder (reused across runs)
OUTPUT_KIND = 'domain_adaptation'
CACHE_KIND = storage.DOMAIN_CACHE  # shared with the embedding caches (see storage.SHARED_CACHES)
# kinds whose query side can adapt alone: a copy of the query encoder trains, or an inference-free model's table
QUERY_SIDE_CLASSES = (Splade, SaeSplade, AsymmetricSplade, InferenceFreeSplade)


def claim_output(output_dir) -> Path:
    """``output_dir`` as a domain-adaptation folder of ours (see :func:`pyterrier_lsr.core.storage.claim_folder`),
    before
    any work: a user's folder (its ``domain_adapt.json`` or ``model/`` would be replaced) is refused."""
    return storage.claim_folder(output_dir, OUTPUT_KIND, 'domain-adaptation folder')


def claim_cache(cache_dir) -> Path:
    """``cache_dir`` as a domain-adaptation cache of ours, shared by runs (see :func:`claim_output`)."""
    return storage.claim_folder(cache_dir, CACHE_KIND, 'domain-adaptation cache folder')


def _copy(module: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class DomainAdaptation:
    """One run of :func:`domain_adapt` (same arguments): :meth:`run` returns ``(model, log)``. The arguments are
    checked when the object is made, before any work."""

    def __init__(self, splade, corpus, output_dir, config: DomainConfig | None = None, cache_dir=None,
                 report: Callable[[torch.nn.Module], dict[str, float]] | None = None, verbose: bool = True,
                 documents=None):
        config = config or DomainConfig()
        if config.side == 'query' and type(splade) not in QUERY_SIDE_CLASSES:
            raise ValueError(f"side='query' adapts the query encoder of a "
                             f"{' or '.join(c.__name__ for c in QUERY_SIDE_CLASSES)}, not of a "
                             f'{type(splade).__name__} (use DomainConfig.two_sided)')
        if documents is not None and config.side != 'query':
            raise ValueError("documents= serves query-side adaptation (side='query'); two-sided training re-encodes "
                             'them')
        config.train_config().check_lengths(splade.tokenizer)
        self.splade, self.config, self.report, self.verbose, self.documents = splade, config, report, verbose, documents
        self.output_dir = Path(output_dir)
        self.cache = Path(cache_dir) if cache_dir is not None else self.output_dir / 'cache'
        # docnos checked like every index's (str() made 1 and '1' one document, None the docno 'None')
        unique, self.docs = UniqueDocnos('the corpus to adapt to'), {}
        for doc in corpus:
            docno = unique.add(doc['docno'])
            if not is_blank(doc.get('text')):
                self.docs[docno] = doc['text']
        self.curve: list[dict] = []
        self.step = 0
        self.best_score, self.best_step, self.best_state = None, 0, None

    def prepare(self):
        """The data (cached), the trained modules and, for query-side adaptation, the frozen documents."""
        config, splade = self.config, self.splade
        claim_cache(self.cache)
        self.data, self.cache_hit = build_data(self.docs, self.cache, config, self.verbose)
        self.examples = [Example(e['query'], self.docs[e['pos']], [self.docs[d] for d in e['negatives']],
                                 e['teacher']) for e in self.data['examples']]
        if len(self.examples) < config.batch_size:  # batches are whole: fewer examples would never make one
            raise ValueError(f'{len(self.examples)} training examples, fewer than batch_size={config.batch_size}: '
                             'lower batch_size or negatives')
        self.model, self.tokenizer = splade.model, splade.tokenizer
        # an inference-free model (its `query_side` a static table) trains that table, with the document encoder or
        # (side 'query') alone; FLOPS regularizes documents only, as a static query side costs nothing to run
        self.query_side = getattr(splade, 'query_side', None)
        self.query_weights = (None if self.query_side is None
                              else StaticQueryWeights(self.tokenizer, init=self.query_side.weights))
        self.train_config = config.train_config()
        if self.query_weights is not None:
            self.train_config = replace(self.train_config, lambda_q=0.)
        self.frozen = None
        if config.side == 'query':
            if self.query_weights is None:
                self.model = copy.deepcopy(getattr(splade, 'query_splade', splade).model)
            needed = {d for e in self.data['examples'] for d in [e['pos']] + e['negatives']}
            needed |= {d for h in self.data['heldout'] for d in h['ranked']} | set(self.data['heldout_extra'])
            self.frozen = frozen_documents(splade, self.docs, sorted(needed), self.documents, config.precision,
                                           self.verbose)
            self.train_config = replace(self.train_config, lambda_d=0.)
        self.table_only = self.frozen is not None and self.query_weights is not None
        self.trained = torch.nn.ModuleDict({**({} if self.table_only else {'model': self.model}),
                                            **({'query': self.query_weights} if self.query_weights is not None
                                               else {})})
        self.initial = _copy(self.trained)
        self.params = {name: p for name, p in self.trained.named_parameters() if p.requires_grad}

    def _sync_query_side(self):
        if self.query_weights is not None:
            self.splade.query_side = self.query_weights.to_encoder(max_length=self.query_side.max_length)

    def evaluate(self, model) -> dict[str, float]:
        """Held-out scores of the current step (and ``report``'s), logged; the best step's weights are kept."""
        scores = heldout_scores(model, self.tokenizer, self.data['heldout'], self.docs, self.config,
                                self.data['heldout_extra'], self.query_weights, self.frozen)
        if self.report is not None:
            self._sync_query_side()
            scores.update(self.report(model))
        self.curve.append({'step': self.step, **scores})
        score = scores[self.config.select_on]
        if self.best_score is None or score > self.best_score:
            if self.step > 0:
                self.best_state = _copy(self.trained)
            self.best_score, self.best_step = score, self.step
        return scores

    def loss(self, batch, step: int):
        self.step = step + 1  # run_loop evaluates after the optimizer step that makes `step + 1`
        loss, logs = batch_loss(self.model, self.tokenizer, batch, self.train_config, step, self.query_weights,
                                self.frozen)
        if self.config.anchor:
            drift = L.l2_drift(self.params, self.initial)
            loss = loss + self.config.anchor * drift
            logs.update(loss=loss.item(), drift=drift.item())
        return loss, logs

    def decision(self, improved: bool, start_score: float) -> str:
        """The guard's decision in words, saying what it measured: held-out pseudo-queries, not test topics."""
        name, measured = self.config.select_on, f"{len(self.data['heldout'])} held-out pseudo-queries"
        if improved:
            return (f'selected step {self.best_step}: {name} on {measured} {self.best_score:.4f} > start '
                    f'{start_score:.4f} (pseudo-queries from the corpus, not test topics)')
        return (f"never-worse guard: no step beat the starting model's {name} on {measured} ({start_score:.4f}) by "
                f'more than {self.config.min_gain}; returning the starting model')

    def run(self):
        """Adapts and returns ``(model, log)``; see :func:`domain_adapt`."""
        config, splade = self.config, self.splade
        start_time = time.time()
        claim_output(self.output_dir)
        # the selected model is saved at the end: a folder it may not replace is refused now, not after the training
        storage.check_replaceable(self.output_dir / 'model', MODEL_ARTIFACT, True, 'model folder')
        self.prepare()
        prep_seconds = time.time() - start_time  # data, teacher and (query side) the documents' encoding
        start_score = self.evaluate(self.model)[config.select_on]
        train_start = time.time()
        extra = [self.query_weights.weight] if self.query_weights is not None else []
        with frozen_parameters(self.model if self.table_only else None):
            train_log = run_loop(self.model, self.loss, micro_batches(self.examples, config.batch_size, config.seed),
                                 self.output_dir / 'train', self.train_config, tokenizer=self.tokenizer,
                                 evaluate=self.evaluate, verbose=self.verbose, extra_parameters=extra)
        train_seconds = time.time() - train_start
        improved = self.best_step > 0 and self.best_score > start_score + config.min_gain
        self.trained.load_state_dict(self.best_state if improved else self.initial)
        if improved:
            self._sync_query_side()
            if self.frozen is not None and not self.table_only:
                splade = AsymmetricSplade(splade.model, self.tokenizer, self.model,
                                          getattr(splade, 'sides', type(splade)), device=splade.device,
                                          max_length=splade.max_length, batch_size=splade.batch_size,
                                          precision=splade.precision, name=splade.name)
        elif self.query_side is not None:
            splade.query_side = self.query_side  # exactly the starting table, not its float32 round trip
        self.model.eval()
        decision = self.decision(improved, start_score)
        log = {'config': asdict(config), 'examples': len(self.examples), 'heldout_queries': len(self.data['heldout']),
               'cache_hit': self.cache_hit, 'curve': self.curve, 'start_score': start_score,
               'best_score': self.best_score, 'selected_step': self.best_step if improved else 0,
               'guard': not improved, 'decision': decision,
               'documents_from': None if self.documents is None else str(self.documents.path),
               'prep_seconds': round(prep_seconds, 1), 'train_seconds': round(train_seconds, 1),
               'train_log': train_log}
        with quiet_native():  # transformers' "Writing model shards" bar, whatever `verbose`
            splade.save_pretrained(str(self.output_dir / 'model'))
        write_json(self.output_dir / DONE_FILE, log, indent=None)
        if self.verbose:
            print(decision)
        return splade, log


def domain_adapt(splade, corpus, output_dir, config: DomainConfig | None = None, cache_dir=None,
                 report: Callable[[torch.nn.Module], dict[str, float]] | None = None, verbose: bool = True,
                 documents=None):
    """Adapts ``splade`` (a :class:`~pyterrier_lsr.Splade`, trained in place) to ``corpus`` (``docno, text`` dicts)
    and returns ``(splade, log)``: the selected weights (the starting ones if the never-worse guard fired) and a dict
    with the settings, the held-out curve, the selected step, the guard's decision and timings (also written to
    ``output_dir/domain_adapt.json``; the selected model is saved to ``output_dir/model``). With ``verbose`` the
    decision is printed once, at the end; the guard judges held-out pseudo-queries, never test topics.

    An :class:`~pyterrier_lsr.InferenceFreeSplade` (doc-only) trains its static query table (starting from its
    weights, e.g. corpus idf) with the document encoder (``side='both'``) or alone against its frozen documents
    (``side='query'``: its documents, and any index of them, stay valid), and ``splade.query_side`` holds the
    selected table.

    With ``config.side='query'`` only a copy of the query encoder trains, against the documents as the starting
    model encodes them (each encoded once, at ``splade.max_length``): ``splade`` is left as it is and an
    :class:`~pyterrier_lsr.AsymmetricSplade` (documents: ``splade``'s model, queries: the adapted copy) is returned,
    so an index built with ``splade`` serves it unchanged (``index.retriever(query_encoder=adapted.query_encoder())``).
    Documents carry no gradient, so a step costs a fraction of a two-sided one and ``negatives`` can be many.
    ``documents`` (optional, ``side='query'`` only): an :class:`~pyterrier_lsr.LsrIndex` of ``corpus`` built with
    ``splade``, whose stored vectors are used instead of encoding the documents again (checked on a few of them).

    ``report`` (optional, e.g. :func:`~pyterrier_lsr.train.experiment_evaluator` on test topics; for a doc-only model
    with ``query_side=splade.query_encoder``, which sees the table being trained) is called at the same steps as the
    held-out evaluation and logged next to it; it never influences the selection.
    """
    return DomainAdaptation(splade, corpus, output_dir, config, cache_dir, report, verbose, documents).run()
