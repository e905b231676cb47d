"""Teacher scorers for distillation: PyTerrier transformers scoring ``qid, query, docno, text`` frames.

Combine them with PyTerrier's operators, e.g. ``DenseScorer(...) + 0.02 * RetrieverScorer(bm25)``.
"""

import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import pyterrier as pt
import torch

from ..core.checks import check_float, check_int, check_max_length, check_result_frame
from ..core.encoding import as_texts, autocast, length_sorted_batches, resolve_device, resolve_precision
from ..core.model_files import load_hf_model, load_tokenizer
from ..core.names import resolve_model


class DenseScorer(pt.Transformer):
    """Cosine similarity of mean-pooled embeddings of a bi-encoder (e.g. all-MiniLM-L6-v2; HF name or folder); texts
    truncated at ``max_length`` tokens (default 256, or the model's own limit when smaller)."""

    def __init__(self, name_or_path: str, batch_size: int = 64, max_length: int | None = None, device=None,
                 precision='fp32'):
        from transformers import AutoModel

        self.device = resolve_device(device)
        self.batch_size = check_int('batch_size', batch_size, 1)
        self.precision = resolve_precision(precision, self.device)
        folder = resolve_model(str(name_or_path))  # offline short names ('all-MiniLM-L6-v2') work too
        self.tokenizer = load_tokenizer(folder)
        self.max_length = check_max_length('max_length', max_length, self.tokenizer, 256)
        self.model = load_hf_model(AutoModel, folder, 'the teacher model')[0].to(self.device).eval()

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], verbose: bool = False, desc: str = 'embedding') -> np.ndarray:
        """Unit-norm mean-pooled embeddings, one row per text (zeros for blank texts); ``verbose``: a progress bar
        (``desc``) counting texts."""
        result = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with autocast(self.device, self.precision):
            for batch in length_sorted_batches(self.tokenizer, texts, self.batch_size, self.max_length, self.device,
                                               verbose, desc):
                hidden = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
                mask = batch.attention_mask[..., None].float()
                pooled = (hidden.float() * mask).sum(1) / mask.sum(1).clamp(min=1)
                result[batch.positions] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
        return result

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query', 'text'], 'the frame DenseScorer re-ranks')
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        queries, texts = as_texts(inp['query'], 'column "query"'), as_texts(inp['text'], 'column "text"')
        q, d = self._embedded(queries), self._embedded(texts)
        return pt.model.add_ranks(inp.assign(score=[float(q[a] @ d[b]) for a, b in zip(queries, texts)]))

    def _embedded(self, texts: list) -> dict:
        """Each distinct text embedded once."""
        unique = list(dict.fromkeys(texts))
        return dict(zip(unique, self.embed(unique)))


class RetrieverScorer(pt.Transformer):
    """Scores given candidates with a retriever's scores (e.g. PISA BM25 over the corpus): each query is retrieved to
    ``depth`` and candidates are matched by ``text``; candidates outside the top ``depth`` score 0."""

    def __init__(self, retriever: pt.Transformer, docs_text: dict, depth: int = 1000):
        if not isinstance(docs_text, Mapping):
            raise TypeError(f'docs_text must be a {{docno: text}} mapping, got {type(docs_text).__name__}')
        self.retriever = retriever
        self.docs_text = docs_text  # docno -> text of the retriever's corpus
        self.depth = check_int('depth', depth, 1)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query', 'text'], 'the frame RetrieverScorer re-ranks')
        if not len(inp):
            return inp.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype=int))
        texts = as_texts(inp['text'], 'column "text"')
        # one text per qid (checked above); control characters are no words (and PISA refuses a NUL), and a query of
        # none matches nothing: no retriever is asked it
        queries = inp[['qid']].assign(query=[''.join(' ' if unicodedata.category(c) == 'Cc' else c for c in query)
                                             for query in as_texts(inp['query'], 'column "query"')])
        queries = queries.drop_duplicates('qid')[lambda q: q['query'].str.strip().astype(bool)]
        res = (self.retriever % self.depth)(queries)
        found = {
            (qid, self.docs_text.get(docno)): score for qid, docno, score in zip(res['qid'], res['docno'], res['score'])
        }
        scores = [found.get((qid, text), 0.0) for qid, text in zip(inp['qid'], texts)]
        return pt.model.add_ranks(inp.assign(score=scores))


class ZScoreFusion(pt.Transformer):
    """Weighted sum of scorers' scores, each z-normalized within every query's candidates.

    Scorers on different scales (BM25 vs cosine) become comparable; the weights also set the teacher's sharpness
    for KL distillation (a margin of 1 z-unit times the weight).
    """

    def __init__(self, scorers: Sequence[pt.Transformer], weights: Sequence[float] = None):
        self.scorers = list(scorers)
        if not self.scorers:
            raise ValueError('scorers must hold at least one scorer')
        weights = list(weights) if weights is not None else [1.0] * len(self.scorers)
        if len(weights) != len(self.scorers):
            raise ValueError(f'weights must give one weight per scorer: {len(weights)} for {len(self.scorers)}')
        self.weights = [check_float(f'weights[{i}]', w) for i, w in enumerate(weights)]

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        # a docno twice for a qid would multiply rows in the merge below, and scores would go to the wrong rows
        check_result_frame(inp, ['query', 'text'], 'the frame ZScoreFusion re-ranks')
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
