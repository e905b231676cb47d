"""The teacher of domain adaptation: BM25 (PISA), a dense bi-encoder (cosine) and Latent Terms (BM25 over a TopK SAE's
latents of a dense model's token embeddings, :data:`~pyterrier_lsr.train.sae.LATENT_TERMS`) over the whole corpus,
each cached under the run's cache folder (the BM25 index, the documents' embeddings, the Latent Terms index, per
corpus), and the fusion of their scores (the sum of per-candidate-list z-scores, as
:class:`~pyterrier_lsr.train.ZScoreFusion` computes them)."""
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ...core.collection import corpus_key
from ...core.storage import write_file
from ...index.bm25 import BM25, bm25_index


def cache_key(value) -> str:
    """A short digest of a JSON-able value: the part of a cache file's name that identifies its inputs."""
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def zscore_sum(components: list[dict[str, float]], teachers: Sequence[str]) -> np.ndarray:
    """Sum over teachers of the z-scores within this candidate list (as :class:`ZScoreFusion` computes them)."""
    total = np.zeros(len(components))
    for t in teachers:
        s = np.array([c[t] for c in components])
        std = s.std(ddof=1) if len(s) > 1 else 0.
        total += (s - s.mean()) / (std if std > 0 else 1.)
    return total


class Teacher:
    """BM25 and dense scores of pseudo-queries against the whole corpus ``docs``; ``teachers`` and ``candidates``
    as in :class:`~pyterrier_lsr.train.DomainConfig`."""

    def __init__(self, docs: dict[str, str], cache: Path, config, verbose: bool = False):
        self.docs, self.config, self.verbose = docs, config, verbose
        self.docnos = list(docs)
        self.row = {d: i for i, d in enumerate(self.docnos)}
        self.cache, self.corpus_key = Path(cache), corpus_key(docs)
        self._index = self._dense = self._doc_emb = self._latent = None

    def bm25(self, depth: int) -> BM25:
        if self._index is None:
            corpus = ({'docno': d, 'text': t} for d, t in self.docs.items())
            self._index = bm25_index(self.cache / f'bm25-{self.corpus_key}.pisa', corpus, self.verbose)
        return BM25(self._index, num_results=depth, verbose=self.verbose)

    def dense(self):
        if self._dense is None:
            from ...core.names import resolve_model
            from ..teachers import DenseScorer
            self._dense = DenseScorer(resolve_model(self.config.dense_teacher))
            path = self.cache / f'dense-{cache_key([self.config.dense_teacher, self.corpus_key])}.npz'
            if path.exists():
                self._doc_emb = np.load(path)['embeddings']
            else:
                self._doc_emb = self._dense.embed([self.docs[d] for d in self.docnos], verbose=self.verbose,
                                                  desc='dense teacher: embedding the corpus').astype(np.float32)

                def save(tmp):
                    with open(tmp, 'wb') as f:
                        np.savez(f, embeddings=self._doc_emb)
                write_file(path, save)
        return self._dense

    def latent(self, depth: int):
        """Latent Terms over ``config.latent_teacher`` retrieving ``depth`` documents, its index built once per corpus
        and base (the embeddings cached beside it)."""
        if self._latent is None:
            from ...index import LsrIndex
            from ..sae import LATENT_TERMS, build_latent_terms
            path = self.cache / f'latent-{cache_key([self.config.latent_teacher, LATENT_TERMS, self.corpus_key])}.lsr'
            self._latent = LsrIndex(path)
            if not self._latent.built():
                corpus = [{'docno': d, 'text': t} for d, t in self.docs.items()]
                self._latent = build_latent_terms(corpus, path, self.config.latent_teacher,
                                                  cache_dir=self.cache / 'latent-embeddings', verbose=self.verbose,
                                                  **LATENT_TERMS)[1]
        return self._latent.retriever(num_results=depth)

    def pools(self, queries: list[dict], depth: int) -> tuple[list[dict[str, dict[str, float]]], dict]:
        """Per query: ``{docno: {'bm25': s, 'dense': s, 'latent': s}}`` (the configured teachers) over the union of
        each teacher's top ``depth`` and the source document (a candidate outside BM25's or Latent Terms' top ``depth``
        gets its score 0 there), and BM25's ``{qid: {docno: score}}``."""
        frame = pd.DataFrame({'qid': [q['qid'] for q in queries], 'query': [q['query'] for q in queries]})
        pools = [{q['pos']: {}} for q in queries]
        bm25 = {}
        if 'bm25' in self.config.teachers or self.config.candidates == 'bm25':
            res = self.bm25(depth)(frame)
            for qid, docno, score in zip(res['qid'], res['docno'], res['score']):
                bm25.setdefault(qid, {})[docno] = float(score)
            for pool, q in zip(pools, queries):
                pool.update({d: {} for d in bm25.get(q['qid'], {})})
        latent = {}  # before the dense teacher, which scores every candidate of the pool
        if 'latent' in self.config.teachers:
            res = self.latent(depth)(frame)
            for qid, docno, score in zip(res['qid'], res['docno'], res['score']):
                latent.setdefault(qid, {})[docno] = float(score)
            for pool, q in zip(pools, queries):
                pool.update({d: {} for d in latent.get(q['qid'], {})})
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
                if 'latent' in self.config.teachers:
                    scores['latent'] = latent.get(q['qid'], {}).get(d, 0.)
        return pools, bm25
