from .data import Example, add_teacher_scores, from_dataframe, from_irds_docpairs, pseudo_query, self_supervised
from .losses import flops, flops_weight, infonce, kl_distillation, margin_mse
from .loop import TrainConfig, batch_loss, experiment_evaluator, latest_checkpoint, train
from .teachers import DenseScorer, RetrieverScorer, ZScoreFusion
