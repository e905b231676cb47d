import copy
import json
import os
import shutil
import socket

import pytest
import torch
from conftest import make_tiny
from safetensors.torch import load_file, save_file
from test_train import examples

from pyterrier_lsr.train import TrainConfig, batch_loss, train

# One global batch of 8 with teacher scores, in-batch negatives and FLOPS past its warm-up: every cross-rank term.
LOSS_CONFIG = TrainConfig(steps=10, batch_size=8, losses={'infonce': 1., 'margin_mse': 0.5}, lambda_q=0.1,
                          lambda_d=0.1, flops_warmup_steps=2)
TRAIN_CONFIG = TrainConfig(steps=4, batch_size=8, grad_accum=2, lr=1e-3, warmup_steps=1, save_every=2,
                           flops_warmup_steps=2, log_every=1)


def _grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _ddp_worker(rank, world, folder, port):
    """One torchrun-like process: the loss/gradients of one global batch, a training run with gradient accumulation
    and checkpoints, and a resume from its first checkpoint."""
    import torch.distributed

    from pyterrier_lsr.train import distributed as dist
    from pyterrier_lsr.train import loop
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world)
    saves = []
    save = loop._save
    loop._save = lambda *args: (saves.append(args[4]), save(*args))

    model, tokenizer = make_tiny(dropout=0.)
    loss, logs = batch_loss(model, tokenizer, examples(8, teacher=True), LOSS_CONFIG, step=5)
    loss.backward()
    dist.average_gradients(list(model.parameters()))
    save_file(_grads(model), f'{folder}/grads-{rank}.safetensors')
    (folder / f'logs-{rank}.json').write_text(json.dumps(logs))

    model, tokenizer = make_tiny(dropout=0.)
    fresh = copy.deepcopy(model)
    train(model, tokenizer, examples(40), folder / 'run', TRAIN_CONFIG, verbose=False)
    save_file(_weights(model), f'{folder}/trained-{rank}.safetensors')
    if dist.is_main():
        shutil.rmtree(folder / 'run' / 'checkpoint-4')
    dist.barrier()
    train(fresh, tokenizer, examples(40), folder / 'run', TRAIN_CONFIG, resume=True, verbose=False)
    save_file(_weights(fresh), f'{folder}/resumed-{rank}.safetensors')
    (folder / f'saves-{rank}.json').write_text(json.dumps(saves))
    torch.distributed.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _assert_close(actual: dict, expected: dict):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_two_gloo_processes_match_one_process(tmp_path):
    torch.multiprocessing.spawn(_ddp_worker, args=(2, tmp_path, _free_port()), nprocs=2)

    model, tokenizer = make_tiny(dropout=0.)
    loss, logs = batch_loss(model, tokenizer, examples(8, teacher=True), LOSS_CONFIG, step=5)
    loss.backward()
    for rank in (0, 1):  # same loss, FLOPS over the global batch, and gradients, on both ranks
        ranked = json.loads((tmp_path / f'logs-{rank}.json').read_text())
        assert ranked.keys() == logs.keys()
        assert ranked == pytest.approx(logs, rel=1e-5, abs=1e-7)
        _assert_close(load_file(tmp_path / f'grads-{rank}.safetensors'), _grads(model))
    assert logs['flops_d'] > 0 and logs['infonce'] > 0

    model, tokenizer = make_tiny(dropout=0.)
    train(model, tokenizer, examples(40), tmp_path / 'single', TRAIN_CONFIG, verbose=False)
    trained = _weights(model)
    for rank in (0, 1):
        _assert_close(load_file(tmp_path / f'trained-{rank}.safetensors'), trained)
        _assert_close(load_file(tmp_path / f'resumed-{rank}.safetensors'), trained)
    # rank 0 alone wrote checkpoints (2 and 4, then 4 again on resume) and metrics
    assert json.loads((tmp_path / 'saves-0.json').read_text()) == [2, 4, 4]
    assert json.loads((tmp_path / 'saves-1.json').read_text()) == []
    ddp_log = json.loads((tmp_path / 'run' / 'metrics.json').read_text())
    single_log = json.loads((tmp_path / 'single' / 'metrics.json').read_text())
    assert [row['step'] for row in ddp_log] == [1, 2, 3, 4]
    assert [row['loss'] for row in ddp_log] == pytest.approx([row['loss'] for row in single_log], rel=1e-4)


def test_local_slice_needs_an_even_split(monkeypatch):
    from pyterrier_lsr.train import distributed as dist
    assert dist.local_slice([1, 2, 3]) == [1, 2, 3]
    monkeypatch.setattr(dist, 'world_size', lambda: 2)
    monkeypatch.setattr(dist, 'rank', lambda: 1)
    assert dist.local_slice([1, 2, 3, 4]) == [3, 4]
    with pytest.raises(ValueError, match='divide evenly over 2'):
        dist.local_slice([1, 2, 3])
