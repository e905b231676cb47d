from .data import (Example, add_teacher_scores, from_dataframe, from_irds_docpairs, from_qrels, pseudo_query,
                   self_supervised)
from .domain import DomainConfig, domain_adapt, heldout_scores, keyword_query
from .losses import flops, flops_weight, infonce, kl_distillation, l2_drift, margin_mse
from .loop import TrainConfig, batch_loss, experiment_evaluator, latest_checkpoint, run_loop, train
from .mlm import mask_tokens, train_mlm
from .teachers import DenseScorer, RetrieverScorer, ZScoreFusion
