from .data import Example, add_teacher_scores, from_dataframe, from_irds_docpairs, pseudo_query, self_supervised
from .losses import flops, flops_weight, infonce, kl_distillation, margin_mse
from .loop import TrainConfig, batch_loss, experiment_evaluator, latest_checkpoint, run_loop, train
from .mlm import mask_tokens, train_mlm
from .teachers import DenseScorer, RetrieverScorer, ZScoreFusion
