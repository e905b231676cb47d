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

    from pyterrier_lsr.train import loop
    from pyterrier_lsr.train import torchrun as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.distributed.init_process_group('gloo', rank=rank, world_size=world)
    saves = []
    save = loop.save_checkpoint
    loop.save_checkpoint = lambda *args: (saves.append(args[4]), save(*args))

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
    from pyterrier_lsr.train import torchrun as dist
    assert dist.local_slice([1, 2, 3]) == [1, 2, 3]
    monkeypatch.setattr(dist, 'world_size', lambda: 2)
    monkeypatch.setattr(dist, 'rank', lambda: 1)
    assert dist.local_slice([1, 2, 3, 4]) == [3, 4]
    with pytest.raises(ValueError, match='divide evenly over 2'):
        dist.local_slice([1, 2, 3])


# -- Ray encoding ---------------------------------------------------------------------------------------------------
SHARD = 32  # 100 documents: shards of 32, 32, 32 and 4


@pytest.fixture(scope='module')
def ray_session():
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _shard_times(folder):
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.glob('part-*'))}


def test_ray_index_equals_single_process_index_and_resumes(ray_session, splade, vaswani_docs, tmp_path):
    import pandas as pd

    from pyterrier_lsr import LsrIndex
    from pyterrier_lsr import scaleout as distributed
    docs = vaswani_docs[:100]
    single = LsrIndex(tmp_path / 'single', splade, shard_size=SHARD, verbose=False).index(docs)
    built = distributed.index(docs, splade, tmp_path / 'ray', num_workers=2, shard_size=SHARD,
                              keep_vectors=True, verbose=False)
    assert built.meta['model']['kind'] == 'splade' and built.num_docs() == 100
    assert list(built.vectors()) == list(single.vectors())  # same docnos, same order, same float weights
    assert built.document_frequencies() == single.document_frequencies()
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['electron density ionosphere', 'transistor amplifier noise']})
    pd.testing.assert_frame_equal(built.retriever(num_results=10)(topics), single.retriever(num_results=10)(topics))

    # resume: only the missing shard and the truncated one are encoded again
    vectors = tmp_path / 'ray.vectors'
    (vectors / 'part-00001.parquet').unlink()
    with open(vectors / 'part-00002.parquet', 'ab') as f:
        f.write(b'x')
    before = _shard_times(vectors)
    store = distributed.encode(docs, splade, vectors, num_workers=2, shard_size=SHARD,
                               verbose=False)
    after = _shard_times(vectors)
    assert {name for name in after if after[name] != before.get(name)} == {
        'part-00001.parquet', 'part-00001.json', 'part-00002.parquet', 'part-00002.json'}
    assert list(store) == list(single.vectors())
    with pytest.raises(ValueError, match='shard_size differ'):
        distributed.encode(docs, splade, vectors, num_workers=2, shard_size=2 * SHARD)


def test_corpus_files_in_process(splade, vaswani_docs, tmp_path):
    import pandas as pd

    from pyterrier_lsr import scaleout as distributed
    docs = vaswani_docs[:40]
    expected = list(distributed.encode(docs, splade, tmp_path / 'list', num_workers=0, shard_size=16, verbose=False))
    pd.DataFrame(docs[:20]).to_parquet(tmp_path / 'a.parquet')
    (tmp_path / 'b.jsonl').write_text(''.join(json.dumps(d) + '\n' for d in docs[20:]))
    store = distributed.encode([tmp_path / 'a.parquet', tmp_path / 'b.jsonl'], splade, tmp_path / 'files',
                               num_workers=0, shard_size=16, verbose=False)
    assert list(store) == expected and [s['num_docs'] for s in store.manifest['shards']] == [16, 16, 8]


def test_failing_worker_is_a_clear_error(ray_session, splade, vaswani_docs, tmp_path):
    from pyterrier_lsr import scaleout as distributed
    with pytest.raises(RuntimeError, match=r'shard [01] ') as info:
        distributed.encode(vaswani_docs[:10], splade, tmp_path / 'v', num_workers=1, shard_size=8,
                           model_kwargs={'max_length': 0}, max_retries=0, verbose=False)
    assert 'max_length' in str(info.value) and 're-run to resume' in str(info.value), info.value


def _kill_first_worker_during(encode, folder):
    """Runs ``encode()`` in a thread, SIGKILLs the worker that wrote the first shard, and returns encode's result or
    exception."""
    import signal
    import threading
    import time
    result = {}
    thread = threading.Thread(target=lambda: result.update(value=_outcome(encode)))
    thread.start()
    while not (folder / 'part-00000.json').exists() and thread.is_alive():
        time.sleep(0.02)
    os.kill(json.loads((folder / 'part-00000.json').read_text())['pid'], signal.SIGKILL)
    thread.join(timeout=300)
    return result['value']


def _outcome(fn):
    try:
        return fn()
    except Exception as ex:  # noqa: BLE001  (handed to the test thread)
        return ex


def test_killed_worker_is_restarted_then_a_clear_error(ray_session, splade, vaswani_docs, tmp_path):
    from pyterrier_lsr import scaleout as distributed
    # 60 shards: the kill lands while most are still to do (with 24, a loaded CI machine once killed the worker only
    # after it had written every shard, so no successor wrote one)
    docs = vaswani_docs[:240]
    settings = dict(shard_size=4, verbose=False)
    expected = list(distributed.encode(docs, splade, tmp_path / 'ref', num_workers=0, **settings))
    folder = tmp_path / 'retried'
    store = _kill_first_worker_during(
        lambda: distributed.encode(docs, splade, folder, num_workers=1, max_retries=1, in_flight=1, **settings), folder)
    assert list(store) == expected
    pids = [json.loads(p.read_text())['pid'] for p in sorted(folder.glob('part-*.json'))]
    assert len(set(pids)) > 1 and pids[-1] != pids[0], pids  # the killed worker's successor finished the job
    folder = tmp_path / 'failed'
    error = _kill_first_worker_during(
        lambda: distributed.encode(docs, splade, folder, num_workers=1, max_retries=0, in_flight=1, **settings), folder)
    assert isinstance(error, RuntimeError) and 'died' in str(error) and 're-run to resume' in str(error), error


@pytest.fixture(scope='module')
def splade_int8():
    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.names import resolve_model
    return Splade.from_pretrained(resolve_model('splade-tiny'), batch_size=8, precision='int8')


def test_ray_workers_encode_in_the_given_models_precision(ray_session, vaswani_docs, tmp_path):
    from pyterrier_lsr import Splade
    from pyterrier_lsr import scaleout as distributed
    # a model whose backbone is most of its work, so that int8 runs it in int8: splade-tiny's int8 vectors are its
    # fp32 ones up to the last bits, which could not tell a worker's precision apart
    module, tokenizer = make_tiny(dropout=0.)
    fp32_model, int8_model = (Splade(module, tokenizer, precision=p, batch_size=8, max_length=128)
                              for p in ('fp32', 'int8'))
    assert int8_model.model.int8_backbone
    docs = vaswani_docs[:16]
    settings = dict(shard_size=8, verbose=False)
    local = list(distributed.encode(docs, int8_model, tmp_path / 'local', num_workers=0, **settings))
    fp32 = list(distributed.encode(docs, fp32_model, tmp_path / 'fp32', num_workers=0, **settings))
    assert sum(a != b for a, b in zip(local, fp32)) > len(docs) // 2
    assert list(distributed.encode(docs, int8_model, tmp_path / 'ray', num_workers=1, **settings)) == local
    assert json.loads((tmp_path / 'ray' / 'encode.json').read_text())['precision'] == 'int8'


def test_a_folder_keeps_one_precision(splade, splade_int8, vaswani_docs, tmp_path):
    from pyterrier_lsr import scaleout as distributed
    docs = vaswani_docs[:8]
    distributed.encode(docs, splade, tmp_path / 'v', num_workers=0, shard_size=4, verbose=False)
    with pytest.raises(ValueError, match='precision differ'):
        distributed.encode(docs, splade_int8, tmp_path / 'v', num_workers=0, shard_size=4)


def test_a_longer_corpus_reuses_the_shards_of_its_prefix(splade, vaswani_docs, tmp_path):
    """Nested samples (the first n documents, then more) encode only the new shards; the last shard of the shorter
    corpus, cut short, is encoded again with its new documents."""
    from pyterrier_lsr import scaleout as distributed
    folder, settings = tmp_path / 'v', dict(num_workers=0, shard_size=4, verbose=False)
    assert len(distributed.encode(vaswani_docs[:10], splade, folder, **settings)) == 10
    before = _shard_times(folder)
    store = distributed.encode(vaswani_docs[:20], splade, folder, **settings)
    after = _shard_times(folder)
    assert {name for name in after if after[name] != before.get(name)} == {
        f'part-0000{i}.{ext}' for i in (2, 3, 4) for ext in ('parquet', 'json')}
    assert list(store) == list(distributed.encode(vaswani_docs[:20], splade, tmp_path / 'fresh', **settings))


def test_a_shorter_corpus_keeps_the_longer_ones_shards_for_its_next_encoding(splade, vaswani_docs, tmp_path):
    """Encoding a prefix into a folder that holds a longer corpus names only the prefix's shards, and removes none:
    the longer corpus encoded again afterwards encodes nothing."""
    from pyterrier_lsr import scaleout as distributed
    folder, settings = tmp_path / 'v', dict(num_workers=0, shard_size=4, verbose=False)
    full = list(distributed.encode(vaswani_docs[:12], splade, folder, **settings))
    before = _shard_times(folder)
    prefix = distributed.encode(vaswani_docs[:4], splade, folder, **settings)
    assert list(prefix) == full[:4] and len(prefix) == 4
    assert list(distributed.encode(vaswani_docs[:12], splade, folder, **settings)) == full
    assert _shard_times(folder) == before
