"""Failures at run time end in an error that names the step, argument or file and what to do, never in a damaged
artifact, a deleted user folder or a killed process."""
import errno
import json
import math
import os
import random
import re

import numpy as np
import pytest
import torch

from pyterrier_lsr import Splade
from pyterrier_lsr.core import arrays, storage
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
    array = arrays.array_file(tmp_path / 'a.npy', (1000, 64))
    array[3] = 1.
    array.flush()
    del array
    stat = os.stat(tmp_path / 'a.npy')
    assert stat.st_blocks * 512 >= stat.st_size
    loaded = np.load(tmp_path / 'a.npy')
    assert loaded.shape == (1000, 64) and loaded.sum() == 64 and loaded[3].sum() == 64


# --- every load error names the file and what to do -------------------------------------------------------------

def _saved(tiny, folder):
    Splade(*tiny).save_pretrained(folder)
    return folder


def _truncate(path, keep=100):
    path.write_bytes(path.read_bytes()[:keep])


def _edit_config(folder, change, name='config.json'):
    config = json.loads((folder / name).read_text())
    change(config)
    (folder / name).write_text(json.dumps(config))


def test_damaged_weights_name_the_file(tiny, tmp_path):
    from pyterrier_lsr import load_model
    from pyterrier_lsr.core.model_files import ModelLoadError

    folder = _saved(tiny, tmp_path / 'm')
    _truncate(folder / 'model.safetensors')
    with pytest.raises(ModelLoadError, match=f'{folder} does not load .*SafetensorError.*save the model again'):
        load_model(folder)


def test_damaged_sae_and_projection_files_name_the_file(tmp_path):
    from pyterrier_lsr.core.model_files import ModelLoadError, read_tensors
    from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder

    SparseAutoencoder(SAEConfig(d_in=8, n_latents=16, k=2)).save_pretrained(tmp_path / 'sae')
    _truncate(tmp_path / 'sae' / 'sae.safetensors', 60)
    with pytest.raises(ModelLoadError, match=r'sae\.safetensors does not load \(SafetensorError'):
        SparseAutoencoder.from_pretrained(tmp_path / 'sae')
    from safetensors.torch import save_file
    save_file({'other': torch.zeros(2)}, str(tmp_path / 'projection.safetensors'))
    with pytest.raises(ModelLoadError, match=r"projection\.safetensors lacks \['weight'\]"):
        read_tensors(tmp_path / 'projection.safetensors', ['weight'])


def test_weights_of_another_shape_are_named_with_both_shapes(tiny, tmp_path):
    from pyterrier_lsr import load_model
    from pyterrier_lsr.core.model_files import ModelLoadError
    from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder

    folder = _saved(tiny, tmp_path / 'm')
    _edit_config(folder, lambda c: c.update(hidden_size=64, intermediate_size=128))
    with pytest.raises(ModelLoadError, match=r'weights have another shape .*\(32,\) saved, \(64,\) expected'):
        load_model(folder)
    SparseAutoencoder(SAEConfig(d_in=8, n_latents=16, k=2)).save_pretrained(tmp_path / 'sae')
    _edit_config(tmp_path / 'sae', lambda c: c.update(n_latents=32), 'sae_config.json')
    with pytest.raises(ModelLoadError, match=r'sae\.safetensors does not fit .*\(16, 8\) saved, \(32, 8\) expected'):
        SparseAutoencoder.from_pretrained(tmp_path / 'sae')


@pytest.mark.parametrize('kind, lacks', [('sae-splade', "['sae', 'alpha']"), ('latent-terms', "['dense', 'mode'")])
def test_a_kind_edited_by_hand_names_the_settings_it_lacks(tiny, tmp_path, kind, lacks):
    from pyterrier_lsr import load_model
    from pyterrier_lsr.core.model_files import ModelLoadError

    folder = _saved(tiny, tmp_path / 'm')
    _edit_config(folder, lambda c: c['lsr'].update(kind=kind))
    with pytest.raises(ModelLoadError, match=re.escape(f"config.json: lsr.kind says '{kind}' but lsr lacks {lacks}")):
        load_model(folder)


def test_an_empty_folder_is_not_a_model_folder(tmp_path):
    from pyterrier_lsr import load_model
    from pyterrier_lsr.core.model_files import ModelLoadError

    with pytest.raises(ModelLoadError, match=f'{tmp_path} is empty: not a model folder'):
        load_model(tmp_path)


# --- unclear crashes: a clear error naming the argument or file, or the right behaviour -----------------------------

def test_a_dense_retriever_over_no_documents_retrieves_nothing(tmp_path):
    import pandas as pd

    from pyterrier_lsr.systems.dense import dense_retriever

    retriever = dense_retriever([], cache_dir=tmp_path / 'cache')
    out = retriever(pd.DataFrame({'qid': ['1'], 'query': ['nuclear physics']}))
    assert len(out) == 0 and {'qid', 'query', 'docno', 'score', 'rank'} <= set(out.columns)


def test_a_report_config_that_is_not_utf8_is_named(tmp_path):
    from pyterrier_lsr.report import ConfigError, load_config

    (tmp_path / 'report.yaml').write_bytes('dataset: irds:vaswani\ntitle: caf\xe9\n'.encode('latin-1'))
    with pytest.raises(ConfigError, match=r'report\.yaml is not UTF-8 text \(byte \d+'):
        load_config(tmp_path / 'report.yaml')


@pytest.mark.parametrize('lines, match', [
    (['{"query": "q", "positive": "p", "negative": "n"}', '{"query": "q", "positive": '], 'line 2: not valid JSON'),
    (['{"query": "q", "positive": "p", "negative": "n"}', '["q", "p"]'], 'line 2: a JSON array, not an object'),
    (['{"query": "q", "positive": "p", "negative": "n"}', '', '{"query": "q", "positive": " ", "negative": "n"}'],
     'line 3: training example has an empty or missing positive'),
    (['{"query": "q", "positive": "p"}'], r"lacks columns \['negative \(or negatives\)'\]"),
])
def test_a_malformed_jsonl_names_file_and_line(tiny, tmp_path, capsys, lines, match):
    from pyterrier_lsr.cli import main

    (tmp_path / 'train.jsonl').write_text('\n'.join(lines) + '\n')
    folder = _saved(tiny, tmp_path / 'm')
    with pytest.raises(SystemExit):
        main(['train', '--model', str(folder), '--data', str(tmp_path / 'train.jsonl'), '--output-dir',
              str(tmp_path / 'out'), '--steps', '1', '--batch-size', '1'])
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f'pyterrier-lsr train: error: --data: {tmp_path / "train.jsonl"}') and \
        re.search(match, last), last


def test_lone_surrogates_encode_as_the_replacement_character(tiny):
    from pyterrier_lsr.core.encoding import as_text

    assert as_text('a\ud800b') == 'a\ufffdb' and as_text('\ud83d\ude00') == '\U0001f600'
    splade = Splade(*tiny)
    assert splade.encode(['nuclear \udcff physics']) == splade.encode(['nuclear \ufffd physics'])
    example = Example('nuclear \ud800', 'reactor physics', ['cat'])
    assert example.query == 'nuclear \ufffd'


def test_a_static_module_with_a_2d_weight_is_named(tiny, tmp_path):
    from safetensors.torch import save_file

    from pyterrier_lsr import StaticQueryEncoder

    module = tmp_path / 'q' / '0_SparseStaticEmbedding'
    module.mkdir(parents=True)
    tiny[1].save_pretrained(str(module))
    save_file({'weight': torch.ones(len(tiny[1]), 4)}, str(module / 'model.safetensors'))
    with pytest.raises(ValueError, match=r'SparseStaticEmbedding/model\.safetensors: .*1-D tensor\), got shape '
                                         r'\(\d+, 4\)'):
        StaticQueryEncoder.from_pretrained(str(tmp_path / 'q'))


@pytest.mark.parametrize('sides', [['splade'], 'asymmetric', 'nope'])
def test_asymmetric_sides_must_name_one_kind(tiny, tmp_path, sides):
    import copy

    from pyterrier_lsr import load_model
    from pyterrier_lsr.core.model_files import ModelLoadError
    from pyterrier_lsr.kinds.asymmetric import AsymmetricSplade

    model, tokenizer = tiny
    AsymmetricSplade(model, tokenizer, copy.deepcopy(model)).save_pretrained(tmp_path / 'a')
    _edit_config(tmp_path / 'a', lambda c: c['lsr'].update(sides=sides))
    with pytest.raises(ModelLoadError, match=r'config\.json: lsr\.sides must name the kind of both models'):
        load_model(tmp_path / 'a')


def test_tampered_domain_adaptation_examples_are_named(tmp_path):
    from pyterrier_lsr.train.domain.cache import check_cached_data

    docs = {'d1': 'one', 'd2': 'two'}
    settings = {'teachers': ['bm25'], 'steps': 2}
    good = {'settings': settings, 'heldout_extra': ['d2'],
            'examples': [{'query': 'q', 'pos': 'd1', 'negatives': ['d2'], 'teacher': [1.0, 0.0]}],
            'heldout': [{'query': 'q', 'pos': 'd1', 'ranked': ['d1', 'd2']}]}
    assert check_cached_data(good, settings, docs, tmp_path / 'c.json') is good
    for change, where in [(lambda d: d['examples'][0].update(pos='d9'), r'examples\[0\]'),
                          (lambda d: d['examples'][0].update(teacher=[1.0]), r'examples\[0\]'),
                          (lambda d: d['examples'][0].update(teacher=[1.0, float('nan')]), r'examples\[0\]'),
                          (lambda d: d['examples'][0].update(pos=['d1']), r'examples\[0\]'),
                          (lambda d: d['heldout'][0].update(ranked='d1'), r'heldout\[0\]'),
                          (lambda d: d.update(heldout_extra=[3]), 'heldout_extra'),
                          (lambda d: d.pop('heldout'), 'keys or settings')]:
        data = json.loads(json.dumps(good))
        change(data)
        with pytest.raises(ValueError, match=f'{tmp_path / "c.json"} is damaged .*{where}.*remove the file'):
            check_cached_data(data, settings, docs, tmp_path / 'c.json')


def test_a_run_on_tampered_cached_examples_stops_naming_the_file(tmp_path):
    from pyterrier_lsr.train import DomainConfig
    from pyterrier_lsr.train.domain.cache import build_data

    rng = random.Random(0)
    words = 'nuclear reactor physics electron density ionosphere transistor amplifier radio wave noise'.split()
    docs = {f'd{i}': '. '.join(' '.join(rng.sample(words, 6)) for _ in range(3)) + '.' for i in range(40)}
    config = DomainConfig.two_sided(steps=2, batch_size=4, heldout=5, heldout_pool=5, pool=10, teachers=('bm25',),
                                    precision='fp32')
    data, hit = build_data(docs, tmp_path, config, verbose=False)
    assert not hit and build_data(docs, tmp_path, config, verbose=False)[1]
    path, = tmp_path.glob('domain-data-*.json')
    data['examples'][1]['negatives'] = ['no-such-doc']
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=re.escape(f'{path} is damaged (examples[1])')):
        build_data(docs, tmp_path, config, verbose=False)


def test_data_that_run_out_end_the_run_warned_and_saved(tiny, tmp_path):
    model, tokenizer = tiny
    few = iter(examples()[:3])  # one batch of 2, then not enough for a second
    with pytest.warns(UserWarning, match='ran out after 1 of 5 steps'):
        train(model, tokenizer, few, tmp_path, TrainConfig(steps=5, batch_size=2, warmup_steps=0), verbose=False)
    assert [c.name for c in checkpoints(tmp_path)] == ['checkpoint-1']
    assert not model.training


def test_a_diverged_run_leaves_the_model_in_eval_mode(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(TrainingDiverged):
        train(model, tokenizer, examples(), tmp_path, TrainConfig(steps=40, batch_size=8, lr=1e30, warmup_steps=0),
              verbose=False)
    assert not model.training
