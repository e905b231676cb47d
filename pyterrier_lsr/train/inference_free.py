"""Doc-only (inference-free) training: documents through the SPLADE model, queries through a learnable static table."""
from dataclasses import replace

from ..kinds.inference_free import InferenceFreeSplade
from ..stages.query import StaticQueryWeights
from .config import TrainConfig
from .loop import train

__all__ = ['train_inference_free']


def train_inference_free(splade, examples, output_dir, config=None, query_weights=None,
                         learn_query_weights: bool = True, **train_kwargs) -> InferenceFreeSplade:
    """Doc-only training with the bundled loop: documents through ``splade``'s model, queries through a static table.

    ``query_weights`` (a :class:`~.query.StaticQueryWeights`) defaults to ones; pass one initialised from idf
    for the usual IDF query side. With ``learn_query_weights=False`` it stays fixed. FLOPS applies to documents only
    (``lambda_q`` is forced to 0). Returns the trained model with its query side, ready to save.
    """
    config = replace(config or TrainConfig(), lambda_q=0.)
    query_weights = query_weights or StaticQueryWeights(splade.tokenizer)
    query_weights.weight.requires_grad_(learn_query_weights)
    train(splade.model, splade.tokenizer, examples, output_dir, config, query_encoder=query_weights,
          extra_parameters=[query_weights.weight] if learn_query_weights else [], **train_kwargs)
    return InferenceFreeSplade(splade.model, splade.tokenizer, query_weights.to_encoder(max_length=splade.max_length),
                               device=splade.device, max_length=splade.max_length, batch_size=splade.batch_size,
                               precision=splade.precision)
