"""Failures at run time end in an error that names the step, argument or file and what to do, never in a damaged
artifact, a deleted user folder or a killed process."""
import errno
import json
import math
import os
import random

import numpy as np
import pytest
import torch

from pyterrier_lsr import Splade
from pyterrier_lsr.core import storage
from pyterrier_lsr.train import Example, TrainConfig, train
from pyterrier_lsr.train.checkpoints import checkpoints
from pyterrier_lsr.train.loop import TrainingDiverged


def examples(n=16):
    rng = random.Random(0)
    words = 'nuclear reactor physics cat dog electron density ionosphere transistor amplifier radio wave'.split()
    return [Example(' '.join(rng.sample(words, 2)), ' '.join(rng.sample(words, 5)), [' '.join(rng.sample(words, 5))])
            for _ in range(n)]


def all_finite(model) -> bool:
    return all(torch.isfinite(t).all() for t in model.state_dict().values() if t.is_floating_point())


# --- a diverging run stops, naming the step, and saves nothing non-finite -----------------------------------------

def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tiny, tmp_path):
    model, tokenizer = tiny
    good = TrainConfig(steps=2, batch_size=8, lr=1e-3, warmup_steps=0, save_every=1)
    train(model, tokenizer, examples(), tmp_path, good, verbose=False)
    saved = (tmp_path / 'checkpoint-2' / 'model.safetensors').read_bytes()
    diverged = r'training diverged at step \d+: .*checkpoint-\d+, is kept.*lower lr \(now 1e\+30\)'
    with pytest.raises(TrainingDiverged, match=diverged):
        train(model, tokenizer, examples(), tmp_path, TrainConfig(steps=40, batch_size=8, lr=1e30, warmup_steps=0,
                                                                  save_every=1), resume='force', verbose=False)
    for checkpoint in checkpoints(tmp_path):  # whatever was saved before the divergence is finite
        assert all_finite(Splade.from_pretrained(str(checkpoint)).model), checkpoint.name
    assert (tmp_path / 'checkpoint-2' / 'model.safetensors').read_bytes() == saved


def test_non_finite_weights_are_never_saved(tiny, tmp_path):
    """A finite loss and gradient do not keep the weights finite: the check before each save catches them."""
    model, tokenizer = tiny
    with torch.no_grad():
        model.mlm.cls.predictions.bias.fill_(math.inf)  # the loss goes through relu(logits): the bias inf shows up
    with pytest.raises(TrainingDiverged, match='at step 1: .*(loss|gradient norm|weight tensors)'):
        train(model, tokenizer, examples(), tmp_path, TrainConfig(steps=1, batch_size=8, warmup_steps=0),
              verbose=False)
    assert not checkpoints(tmp_path)


def test_weights_made_non_finite_by_the_update_are_refused_before_the_save(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    step = torch.optim.AdamW.step

    def poisoning_step(self, *args, **kwargs):  # an update that overflows (a huge lr times weight decay)
        out = step(self, *args, **kwargs)
        with torch.no_grad():
            model.mlm.cls.predictions.transform.dense.weight[0, 0] = math.inf
        return out
    monkeypatch.setattr(torch.optim.AdamW, 'step', poisoning_step)
    with pytest.raises(TrainingDiverged, match=r'at step 1: 1 weight tensors .*cls\.predictions\.transform\.dense'):
        train(model, tokenizer, examples(), tmp_path, TrainConfig(steps=1, batch_size=8, warmup_steps=0),
              verbose=False)
    assert not checkpoints(tmp_path)


def test_cli_reports_a_diverging_run_in_one_line(tiny, tmp_path, capsys):
    from pyterrier_lsr.cli import main

    model, tokenizer = tiny
    model.save_pretrained(str(tmp_path / 'model'))
    tokenizer.save_pretrained(str(tmp_path / 'model'))
    rows = [{'query': ex.query, 'positive': ex.positive, 'negative': ex.negatives[0]} for ex in examples()]
    (tmp_path / 'train.jsonl').write_text('\n'.join(json.dumps(r) for r in rows))
    with pytest.raises(SystemExit) as exit_info:
        main(['train', '--model', str(tmp_path / 'model'), '--data', str(tmp_path / 'train.jsonl'), '--output-dir',
              str(tmp_path / 'out'), '--steps', '40', '--batch-size', '8', '--lr', '1e30', '--warmup-steps', '0'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err  # after the progress bars, one line and no traceback
    assert err.endswith('\n') and 'Traceback' not in err, err
    assert err.splitlines()[-1].startswith('pyterrier-lsr train: error: training diverged at step'), err
    assert not (tmp_path / 'out' / 'model').exists() and not checkpoints(tmp_path / 'out')


# --- the artifact guard reads a folder's own marker, never one a link points to -----------------------------------

def test_a_symlinked_marker_does_not_make_a_user_folder_replaceable(tmp_path):
    from pyterrier_lsr import SpladeIndexer

    docs = [{'docno': 'd1', 'toks': {'nuclear': 1.5}}, {'docno': 'd2', 'toks': {'reactor': 2.0}}]
    SpladeIndexer(tmp_path / 'real.lsr', verbose=False).index(docs)
    user = tmp_path / 'user'
    user.mkdir()
    (user / 'thesis.tex').write_text('years of work')
    (user / storage.MARKER).symlink_to(tmp_path / 'real.lsr' / storage.MARKER)
    assert storage.read_marker(user) is None and storage.artifact_type(user) is None
    with pytest.raises(FileExistsError, match='refusing to replace it'):
        SpladeIndexer(user, overwrite=True, verbose=False).index(docs)
    assert (user / 'thesis.tex').read_text() == 'years of work'
    assert storage.artifact_type(tmp_path / 'real.lsr') == 'sparse_index.lsr'  # its own marker counts


def test_a_marker_that_is_not_a_regular_file_is_no_marker(tmp_path):
    os.mkfifo(tmp_path / storage.MARKER)  # reading it would block forever
    assert storage.read_marker(tmp_path) is None


# --- a full disk is an OSError, never a SIGBUS, and the old cache survives -----------------------------------------

CACHE_TEXTS = ['nuclear reactor physics', 'the cat sat on the mat', 'radio wave noise', 'dielectric liquids']


@pytest.fixture(scope='module')
def minilm():
    from pyterrier_lsr.kinds.latent_terms import LatentTerms
    return LatentTerms('all-MiniLM-L6-v2', mode='multi', batch_size=2)


def test_an_interrupted_embedding_pass_leaves_no_sparse_file(minilm, tmp_path, monkeypatch):
    """Rows written through a memmap into unallocated blocks are what faults (SIGBUS) on a full disk."""
    calls = []
    forward = type(minilm.features).forward

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(type(minilm.features), 'forward', interrupted)
    with pytest.raises(KeyboardInterrupt):
        minilm.embed(CACHE_TEXTS, path=tmp_path / 'partial.npy')
    stat = os.stat(tmp_path / 'partial.npy')
    assert stat.st_size > 4096 and stat.st_blocks * 512 >= stat.st_size  # every block allocated


@pytest.mark.parametrize('fallocate_error', [errno.ENOSPC, errno.EOPNOTSUPP])
def test_a_full_disk_is_an_os_error_and_the_old_cache_survives(minilm, tmp_path, monkeypatch, fallocate_error):
    from pyterrier_lsr.kinds.latent_terms import cached_embeddings

    cache = tmp_path / 'cache'
    old_vectors, old_offsets = cached_embeddings(minilm, CACHE_TEXTS[:2], cache, verbose=False)
    old_vectors = np.array(old_vectors)
    before = sorted(p.name for p in cache.iterdir())

    def no_fallocate(fd, offset, length):
        raise OSError(fallocate_error, os.strerror(fallocate_error))
    monkeypatch.setattr(os, 'posix_fallocate', no_fallocate)
    if fallocate_error == errno.ENOSPC:
        with pytest.raises(OSError, match=r'No space left on device: writing .*\.partial\.npy; free some space') as e:
            cached_embeddings(minilm, CACHE_TEXTS, cache, verbose=False)
        assert e.value.errno == errno.ENOSPC
        assert sorted(p.name for p in cache.iterdir()) == before  # no partial file, no progress file
    else:  # a file system without fallocate: the rows are written as zeros first, then filled
        vectors, offsets = cached_embeddings(minilm, CACHE_TEXTS, cache, verbose=False)
        np.testing.assert_allclose(vectors, minilm.embed(CACHE_TEXTS)[0], rtol=1e-5, atol=1e-6)
    again, offsets = cached_embeddings(minilm, CACHE_TEXTS[:2], cache, verbose=False)
    np.testing.assert_array_equal(again, old_vectors)
    np.testing.assert_array_equal(offsets, old_offsets)


def test_array_file_writes_zeros_where_the_file_system_has_no_fallocate(tmp_path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, 'not supported')
    monkeypatch.setattr(os, 'posix_fallocate', unsupported)
    array = storage.array_file(tmp_path / 'a.npy', (1000, 64))
    array[3] = 1.
    array.flush()
    del array
    stat = os.stat(tmp_path / 'a.npy')
    assert stat.st_blocks * 512 >= stat.st_size
    loaded = np.load(tmp_path / 'a.npy')
    assert loaded.shape == (1000, 64) and loaded.sum() == 64 and loaded[3].sum() == 64
