"""Masked-LM adaptation: a short MLM run on a corpus, e.g. between a vocabulary transfer and SPLADE training so that
the backbone learns to use its new embeddings. Runs on the bundled loop (:func:`~pyterrier_lsr.train.loop.run_loop`):
same optimizer, schedule, logs, checkpoints and exact resume as :func:`~pyterrier_lsr.train.train`."""
from collections.abc import Sequence

import torch

from .config import TrainConfig
from .loop import micro_batches, run_loop, train_autocast


def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: Sequence[int], mask_id: int,
                vocab_size: int, mask_rate: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's corruption: ``mask_rate`` of the non-special, non-padding tokens are predicted; of those 80 % become
    ``mask_id``, 10 % a random token, 10 % stay. Returns ``(corrupted ids, labels)`` with -100 where not predicted.
    Randomness comes from torch's global RNG (so the loop's resume replays it)."""
    candidates = attention_mask.bool() & ~torch.isin(input_ids, torch.tensor(list(special_ids), dtype=input_ids.dtype))
    chosen = candidates & (torch.rand(input_ids.shape) < mask_rate)
    labels = input_ids.masked_fill(~chosen, -100)
    roll = torch.rand(input_ids.shape)
    ids = input_ids.masked_fill(chosen & (roll < 0.8), mask_id)
    random_ids = chosen & (roll >= 0.8) & (roll < 0.9)
    ids[random_ids] = torch.randint(vocab_size, (int(random_ids.sum()),), dtype=ids.dtype)
    return ids, labels


def train_mlm(mlm: torch.nn.Module, tokenizer, texts: Sequence[str], output_dir, config: TrainConfig = None,
              mask_rate: float = 0.3, max_length: int = 128, resume: bool = False, verbose: bool = True) -> list[dict]:
    """Trains ``mlm`` (an HF ``*ForMaskedLM`` or a :class:`~.models.SpladeModel` around one) in place with the
    masked-LM loss on ``texts`` (shuffled each epoch) and returns the metrics log (``loss``, ``accuracy`` of the
    masked predictions). Of ``config`` only the optimization fields are read (steps, batch_size, grad_accum, lr,
    weight_decay, warmup_steps, max_grad_norm, precision, seed, log_every, save_every); checkpoints hold the masked LM.
    """
    mlm = getattr(mlm, 'mlm', mlm)
    config = config or TrainConfig()
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if len(texts) < config.batch_size:
        raise ValueError(f'need at least batch_size={config.batch_size} non-empty texts, got {len(texts)}')
    if not 0 < mask_rate < 1:
        raise ValueError(f'mask_rate must be in (0, 1), got {mask_rate}')
    if tokenizer.mask_token_id is None:
        raise ValueError('the tokenizer has no mask token')
    device = next(mlm.parameters()).device
    vocab_size = mlm.get_input_embeddings().weight.shape[0]

    def loss_fn(batch: list[str], step: int) -> tuple[torch.Tensor, dict[str, float]]:
        inputs = tokenizer(batch, truncation=True, max_length=max_length, padding=True, return_tensors='pt')
        ids, labels = mask_tokens(inputs['input_ids'], inputs['attention_mask'], tokenizer.all_special_ids,
                                  tokenizer.mask_token_id, vocab_size, mask_rate)
        with train_autocast(device, config.precision):
            logits = mlm(input_ids=ids.to(device), attention_mask=inputs['attention_mask'].to(device)).logits.float()
        labels = labels.to(device)
        predicted = labels != -100
        if not predicted.any():  # nothing masked in this batch (very short texts): a zero loss keeps the graph
            return logits.sum() * 0., {'loss': 0., 'accuracy': 0.}
        loss = torch.nn.functional.cross_entropy(logits[predicted], labels[predicted])
        accuracy = (logits[predicted].argmax(-1) == labels[predicted]).float().mean().item()
        return loss, {'loss': loss.item(), 'accuracy': accuracy}

    return run_loop(mlm, loss_fn, micro_batches(texts, config.batch_size, config.seed), output_dir, config,
                    tokenizer=tokenizer, resume=resume, verbose=verbose, desc='MLM')
