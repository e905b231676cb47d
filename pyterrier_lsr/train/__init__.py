"""Training: the loop, losses, data, teachers, evaluation and the recipes built on them (top layer)."""
from .checkpoints import latest_checkpoint
from .config import TrainConfig
from .data import (
           Example,
           add_teacher_scores,
           from_dataframe,
           from_irds_docpairs,
           from_qrels,
           pseudo_query,
           self_supervised,
)
from .domain import DomainAdaptation, DomainConfig, FrozenDocuments, domain_adapt, heldout_scores, keyword_query
from .evaluate import experiment_evaluator
from .inference_free import train_inference_free
from .loop import TrainingDiverged, batch_loss, run_loop, train
from .losses import flops, flops_weight, infonce, kl_distillation, l2_drift, margin_mse
from .mlm import mask_tokens, train_mlm
from .sae import build_latent_terms, train_latent_sae, train_token_sae
from .teachers import DenseScorer, RetrieverScorer, ZScoreFusion

__all__ = ['Example', 'add_teacher_scores', 'from_dataframe', 'from_irds_docpairs', 'from_qrels', 'pseudo_query',
           'self_supervised', 'DomainAdaptation', 'DomainConfig', 'FrozenDocuments', 'domain_adapt', 'heldout_scores',
           'keyword_query',
           'experiment_evaluator', 'train_inference_free', 'flops', 'flops_weight', 'infonce', 'kl_distillation',
           'l2_drift', 'margin_mse', 'TrainConfig', 'TrainingDiverged', 'batch_loss', 'latest_checkpoint', 'run_loop',
           'train',
           'mask_tokens', 'train_mlm', 'build_latent_terms', 'train_latent_sae', 'train_token_sae', 'DenseScorer',
           'RetrieverScorer', 'ZScoreFusion']
