"""Teacher scorers for distillation: PyTerrier transformers scoring ``qid, query, docno, text`` frames.

Combine them with PyTerrier's operators, e.g. ``DenseScorer(...) + 0.02 * RetrieverScorer(bm25)``.
"""

from typing import Sequence

import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_alpha as pta
import torch

from ..encoding import autocast, length_sorted_batches, resolve_device
from ..offline import resolve_model


class DenseScorer(pt.Transformer):
    """Cosine similarity of mean-pooled embeddings of a bi-encoder (e.g. all-MiniLM-L6-v2; HF name or folder)."""

    def __init__(self, name_or_path: str, batch_size: int = 64, max_length: int = 256, device=None, precision='fp32'):
        from transformers import AutoModel, AutoTokenizer

        self.device = resolve_device(device)
        folder = resolve_model(str(name_or_path))  # offline short names ('all-MiniLM-L6-v2') work too
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).to(self.device).eval()
        self.batch_size, self.max_length, self.precision = batch_size, max_length, precision

    @torch.inference_mode()
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm mean-pooled embeddings, one row per text (zeros for blank texts)."""
        result = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with autocast(self.device, self.precision):
            for batch in length_sorted_batches(self.tokenizer, texts, self.batch_size, self.max_length, self.device):
                hidden = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
                mask = batch.attention_mask[..., None].float()
                pooled = (hidden.float() * mask).sum(1) / mask.sum(1).clamp(min=1)
                result[batch.positions] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
        return result

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.result_frame(inp, extra_columns=['query', 'text'])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        queries = inp['query'].fillna('').astype(str).unique().tolist()
        texts = inp['text'].fillna('').astype(str).unique().tolist()
        q = dict(zip(queries, self.embed(queries)))
        d = dict(zip(texts, self.embed(texts)))
        scores = [
            float(q[a] @ d[b]) for a, b in zip(inp['query'].fillna('').astype(str), inp['text'].fillna('').astype(str))
        ]
        return pt.model.add_ranks(inp.assign(score=scores))


class RetrieverScorer(pt.Transformer):
    """Scores given candidates with a retriever's scores (e.g. PISA BM25 over the corpus): each query is retrieved to
    ``depth`` and candidates are matched by ``text``; candidates outside the top ``depth`` score 0."""

    def __init__(self, retriever: pt.Transformer, docs_text: dict, depth: int = 1000):
        self.retriever = retriever
        self.docs_text = docs_text  # docno -> text of the retriever's corpus
        self.depth = depth

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.result_frame(inp, extra_columns=['query', 'text'])
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        queries = inp[['qid', 'query']].drop_duplicates('qid')
        res = (self.retriever % self.depth)(queries)
        found = {
            (qid, self.docs_text.get(docno)): score for qid, docno, score in zip(res['qid'], res['docno'], res['score'])
        }
        scores = [found.get((qid, text), 0.0) for qid, text in zip(inp['qid'], inp['text'])]
        return pt.model.add_ranks(inp.assign(score=scores))


class ZScoreFusion(pt.Transformer):
    """Weighted sum of scorers' scores, each z-normalized within every query's candidates.

    Scorers on different scales (BM25 vs cosine) become comparable; the weights also set the teacher's sharpness
    for KL distillation (a margin of 1 z-unit times the weight).
    """

    def __init__(self, scorers: Sequence[pt.Transformer], weights: Sequence[float] = None):
        self.scorers = list(scorers)
        self.weights = list(weights) if weights is not None else [1.0] * len(self.scorers)
        if len(self.weights) != len(self.scorers):
            raise ValueError('one weight per scorer')

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pta.validate.result_frame(inp, extra_columns=['query', 'text'])
        total = np.zeros(len(inp))
        for scorer, weight in zip(self.scorers, self.weights):
            res = scorer(inp.drop(columns=['score', 'rank'], errors='ignore'))
            scores = inp[['qid', 'docno']].merge(res[['qid', 'docno', 'score']], on=['qid', 'docno'], how='left')[
                'score'
            ]
            grouped = scores.groupby(inp['qid'].values)
            std = grouped.transform('std').fillna(0.0).replace(0.0, 1.0)
            total += weight * ((scores - grouped.transform('mean')) / std).fillna(0.0).to_numpy()
        return pt.model.add_ranks(inp.assign(score=total))
