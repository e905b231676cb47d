"""Evaluation callbacks for the training loop: index a corpus with the model being trained and run ``pt.Experiment``."""

import tempfile
from collections.abc import Callable, Sequence

import pyterrier as pt
import torch
from pyterrier.measures import nDCG

from ..core.quiet import quiet_native
from ..index import SpladeIndexer
from ..kinds.splade import Splade

__all__ = ['experiment_evaluator']


def experiment_evaluator(
    tokenizer,
    corpus: Sequence[dict],
    topics,
    qrels,
    measures=None,
    batch_size: int = 64,
    precision: str = 'fp32',
    query_side: Callable[[], pt.Transformer] | None = None,
    doc_model: torch.nn.Module | None = None,
    index=None,
) -> Callable[[torch.nn.Module], dict[str, float]]:
    """An ``evaluate`` callback: indexes ``corpus`` with the current model in a temporary folder and runs
    ``pt.Experiment`` on ``topics``/``qrels`` (default measure nDCG@10). Queries go through the model, or through
    ``query_side()`` (e.g. the current static table of doc-only training). With ``doc_model`` (query-only
    adaptation) the corpus is indexed once, by ``doc_model``, and only the queries go through the current model;
    ``index`` (an :class:`~pyterrier_lsr.LsrIndex` of ``corpus``) serves the same purpose without indexing."""
    measures = measures or [nDCG @ 10]
    fixed = {} if index is None else {'index': index}

    def splade(model):
        return Splade(
            model, tokenizer, device=next(model.parameters()).device, batch_size=batch_size, precision=precision
        )

    def run(model, index):
        retriever = splade(model).query_encoder() if query_side is None else query_side()
        res = pt.Experiment([retriever >> index.toks_retriever()], topics, qrels, measures, names=['model'])
        return {k: float(v) for k, v in res.drop(columns='name').iloc[0].items()}

    def build(folder, model):
        with quiet_native():  # the engine's native build log would break into the training's progress bar
            return SpladeIndexer(f'{folder}/eval.lsr', splade(model), verbose=False, save_model=False).index(corpus)

    def evaluate(model):
        if doc_model is not None or index is not None:
            if 'index' not in fixed:
                fixed['tmp'] = tempfile.TemporaryDirectory()
                fixed['index'] = build(fixed['tmp'].name, doc_model)
            return run(model, fixed['index'])
        with tempfile.TemporaryDirectory() as tmp:
            return run(model, build(tmp, model))

    return evaluate
