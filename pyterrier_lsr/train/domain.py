"""Domain adaptation from a corpus alone: ``domain_adapt(splade, corpus, output_dir, DomainConfig(...))``.

The recipe: pseudo-queries sampled from documents (sentence windows or high-idf keywords), candidates from BM25 and a
dense bi-encoder over the whole corpus, teacher scores = ``teacher_scale`` x the sum of per-candidate-list z-scores of
BM25 and the dense cosine (the fusion that beat either alone on Vaswani), training with the bundled loop
(:func:`~pyterrier_lsr.train.loop.run_loop`) of the query encoder alone against frozen documents (``side='query'``,
the default) or of the whole model (``side='both'``), and selection on held-out pseudo-queries: every
``eval_every`` steps the student ranks a sub-corpus of ``heldout_corpus`` documents (every held-out query's pool, the
teacher's top ``heldout_pool``, plus random documents) and is scored against the teacher's ranking, over the pool
alone (re-ranking) and over the whole sub-corpus (first-stage retrieval: documents from outside the pools that the
student ranks high cost score). The best step's weights are kept; if no step beats the starting model by more than
``min_gain`` (the never-worse guard), the starting weights are restored and the log says so. No test query is ever
used.

Everything that costs time is cached under ``cache_dir`` as JSON / npz (never pickle): a PISA BM25 index and the
dense document embeddings per corpus, and the examples with their teacher scores per data setting, so a second call
with other training settings goes straight to training.
"""
import copy
import hashlib
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..asymmetric import AsymmetricSplade
from ..encoders import Splade
from ..encoding import is_blank
from ..inference_free import InferenceFreeSplade
from ..query import StaticQueryWeights
from ..sae_splade import SaeSplade
from . import losses as L
from .data import Example, pseudo_query
from .loop import TrainConfig, micro_batches, batch_loss, bf16_autocast, run_loop

SIDES = ('both', 'query')
QUERY_KINDS = ('sentence', 'keywords', 'mixed')
CANDIDATES = ('bm25', 'teacher')
SELECT_ON = ('heldout_ndcg', 'heldout_mrr', 'heldout_first_ndcg', 'heldout_first_mrr')
# an index passed as `documents` must match a fresh encoding of a few documents to this; loose enough for an index
# encoded at another precision, far below what another model or max_length changes
CHECKED_DOCUMENTS = 8
CHECK_TOLERANCE = 0.05
# kinds whose query side can adapt alone: a copy of the query encoder trains, or an inference-free model's table
QUERY_SIDE_CLASSES = (Splade, SaeSplade, AsymmetricSplade, InferenceFreeSplade)


@dataclass
class DomainConfig:
    """Settings of :func:`domain_adapt`. The defaults are the recipe of benchmarks/RESULTS.md ("Query-side
    adaptation"): the query encoder alone adapts (documents frozen), by listwise distillation over the teacher's top
    64 per pseudo-query. :meth:`two_sided` is the recipe for models whose documents must train too (a new vocabulary,
    head or latents)."""
    side: str = 'query'                # 'query': adapt the query encoder alone, documents frozen; 'both'
    steps: int = 360
    batch_size: int = 8
    lr: float = 1e-4
    lr_multipliers: dict[str, float] = field(default_factory=dict)  # parameter-name prefix -> factor of lr
    anchor: float = 0.0                # weight of the L2 pull to the starting weights (sum of squared drifts)
    losses: dict[str, float] = field(default_factory=lambda: {'infonce': 1.0, 'kl': 1.0})
    lambda_q: float = 1e-3
    lambda_d: float = 1e-3
    doc_max_length: int = 96
    bf16: bool = False                 # bf16 autocast: faster with AMX/avx512_bf16, ~10x slower without
    queries: str = 'sentence'          # pseudo-queries: sentence windows, high-idf keywords, or alternating
    per_doc: int = 3                   # pseudo-queries per sampled document
    candidates: str = 'teacher'        # 'bm25': negatives sampled from BM25's top `depth`; 'teacher': teacher's top
    negatives: int = 63                # candidates per example = 1 + negatives
    depth: int = 30
    pool: int = 50                     # BM25 and dense top-`pool` per query form the teacher's candidate pool
    teachers: tuple[str, ...] = ('bm25', 'dense')
    dense_teacher: str = 'all-MiniLM-L6-v2'
    teacher_scale: float = 2.0
    heldout: int = 60                  # held-out pseudo-queries (from documents no training query comes from)
    heldout_pool: int = 10
    heldout_corpus: int = 1000         # documents the held-out queries retrieve from: their pools + random ones
    eval_every: int = 40
    select_on: str = 'heldout_first_ndcg'  # one of SELECT_ON (see heldout_scores)
    min_gain: float = 0.0              # the adapted model must beat the start by more than this on `select_on`
    seed: int = 0

    def __post_init__(self):
        if self.side not in SIDES:
            raise ValueError(f'side must be one of {SIDES}, got {self.side!r}')
        if self.queries not in QUERY_KINDS:
            raise ValueError(f'queries must be one of {QUERY_KINDS}, got {self.queries!r}')
        if self.candidates not in CANDIDATES:
            raise ValueError(f'candidates must be one of {CANDIDATES}, got {self.candidates!r}')
        if not set(self.teachers) <= {'bm25', 'dense'} or not self.teachers:
            raise ValueError(f"teachers must be a non-empty subset of ('bm25', 'dense'), got {self.teachers}")
        if self.select_on not in SELECT_ON:
            raise ValueError(f'select_on must be one of {SELECT_ON}, got {self.select_on!r}')
        self.teachers = tuple(self.teachers)

    @classmethod
    def two_sided(cls, **overrides) -> 'DomainConfig':
        """The recipe when documents train too (each step encodes every candidate with gradients, so 3 BM25
        negatives instead of 63 and one pseudo-query per document): ``side='both', steps=120, per_doc=1,
        candidates='bm25', negatives=3``, then ``overrides``."""
        return cls(**{'side': 'both', 'steps': 120, 'per_doc': 1, 'candidates': 'bm25', 'negatives': 3, **overrides})

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup_steps=self.steps // 10,
                           lr_multipliers=dict(self.lr_multipliers),
                           losses=dict(self.losses), lambda_q=self.lambda_q, lambda_d=self.lambda_d,
                           flops_warmup_steps=self.steps // 3, doc_max_length=self.doc_max_length, bf16=self.bf16,
                           seed=self.seed, log_every=10, eval_every=self.eval_every)


def _key(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def _write_json(path: Path, value):
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


_WORD = re.compile(r'[a-z][a-z0-9-]{2,}')


def document_frequencies(texts: Sequence[str]) -> Counter:
    return Counter(w for text in texts for w in set(_WORD.findall(text.lower())))


def keyword_query(text: str, df: Counter, num_docs: int, rng: random.Random, min_words: int = 2,
                  max_words: int = 5) -> str:
    """A keyword pseudo-query: ``min_words..max_words`` distinct words of ``text`` drawn with probability proportional
    to tf x idf², kept in document order (so frequent, uninformative words are rarely drawn)."""
    words = _WORD.findall(text.lower())
    tf = Counter(words)
    if not tf:
        return pseudo_query(text, rng)
    vocab = list(tf)
    weights = [tf[w] * math.log(1 + num_docs / df.get(w, 1)) ** 2 for w in vocab]
    k = min(len(vocab), rng.randint(min_words, max_words))
    chosen = set()
    while len(chosen) < k:
        chosen.add(rng.choices(vocab, weights)[0])
    first = {}
    for i, w in enumerate(words):
        first.setdefault(w, i)
    return ' '.join(sorted(chosen, key=first.get))


def make_queries(docs: dict[str, str], docnos: Sequence[str], kind: str, per_doc: int, rng: random.Random,
                 df: Counter) -> list[dict]:
    """``per_doc`` pseudo-queries for each of ``docnos`` (``mixed`` alternates sentence and keyword queries)."""
    out = []
    for docno in docnos:
        for i in range(per_doc):
            style = kind if kind != 'mixed' else ('sentence', 'keywords')[(len(out)) % 2]
            text = (pseudo_query(docs[docno], rng) if style == 'sentence'
                    else keyword_query(docs[docno], df, len(docs), rng))
            if not is_blank(text):
                out.append({'qid': f'{docno}/{i}', 'query': text, 'pos': docno})
    return out


class _Teacher:
    """BM25 (PISA) and dense (bi-encoder cosine) scores of pseudo-queries against the whole corpus, both cached."""

    def __init__(self, docs: dict[str, str], cache: Path, config: DomainConfig, corpus_key: str, verbose: bool):
        self.docs, self.config, self.verbose = docs, config, verbose
        self.docnos = list(docs)
        self.row = {d: i for i, d in enumerate(self.docnos)}
        self.cache, self.corpus_key = cache, corpus_key
        self._bm25 = self._dense = self._doc_emb = None

    def bm25(self):
        if self._bm25 is None:
            import pyterrier_pisa
            index = pyterrier_pisa.PisaIndex(str(self.cache / f'bm25-{self.corpus_key}.pisa'), text_field='text')
            if not index.built():
                index.index({'docno': d, 'text': t} for d, t in self.docs.items())
            self._bm25 = index
        return self._bm25

    def dense(self):
        if self._dense is None:
            from ..offline import resolve_model
            from .teachers import DenseScorer
            self._dense = DenseScorer(resolve_model(self.config.dense_teacher))
            path = self.cache / f'dense-{_key([self.config.dense_teacher, self.corpus_key])}.npz'
            if path.exists():
                self._doc_emb = np.load(path)['embeddings']
            else:
                self._doc_emb = self._dense.embed([self.docs[d] for d in self.docnos]).astype(np.float32)
                tmp = path.with_name(path.stem + '.tmp.npz')
                np.savez(tmp, embeddings=self._doc_emb)
                os.replace(tmp, path)
        return self._dense

    def pools(self, queries: list[dict], depth: int) -> tuple[list[dict[str, dict[str, float]]], dict]:
        """Per query: ``{docno: {'bm25': s, 'dense': s}}`` over the union of each teacher's top ``depth`` and the
        source document (a candidate outside BM25's top ``depth`` gets BM25 score 0), and BM25's
        ``{qid: {docno: score}}``."""
        frame = pd.DataFrame({'qid': [q['qid'] for q in queries], 'query': [q['query'] for q in queries]})
        pools = [{q['pos']: {}} for q in queries]
        bm25 = {}
        if 'bm25' in self.config.teachers or self.config.candidates == 'bm25':
            res = self.bm25().bm25(num_results=depth, verbose=self.verbose)(frame)
            for qid, docno, score in zip(res['qid'], res['docno'], res['score']):
                bm25.setdefault(qid, {})[docno] = float(score)
            for pool, q in zip(pools, queries):
                pool.update({d: {} for d in bm25.get(q['qid'], {})})
        if 'dense' in self.config.teachers:
            q_emb = self.dense().embed([q['query'] for q in queries])
            sims = q_emb @ self._doc_emb.T
            top = np.argsort(-sims, axis=1)[:, :depth]
            for i, pool in enumerate(pools):
                pool.update({self.docnos[j]: {} for j in top[i]})
                for d, scores in pool.items():
                    scores['dense'] = float(sims[i, self.row[d]])
        for pool, q in zip(pools, queries):
            for d, scores in pool.items():
                if 'bm25' in self.config.teachers:
                    scores['bm25'] = bm25.get(q['qid'], {}).get(d, 0.)
        return pools, bm25


def _zsum(components: list[dict[str, float]], teachers: Sequence[str]) -> np.ndarray:
    """Sum over teachers of the z-scores within this candidate list (as :class:`ZScoreFusion` computes them)."""
    total = np.zeros(len(components))
    for t in teachers:
        s = np.array([c[t] for c in components])
        std = s.std(ddof=1) if len(s) > 1 else 0.
        total += (s - s.mean()) / (std if std > 0 else 1.)
    return total


def build_data(docs: dict[str, str], cache: Path, config: DomainConfig, verbose: bool = True) -> tuple[dict, bool]:
    """Training examples (with teacher scores) and held-out queries (with their pools and teacher ranks),
    cached as JSON under ``cache`` keyed by every setting that produces them; returns (data, cache_hit)."""
    corpus_key = _key([len(docs), hashlib.sha1('\n'.join(f'{d}\t{t}' for d, t in docs.items()).encode()).hexdigest()])
    settings = {k: getattr(config, k) for k in ('steps', 'batch_size', 'queries', 'per_doc', 'candidates', 'negatives',
                                                 'depth', 'pool', 'teachers', 'dense_teacher', 'teacher_scale',
                                                 'heldout', 'heldout_pool', 'heldout_corpus', 'seed')}
    settings['teachers'] = list(settings['teachers'])
    path = cache / f'domain-data-{_key([corpus_key, settings])}.json'
    if path.exists():
        return json.loads(path.read_text()), True
    cache.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    docnos = list(docs)
    rng.shuffle(docnos)
    heldout_docs = docnos[:config.heldout]
    wanted = math.ceil(config.steps * config.batch_size / config.per_doc)
    train_docs = docnos[config.heldout:config.heldout + wanted]
    if len(train_docs) < 2 or len(train_docs) * config.per_doc < config.batch_size:
        raise ValueError(f'corpus of {len(docs)} documents is too small for {config.heldout} held-out queries '
                         f'and batches of {config.batch_size}')
    df = document_frequencies(docs.values())
    teacher = _Teacher(docs, cache, config, corpus_key, verbose)
    # the held-out queries are the same for every training setting (mixed styles), so arms compare on one yardstick
    heldout_q = make_queries(docs, heldout_docs, 'mixed', 1, random.Random(config.seed + 1), df)
    train_q = make_queries(docs, train_docs, config.queries, config.per_doc, rng, df)
    heldout = []
    pools, _ = teacher.pools(heldout_q, config.pool)
    for q, pool in zip(heldout_q, pools):
        ranked = sorted(pool, key=dict(zip(pool, _zsum(list(pool.values()), config.teachers))).get, reverse=True)
        heldout.append({'query': q['query'], 'pos': q['pos'], 'ranked': ranked[:config.heldout_pool]})
    pooled = {d for h in heldout for d in h['ranked']}
    others = [d for d in docs if d not in pooled]
    extra = random.Random(config.seed + 2).sample(others, min(len(others), max(0, config.heldout_corpus - len(pooled))))
    examples = []
    pools, bm25 = teacher.pools(train_q, max(config.pool, config.depth))
    for q, pool in zip(train_q, pools):
        pos_text = docs[q['pos']]
        others = [d for d in pool if d != q['pos'] and docs[d] != pos_text]
        if config.candidates == 'bm25':
            retrieved = bm25.get(q['qid'], {})
            ranked = [d for d in sorted(retrieved, key=retrieved.get, reverse=True) if d in others][:config.depth]
            negatives = rng.sample(ranked, min(config.negatives, len(ranked)))
        else:
            z = dict(zip(others, _zsum([pool[d] for d in others], config.teachers)))
            negatives = sorted(others, key=z.get, reverse=True)[:config.negatives]
        if len(negatives) < config.negatives:
            continue
        cands = [q['pos']] + negatives
        scores = config.teacher_scale * _zsum([pool[d] for d in cands], config.teachers)
        examples.append({'query': q['query'], 'pos': q['pos'], 'negatives': negatives, 'teacher': scores.tolist()})
    if not examples:
        raise ValueError(f'no pseudo-query has {config.negatives} negatives (candidates={config.candidates!r}, '
                         f'pool={config.pool}, depth={config.depth}) in a corpus of {len(docs)} documents: '
                         'lower negatives')
    data = {'settings': settings, 'examples': examples, 'heldout': heldout, 'heldout_extra': extra}
    _write_json(path, data)
    return data, False


@torch.inference_mode()
def _vectors(model, tokenizer, texts: list[str], max_length: int, bf16: bool, batch_size: int = 64) -> torch.Tensor:
    device = next(model.parameters()).device
    out = []
    with bf16_autocast(device, bf16):
        for start in range(0, len(texts), batch_size):
            inputs = tokenizer(texts[start:start + batch_size], truncation=True, max_length=max_length, padding=True,
                               return_tensors='pt')
            out.append(model(inputs['input_ids'].to(device), inputs['attention_mask'].to(device)).float().to_sparse())
    return torch.cat(out)


class FrozenDocuments:
    """The documents' side of query-only adaptation: each text's vector under the (frozen) document model, computed
    once (:meth:`encode`, at the length an index encodes it) or read from an index of that model
    (:meth:`from_index`), and looked up by text as ``(texts, tokenizer, max_length) -> vectors``."""

    def __init__(self, size: int):
        self.size = size
        self.row: dict[str, int] = {}
        self.terms, self.weights = [], []

    def _add(self, text: str, terms: torch.Tensor, weights: torch.Tensor):
        self.row[text] = len(self.terms)
        self.terms.append(terms)
        self.weights.append(weights)

    @classmethod
    def encode(cls, model, tokenizer, texts: Sequence[str], max_length: int, bf16: bool,
               verbose: bool = False) -> 'FrozenDocuments':
        frozen = cls(model.vocab_size)
        unique = list(dict.fromkeys(texts))
        for start in tqdm(range(0, len(unique), 64), desc='encoding documents', unit='batch', disable=not verbose):
            batch = unique[start:start + 64]
            with torch.inference_mode():
                dense = _vectors(model, tokenizer, batch, max_length, bf16).to_dense()
            for text, row in zip(batch, dense):
                terms = row.nonzero().squeeze(1)
                frozen._add(text, terms.clone(), row[terms].clone())
        return frozen

    @classmethod
    def from_index(cls, index, docs: dict[str, str], docnos: set[str], terms: Sequence[str]) -> 'FrozenDocuments':
        """The vectors of ``docnos`` (their texts in ``docs``) as stored by ``index`` (an
        :class:`~pyterrier_lsr.LsrIndex`, whose float vectors are the encoder's own); its terms must be among
        ``terms``, the names of the model's term ids."""
        frozen = cls(len(terms))
        vocabulary = {t: i for i, t in enumerate(terms)}
        for docno, vector in index.vectors():
            if docno in docnos:
                try:
                    ids = [vocabulary[t] for t in vector]
                except KeyError as unknown:
                    raise ValueError(f'{index}: document {docno!r} has a term outside the model\'s vocabulary '
                                     f'({unknown}): the index was built with another model') from None
                frozen._add(docs[docno], torch.tensor(ids, dtype=torch.long),
                            torch.tensor(list(vector.values()), dtype=torch.float32))
        missing = [d for d in docnos if docs[d] not in frozen.row]
        if missing:
            raise ValueError(f'{index} lacks {len(missing)} documents of the corpus (e.g. {missing[0]!r}): '
                             'it was built from another corpus')
        return frozen

    def __call__(self, texts: Sequence[str], tokenizer=None, max_length=None) -> torch.Tensor:
        out = torch.zeros(len(texts), self.size)
        for i, text in enumerate(texts):
            j = self.row[text]
            out[i, self.terms[j]] = self.weights[j]
        return out


def _frozen_documents(splade, docs: dict[str, str], docnos: list[str], index, bf16: bool,
                      verbose: bool) -> FrozenDocuments:
    """``docnos``' vectors under ``splade``'s document model: encoded, or read from ``index`` after checking on a few
    documents that it holds what ``splade`` encodes (another model or ``max_length`` is refused)."""
    encode = partial(FrozenDocuments.encode, splade.model, splade.tokenizer, max_length=splade.max_length, bf16=bf16)
    if index is None:
        return encode([docs[d] for d in docnos], verbose=verbose)
    frozen = FrozenDocuments.from_index(index, docs, set(docnos), splade.terms)
    sample = [docs[d] for d in docnos[::max(1, len(docnos) // CHECKED_DOCUMENTS)][:CHECKED_DOCUMENTS]]
    difference = (frozen(sample) - encode(sample)(sample)).abs().max().item()
    if difference > CHECK_TOLERANCE:
        raise ValueError(f'{index} does not hold the documents as this model encodes them (weights differ by up to '
                         f'{difference:.3g}): index the corpus with this model, or leave out `documents`')
    return frozen


def heldout_scores(model, tokenizer, heldout: list[dict], docs: dict[str, str], config: DomainConfig,
                   extra: Sequence[str] = (), query_encoder=None, doc_encoder=None) -> dict[str, float]:
    """The student's ranking of held-out queries against the teacher's. Re-ranking each query's pool:
    ``heldout_ndcg`` (nDCG@10 against the teacher's ranking; the teacher's rank r < 10 has gain 10 - r) and
    ``heldout_mrr`` (reciprocal rank of the query's source document, 0 when it is not in the pool). First-stage, over
    every pool plus the ``extra`` documents: ``heldout_first_ndcg`` and ``heldout_first_mrr``, the same measures when
    the student retrieves from that whole sub-corpus, so that documents it wrongly ranks above the pool count.
    ``query_encoder`` / ``doc_encoder`` (``(texts, tokenizer, max_length) -> vectors``) replace ``model`` for queries
    (doc-only) / documents (query-only adaptation)."""
    was_training = model.training
    model.eval()
    unique = sorted({d for h in heldout for d in h['ranked']} | set(extra))
    col = {d: i for i, d in enumerate(unique)}
    queries = [h['query'] for h in heldout]
    try:
        with torch.inference_mode():
            texts = [docs[d] for d in unique]
            dvec = (_vectors(model, tokenizer, texts, config.doc_max_length, config.bf16) if doc_encoder is None
                    else doc_encoder(texts, tokenizer, config.doc_max_length).to_sparse())
            max_length = TrainConfig.query_max_length
            qvec = (_vectors(model, tokenizer, queries, max_length, config.bf16) if query_encoder is None
                    else query_encoder(queries, tokenizer, max_length).float())
            scores = torch.sparse.mm(dvec, qvec.to_dense().t()).t()
    finally:
        if was_training:
            model.train()
    ideal = sum((10 - r) / math.log2(r + 2) for r in range(10))
    out = {name: [] for name in SELECT_ON}
    for i, h in enumerate(heldout):
        gain = {d: max(0, 10 - r) for r, d in enumerate(h['ranked'])}
        for prefix, candidates in (('heldout', [col[d] for d in h['ranked']]), ('heldout_first', range(len(unique)))):
            candidates = list(candidates)
            ranked = [unique[candidates[j]] for j in torch.argsort(-scores[i, candidates], stable=True).tolist()]
            out[f'{prefix}_ndcg'].append(sum(gain.get(d, 0) / math.log2(r + 2) for r, d in enumerate(ranked[:10]))
                                         / ideal)
            out[f'{prefix}_mrr'].append(1. / (ranked.index(h['pos']) + 1) if h['pos'] in ranked else 0.)
    return {name: float(np.mean(values)) for name, values in out.items()}


@contextmanager
def frozen_parameters(module: torch.nn.Module | None):
    """``module``'s trainable parameters take no gradient inside the block and train again after it; ``None``:
    nothing."""
    params = [] if module is None else [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def domain_adapt(splade, corpus, output_dir, config: DomainConfig | None = None, cache_dir=None,
                 report: Callable[[torch.nn.Module], dict[str, float]] | None = None, verbose: bool = True,
                 documents=None):
    """Adapts ``splade`` (a :class:`~pyterrier_lsr.Splade`, trained in place) to ``corpus`` (``docno, text`` dicts)
    and returns ``(splade, log)``: the selected weights (the starting ones if the never-worse guard fired) and a dict
    with the settings, the held-out curve, the selected step, the guard's decision and timings (also written to
    ``output_dir/domain_adapt.json``; the selected model is saved to ``output_dir/model``).

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
    config = config or DomainConfig()
    if config.side == 'query' and type(splade) not in QUERY_SIDE_CLASSES:
        raise ValueError(f"side='query' adapts the query encoder of a "
                         f"{' or '.join(c.__name__ for c in QUERY_SIDE_CLASSES)}, not of a {type(splade).__name__} "
                         '(use DomainConfig.two_sided)')
    if documents is not None and config.side != 'query':
        raise ValueError("documents= serves query-side adaptation (side='query'); two-sided training re-encodes them")
    output_dir = Path(output_dir)
    cache = Path(cache_dir) if cache_dir is not None else output_dir / 'cache'
    cache.mkdir(parents=True, exist_ok=True)
    docs = {str(d['docno']): d['text'] for d in corpus if not is_blank(d.get('text'))}
    start_time = time.time()
    data, cache_hit = build_data(docs, cache, config, verbose)
    examples = [Example(e['query'], docs[e['pos']], [docs[d] for d in e['negatives']], e['teacher'])
                for e in data['examples']]
    model, tokenizer = splade.model, splade.tokenizer
    # an inference-free model (its `query_side` a static table) trains that table, with the document encoder or (side
    # 'query') alone; FLOPS regularizes documents only, as a static query side costs nothing to run
    query_side = getattr(splade, 'query_side', None)
    query_weights = None if query_side is None else StaticQueryWeights(tokenizer, init=query_side.weights)
    train_config = config.train_config()
    if query_weights is not None:
        train_config = replace(train_config, lambda_q=0.)
    frozen = None
    if config.side == 'query':
        if query_weights is None:
            model = copy.deepcopy(getattr(splade, 'query_splade', splade).model)
        needed = {d for e in data['examples'] for d in [e['pos']] + e['negatives']}
        needed |= {d for h in data['heldout'] for d in h['ranked']} | set(data['heldout_extra'])
        frozen = _frozen_documents(splade, docs, sorted(needed), documents, config.bf16, verbose)
        train_config = replace(train_config, lambda_d=0.)
    prep_seconds = time.time() - start_time  # data, teacher and (query side) the documents' encoding
    table_only = frozen is not None and query_weights is not None
    trained = torch.nn.ModuleDict({**({} if table_only else {'model': model}),
                                   **({'query': query_weights} if query_weights is not None else {})})

    def sync_query_side():
        if query_weights is not None:
            splade.query_side = query_weights.to_encoder(max_length=query_side.max_length)

    initial = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    curve, best = [], {'score': None, 'step': 0, 'state': None}
    step_counter = {'step': 0}

    def evaluate(m):
        scores = heldout_scores(m, tokenizer, data['heldout'], docs, config, data['heldout_extra'], query_weights,
                                frozen)
        if report is not None:
            sync_query_side()
            scores.update(report(m))
        step = step_counter['step']
        curve.append({'step': step, **scores})
        if best['score'] is None or scores[config.select_on] > best['score']:
            if step > 0:
                best['state'] = {k: v.detach().clone() for k, v in trained.state_dict().items()}
            best.update(score=scores[config.select_on], step=step)
        return scores

    start_score = evaluate(model)[config.select_on]
    params = {name: p for name, p in trained.named_parameters() if p.requires_grad}

    def loss_fn(batch, step):
        step_counter['step'] = step + 1  # run_loop evaluates after the optimizer step that makes `step + 1`
        loss, logs = batch_loss(model, tokenizer, batch, train_config, step, query_weights, frozen)
        if config.anchor:
            drift = L.l2_drift(params, initial)
            loss = loss + config.anchor * drift
            logs.update(loss=loss.item(), drift=drift.item())
        return loss, logs

    train_start = time.time()
    extra = [query_weights.weight] if query_weights is not None else []
    with frozen_parameters(model if table_only else None):
        train_log = run_loop(model, loss_fn, micro_batches(examples, config.batch_size, config.seed),
                             output_dir / 'train', train_config, tokenizer=tokenizer, evaluate=evaluate,
                             verbose=verbose, extra_parameters=extra)
    train_seconds = time.time() - train_start
    improved = best['step'] > 0 and best['score'] > start_score + config.min_gain
    trained.load_state_dict(best['state'] if improved else initial)
    if improved:
        sync_query_side()
        if frozen is not None and not table_only:
            splade = AsymmetricSplade(splade.model, tokenizer, model, getattr(splade, 'sides', type(splade)),
                                      device=splade.device, max_length=splade.max_length,
                                      batch_size=splade.batch_size, precision=splade.precision, name=splade.name)
    elif query_side is not None:
        splade.query_side = query_side  # exactly the starting table, not its float32 round trip
    model.eval()
    decision = (f"step {best['step']}: {config.select_on} {best['score']:.4f} > start {start_score:.4f}" if improved
                else f"never-worse guard: no step beat the starting model's {config.select_on} {start_score:.4f} "
                     f"by more than {config.min_gain}; returning the starting model")
    log = {'config': asdict(config), 'examples': len(examples), 'heldout_queries': len(data['heldout']),
           'cache_hit': cache_hit, 'curve': curve, 'start_score': start_score, 'best_score': best['score'],
           'selected_step': best['step'] if improved else 0, 'guard': not improved, 'decision': decision,
           'documents_from': None if documents is None else str(documents.path),
           'prep_seconds': round(prep_seconds, 1), 'train_seconds': round(train_seconds, 1),
           'train_log': train_log}
    splade.save_pretrained(str(output_dir / 'model'))
    _write_json(output_dir / 'domain_adapt.json', log)
    if verbose:
        print(decision)
    return splade, log


def logged_config(config: dict) -> dict:
    """A :class:`DomainConfig`'s fields as read back from a run's log (``domain_adapt.json``): runs logged before
    ``side`` existed trained both sides."""
    return {'side': 'both', **config}


def config_from_overrides(overrides: dict[str, str], base: DomainConfig | None = None) -> DomainConfig:
    """A :class:`DomainConfig` from ``name=value`` strings (CLI and scripts): numbers, booleans, ``losses`` as
    ``infonce:1+kl:1``, ``lr_multipliers`` as ``mlm.cls.:0.1`` and ``teachers`` as ``bm25+dense``."""
    base = base or DomainConfig()
    values = {}
    for name, text in overrides.items():
        current = getattr(base, name)
        if name in ('losses', 'lr_multipliers'):
            values[name] = {k: float(v) for k, v in (item.rsplit(':', 1) for item in text.split('+') if item)}
        elif name == 'teachers':
            values[name] = tuple(text.split('+'))
        elif isinstance(current, bool):
            values[name] = text.lower() in ('1', 'true', 'yes')
        else:
            values[name] = type(current)(text)
    return replace(base, **values)
