"""MLM-head diagnosis and rescaling (seed: scale mismatch in the MLM head), and new heads for encoders without one.

A SPLADE weight is ``log(1 + relu(logit))``: when a backbone's MLM head has a large norm, logits are inflated,
every text activates thousands of terms and dot products explode.  ``rescale_head(model, k)`` divides the logits
by ``k`` (paper: 16); the factor is a setting of the model (``config.json`` -> ``lsr.head_scale``), not an edit of
the weights, because the decoder is usually tied to the input embeddings.
"""
from collections.abc import Sequence

import torch
from torch import nn

from ..core.checks import check_float
from ..core.model_files import load_hf_model
from .pooling import max_pooled_logits
from .splade import SpladeModel

# Our "auto" reference: the standard deviation of per-token MLM logits of a BERT-style head. The offline
# SPLADE-tiny (a BERT MLM head after SPLADE training) measures 2.95 on Vaswani documents.
REFERENCE_LOGIT_STD = 3.0
# Percentiles of the max-pooled logits that calibrate_activation reports (the published APC probe used the 60th).
PERCENTILES = (50, 60, 90, 99)


@torch.no_grad()
def _pooled_logits(model: SpladeModel, tokenizer, texts: Sequence[str], max_length: int = 128):
    inputs = tokenizer(list(texts), truncation=True, max_length=max_length, padding=True, return_tensors='pt')
    device = next(model.parameters()).device
    ids, mask = inputs['input_ids'].to(device), inputs['attention_mask'].to(device)
    decoder = model.mlm.get_output_embeddings()
    was_training = model.training
    model.eval()
    hidden = model.decoder_inputs(ids, mask)
    model.train(was_training)
    token_logits = (hidden[mask.bool()] @ decoder.weight.T + (0 if decoder.bias is None else decoder.bias))
    pooled = max_pooled_logits(hidden, mask, decoder.weight, decoder.bias)
    pooled[:, model.special_token_ids] = float('-inf')
    return hidden[mask.bool()], token_logits / model.settings['head_scale'], pooled / model.settings['head_scale']


def head_report(model: SpladeModel, tokenizer, texts: Sequence[str], max_length: int = 128) -> dict[str, float]:
    """Norms of the MLM head and statistics of its logits and SPLADE activations on ``texts``.

    Returns decoder row norms, bias statistics, the norm of the decoder's input, per-token logit statistics,
    statistics of the max-pooled logits, the expected number of non-zero terms per text, the current
    ``head_scale`` and the factor ``rescale_head(model, "auto")`` would apply on top of it.
    """
    if not len(texts):
        raise ValueError('head_report needs at least one text')
    decoder = model.mlm.get_output_embeddings()
    hidden, token_logits, pooled = _pooled_logits(model, tokenizer, texts, max_length)
    finite = pooled[torch.isfinite(pooled)]
    row_norms = decoder.weight.norm(dim=1)
    bias = decoder.bias if decoder.bias is not None else torch.zeros(1)
    logit_std = token_logits.std().item()
    return {
        'decoder_row_norm_mean': row_norms.mean().item(),
        'decoder_row_norm_max': row_norms.max().item(),
        'bias_mean': bias.mean().item(), 'bias_std': bias.std().item(), 'bias_max': bias.max().item(),
        'decoder_input_norm_mean': hidden.norm(dim=-1).mean().item(),
        'token_logit_mean': token_logits.mean().item(), 'token_logit_std': logit_std,
        'token_logit_max': token_logits.max().item(),
        'pooled_logit_mean': finite.mean().item(), 'pooled_logit_max': finite.max().item(),
        'activation_mean': torch.log1p(torch.relu(finite)).mean().item(),
        'nonzeros_per_text': (pooled > 0).sum(dim=1).float().mean().item(),
        'head_scale': float(model.settings['head_scale']),
        'auto_factor': logit_std / REFERENCE_LOGIT_STD,
    }


def rescale_head(model: SpladeModel, k: float | str, tokenizer=None, texts: Sequence[str] = ()) -> float:
    """Divides the model's MLM logits by ``k`` (on top of any earlier factor) and returns ``k``.

    ``k="auto"`` (needs ``tokenizer`` and sample ``texts``): ``k = std(logits) / 3.0``, the standard deviation of the
    per-token logits (already divided by any earlier factor) over the texts, relative to a BERT-style head's.
    The factor is stored in the model config (``lsr.head_scale``) and survives save/load.
    """
    if k == 'auto':
        if tokenizer is None or not len(texts):
            raise ValueError('rescale_head(model, "auto") needs tokenizer= and sample texts=')
        k = head_report(model, tokenizer, texts)['auto_factor']
    k = check_float('k', k, 0, exclusive_minimum=True)
    model.settings['head_scale'] = float(model.settings['head_scale']) * k
    return k


def splade_from_encoder(folder: str, special_token_ids=(), **kwargs) -> SpladeModel:
    """A SPLADE model from an encoder checkpoint without an MLM head (e.g. all-MiniLM-L6-v2).

    Initialization (our choice): the decoder is tied to the input embeddings (transformers' default for BERT-like
    masked LMs); the head's transform starts as the identity (dense weight I, bias 0; LayerNorm 1/0), so a logit is the
    similarity of the contextual state with the term's own input embedding; the output bias starts at 0.
    :meth:`pyterrier_lsr.Splade.from_encoder` gives the same model with its tokenizer (and resolves names: ``folder``
    here is a local folder).
    """
    from transformers import AutoModelForMaskedLM

    # the head is missing on purpose and initialised below
    mlm, _ = load_hf_model(AutoModelForMaskedLM, str(folder), 'the encoder', **kwargs)
    mlm.tie_weights()
    with torch.no_grad():
        decoder = mlm.get_output_embeddings()
        if decoder.bias is not None:
            decoder.bias.zero_()
        transform = head_transform(mlm)
        if transform is not None:
            nn.init.eye_(transform.dense.weight)
            nn.init.zeros_(transform.dense.bias)
            nn.init.ones_(transform.LayerNorm.weight)
            nn.init.zeros_(transform.LayerNorm.bias)
    return SpladeModel(mlm, special_token_ids)


def head_transform(mlm: nn.Module):
    """The MLM head's dense + LayerNorm transform (BERT-style heads), or None."""
    for module in mlm.modules():
        if hasattr(module, 'dense') and hasattr(module, 'LayerNorm') and 'Transform' in type(module).__name__:
            return module
    return None


@torch.no_grad()
def calibrate_activation(model: SpladeModel, tokenizer, texts: Sequence[str], target_active: float = 0.005,
                         max_length: int = 128) -> dict[str, float]:
    """Activation-potential calibration (APC): shifts the output bias so that a ``target_active`` fraction of
    (text, term) pairs starts active, neither all dead (no gradient through the relu) nor dense.

    Our formula: with ``p`` the ``1 - target_active`` quantile of the max-pooled logits over the sample texts and
    non-special terms, subtract ``p`` (times the head scale) from every bias entry, so exactly that fraction of pooled
    logits is above 0. Returns the active fraction and the 50/60/90/99th percentiles of the pooled logits before and
    after, and the shift.
    """
    if not 0 < target_active < 1:
        raise ValueError(f'target_active must be in (0, 1), got {target_active}')
    decoder = model.mlm.get_output_embeddings()
    if decoder.bias is None:
        raise ValueError('the MLM head has no output bias to calibrate')
    keep = torch.ones(model.vocab_size, dtype=torch.bool)
    keep[model.special_token_ids.cpu()] = False
    pooled = _pooled_logits(model, tokenizer, texts, max_length)[2][:, keep].flatten().float().cpu()
    shift = torch.kthvalue(pooled, max(1, int(round(len(pooled) * (1 - target_active))))).values.item()
    decoder.bias -= shift * float(model.settings['head_scale'])
    stats = {'active_before': (pooled > 0).float().mean().item(),
             'active_after': (pooled - shift > 0).float().mean().item(),
             'bias_shift': -shift}
    # torch.quantile's input limit
    sample = pooled[torch.randperm(len(pooled), generator=torch.Generator().manual_seed(0))[:1_000_000]]
    quantiles = torch.quantile(sample, torch.tensor(PERCENTILES, dtype=torch.float) / 100)
    for percentile, value in zip(PERCENTILES, quantiles.tolist()):
        stats[f'pooled_p{percentile}_before'] = value
        stats[f'pooled_p{percentile}_after'] = value - shift
    return stats
