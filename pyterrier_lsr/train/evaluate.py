"""Evaluation callbacks for the training loop: index a corpus with the model being trained and run ``pt.Experiment``."""

import tempfile
from typing import Callable, Dict, Optional, Sequence

import pyterrier as pt
import torch
from pyterrier.measures import nDCG

from ..encoders import Splade
from ..index import SpladeIndexer

__all__ = ['experiment_evaluator']


def experiment_evaluator(
    tokenizer,
    corpus: Sequence[dict],
    topics,
    qrels,
    measures=None,
    batch_size: int = 64,
    precision: str = 'fp32',
    query_side: Optional[Callable[[], pt.Transformer]] = None,
) -> Callable[[torch.nn.Module], Dict[str, float]]:
    """An ``evaluate`` callback: indexes ``corpus`` with the current model in a temporary folder and runs
    ``pt.Experiment`` on ``topics``/``qrels`` (default measure nDCG@10). Queries go through the model, or through
    ``query_side()`` (e.g. the current static table of doc-only training)."""
    measures = measures or [nDCG @ 10]

    def evaluate(model):
        splade = Splade(
            model, tokenizer, device=next(model.parameters()).device, batch_size=batch_size, precision=precision
        )
        with tempfile.TemporaryDirectory() as tmp:
            index = SpladeIndexer(f'{tmp}/eval.lsr', splade, verbose=False, save_model=False).index(corpus)
            retriever = index.retriever() if query_side is None else query_side() >> index.toks_retriever()
            res = pt.Experiment([retriever], topics, qrels, measures, names=['model'])
        return {k: float(v) for k, v in res.drop(columns='name').iloc[0].items()}

    return evaluate
