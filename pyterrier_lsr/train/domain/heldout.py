"""Held-out evaluation of domain adaptation: the student ranks held-out *pseudo-queries* (from documents no training
query comes from; never test topics) and is scored with ``ir_measures`` against the teacher's ranking (graded gains
for nDCG@10) and the query's source document (reciprocal rank)."""
from collections.abc import Sequence

import ir_measures
import torch
from ir_measures import RR, nDCG

from ..config import TrainConfig
from .config import SELECT_ON
from .vectors import sparse_vectors

GAIN_DEPTH = 10  # the teacher's rank r < 10 has gain 10 - r


def rank_measures(rankings: Sequence[Sequence[str]], ranked_by_teacher: Sequence[Sequence[str]],
                  sources: Sequence[str]) -> dict[str, float]:
    """Mean ``ndcg`` (nDCG@10, the teacher's rank r < 10 having gain 10 - r) and ``mrr`` (reciprocal rank of the
    source document, 0 when it is not ranked) of the student's ``rankings`` (docnos, best first), one per query."""
    qrels, graded, run = [], [], []
    for i, (ranking, teacher, source) in enumerate(zip(rankings, ranked_by_teacher, sources)):
        qid = str(i)
        graded += [ir_measures.Qrel(qid, d, GAIN_DEPTH - r) for r, d in enumerate(teacher[:GAIN_DEPTH])]
        qrels.append(ir_measures.Qrel(qid, source, 1))
        # scores that keep the student's order exactly (ties broken as the ranking broke them, not by docno)
        run += [ir_measures.ScoredDoc(qid, d, float(len(ranking) - r)) for r, d in enumerate(ranking)]
    ndcg = ir_measures.calc_aggregate([nDCG @ GAIN_DEPTH], graded, run)[nDCG @ GAIN_DEPTH]
    mrr = ir_measures.calc_aggregate([RR], qrels, run)[RR]
    return {'ndcg': float(ndcg), 'mrr': float(mrr)}


def heldout_scores(model, tokenizer, heldout: list[dict], docs: dict[str, str], config,
                   extra: Sequence[str] = (), query_encoder=None, doc_encoder=None) -> dict[str, float]:
    """The student's ranking of held-out pseudo-queries against the teacher's (:func:`rank_measures`). Re-ranking
    each query's pool: ``heldout_ndcg`` and ``heldout_mrr``. First-stage, over every pool plus the ``extra``
    documents: ``heldout_first_ndcg`` and ``heldout_first_mrr``, the same measures when the student retrieves from
    that whole sub-corpus, so that documents it wrongly ranks above the pool count. ``query_encoder`` /
    ``doc_encoder`` (``(texts, tokenizer, max_length) -> vectors``) replace ``model`` for queries (doc-only) /
    documents (query-only adaptation)."""
    was_training = model.training
    model.eval()
    unique = sorted({d for h in heldout for d in h['ranked']} | set(extra))
    col = {d: i for i, d in enumerate(unique)}
    queries = [h['query'] for h in heldout]
    try:
        with torch.inference_mode():
            texts = [docs[d] for d in unique]
            dvec = (sparse_vectors(model, tokenizer, texts, config.max_length, config.precision) if doc_encoder is None
                    else doc_encoder(texts, tokenizer, config.max_length).to_sparse())
            max_length = TrainConfig.query_max_length
            qvec = (sparse_vectors(model, tokenizer, queries, max_length, config.precision, dvec.shape[1])
                    if query_encoder is None else query_encoder(queries, tokenizer, max_length).float())
            scores = torch.sparse.mm(dvec, qvec.to_dense().t()).t()
    finally:
        if was_training:
            model.train()
    out = {}
    for prefix, candidates in (('heldout', [[col[d] for d in h['ranked']] for h in heldout]),
                               ('heldout_first', [list(range(len(unique)))] * len(heldout))):
        rankings = [[unique[c[j]] for j in torch.argsort(-scores[i, c], stable=True).tolist()]
                    for i, c in enumerate(candidates)]
        measures = rank_measures(rankings, [h['ranked'] for h in heldout], [h['pos'] for h in heldout])
        out.update({f'{prefix}_{name}': value for name, value in measures.items()})
    return {name: out[name] for name in SELECT_ON}

