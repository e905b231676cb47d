"""The command line refuses bad settings and unknown datasets with one error line and exit status 2 (no traceback),
before any model is loaded."""
import pytest

from pyterrier_lsr.cli import main


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError('a model was loaded before the settings were checked')
    monkeypatch.setattr('pyterrier_lsr.kinds.loading.load_model', refuse)
    monkeypatch.setattr('pyterrier_lsr.kinds.splade.Splade.from_pretrained', refuse)


def _domain_adapt(tmp_path, *extra):
    return ['domain-adapt', '--model', 'splade-tiny', '--output-dir', str(tmp_path / 'out'), *extra]


@pytest.mark.parametrize('extra, message', [
    (['--collection', 'irds:vaswani', '--set', 'stepz=3'], "unknown DomainConfig setting 'stepz'"),
    (['--collection', 'irds:vaswani', '--set', 'steps=many'], "steps must be an integer, got 'many'"),
    (['--collection', 'irds:vaswani', '--set', 'steps=0'], 'steps must be >= 1, got 0'),
    (['--collection', 'irds:vaswani', '--set', 'per_doc=0'], 'per_doc must be >= 1, got 0'),
    (['--collection', 'irds:vaswani', '--set', 'lr=fast'], "lr must be a number, got 'fast'"),
    (['--collection', 'irds:vaswani', '--set', 'precision=maybe'],
     "precision must be one of 'fp32', 'bf16'; got 'maybe'"),
    (['--collection', 'irds:vaswani', '--set', 'steps'], "--set takes NAME=VALUE, got 'steps'"),
    (['--collection', 'irds:unknown'], 'irds:unknown is not an ir_datasets id'),
])
def test_domain_adapt_refuses_bad_settings_in_one_line(tmp_path, capsys, no_model, extra, message):
    with pytest.raises(SystemExit) as exited:
        main(_domain_adapt(tmp_path, *extra))
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert 'Traceback' not in err and not (tmp_path / 'out').exists()


@pytest.mark.parametrize('extra, message', [
    (['--data', 'irds:unknown'], '--data: irds:unknown is not an ir_datasets id'),
    (['--data', 'self-supervised:unknown'], '--data: irds:unknown is not an ir_datasets id'),
    (['--data', 'x.jsonl', '--temperature', '0'], 'temperature must be a finite number > 0, got 0.0'),
    (['--data', 'x.jsonl', '--query-max-length', '0'], 'query_max_length must be >= 3, got 0'),
    (['--data', 'x.jsonl', '--losses', 'hinge=1'], 'losses must be a non-empty dict'),
    (['--data', 'x.jsonl', '--limit', '-1'], '--limit must be >= 1, got -1'),
    (['--data', 'x.jsonl', '--negatives', '0'], '--negatives must be >= 1, got 0'),
    (['--data', 'x.jsonl', '--rescale-head', 'inf'], '--rescale-head must be a finite number > 0, got inf'),
    (['--data', 'no-such-file.jsonl'], '--data: no-such-file.jsonl is not a file'),
])
def test_train_refuses_bad_settings_in_one_line(tmp_path, capsys, no_model, extra, message):
    with pytest.raises(SystemExit) as exited:
        main(['train', '--model', 'splade-tiny', '--output-dir', str(tmp_path / 'out'), *extra])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_report_refuses_an_unknown_dataset_in_one_line(tmp_path, capsys):
    (tmp_path / 'c.yaml').write_text('dataset: irds:unknown\noutput: out\nsystems: [{name: b, type: bm25}]\n')
    with pytest.raises(SystemExit) as exited:
        main(['report', str(tmp_path / 'c.yaml')])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert 'config key dataset: irds:unknown is not an ir_datasets id' in err and not (tmp_path / 'out').exists()


@pytest.mark.parametrize('mine', ['metrics.csv', 'model/weights.bin', 'a file'])
def test_train_refuses_an_output_dir_it_would_write_over_before_training(tmp_path, capsys, mine):
    # metrics.csv used to be replaced by the run's log, and a user's model/ refused only after the whole training
    data = tmp_path / 'd.jsonl'
    data.write_text('{"query": "q", "positive": "p", "negative": "n"}\n')
    out = tmp_path / 'out'
    if mine == 'a file':
        out.write_text('mine')
    else:
        (out / mine).parent.mkdir(parents=True, exist_ok=True)
        (out / mine).write_text('mine')
    with pytest.raises(SystemExit) as exited:
        main(['train', '--model', 'splade-tiny', '--data', str(data), '--output-dir', str(out), '--steps', '1',
              '--batch-size', '1'])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and '--output-dir' in err and len(err.strip().splitlines()) == 1, err
    assert (out.read_text() if mine == 'a file' else (out / mine).read_text()) == 'mine'
    assert mine == 'a file' or sorted(p.name for p in out.iterdir()) == [mine.split('/')[0]]  # nothing written


def _run_folder(tiny, tmp_path, **changes):
    """A training run of the tiny model into tmp_path/out (its checkpoint-1) and a data file for the CLI."""
    import copy

    from pyterrier_lsr.train import Example, TrainConfig, train
    model, tokenizer = tiny
    config = TrainConfig(steps=1, batch_size=1, warmup_steps=0, **changes)
    train(copy.deepcopy(model), tokenizer, [Example('reactor', 'nuclear reactor', ['cat dog'])], tmp_path / 'out',
          config, verbose=False)
    data = tmp_path / 'd.jsonl'
    data.write_text('{"query": "reactor", "positive": "nuclear reactor", "negative": "cat dog"}\n')
    return ['train', '--model', 'splade-tiny', '--data', str(data), '--output-dir', str(tmp_path / 'out'),
            '--steps', '1', '--batch-size', '1', '--warmup-steps', '0', '--resume']


def _one_line_error(capsys, argv) -> str:
    capsys.readouterr()  # what making the run folder printed
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and 'Traceback' not in err, err
    return err


def test_resume_with_changed_settings_is_one_line_before_the_model_loads(tiny, tmp_path, capsys, no_model):
    err = _one_line_error(capsys, _run_folder(tiny, tmp_path) + ['--lr', '1e-3'])
    assert "--resume: the TrainConfig differs from the one" in err and "lr: 5e-05 -> 0.001" in err, err


def test_resume_without_a_checkpoint_that_loads_is_one_line_before_the_model_loads(tiny, tmp_path, capsys, no_model):
    argv = _run_folder(tiny, tmp_path)
    (tmp_path / 'out' / 'checkpoint-1' / 'trainer_state.pt').write_bytes(b'truncated')
    with pytest.warns(UserWarning, match='skipping checkpoint'):
        err = _one_line_error(capsys, argv)
    assert "--resume: no intact checkpoint to resume from" in err and "checkpoint-1" in err, err


def test_resume_from_a_checkpoint_of_another_model_is_one_line(tiny, tmp_path, capsys, monkeypatch):
    # the tiny model's checkpoint, resumed with splade-tiny: torch's multi-line size-mismatch traceback before
    from pyterrier_lsr.train import checkpoints
    argv, loads, load_state = _run_folder(tiny, tmp_path), [], checkpoints.load_state
    monkeypatch.setattr(checkpoints, 'load_state',
                        lambda checkpoint: (loads.append(checkpoint), load_state(checkpoint))[1])
    err = _one_line_error(capsys, argv)
    assert 'checkpoint-1 holds the weights of another model' in err and 'tensors missing, extra or of another' in err
    assert [p.name for p in loads] == ['checkpoint-1']  # checked before the model loads, and not read again to resume


@pytest.mark.parametrize('flag', ['--output-dir', '--cache-dir'])
def test_domain_adapt_refuses_a_user_folder_by_its_flag_before_the_model_loads(tmp_path, capsys, no_model, flag):
    folder = tmp_path / 'coll'
    folder.mkdir()
    (folder / 'docs.jsonl').write_text('{"docno": "d1", "text": "nuclear reactor"}\n')
    (folder / 'topics.tsv').write_text('1\treactor\n')
    (folder / 'qrels.txt').write_text('1 0 d1 1\n')
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    argv = ['domain-adapt', '--model', 'splade-tiny', '--collection', str(folder), flag, str(mine)]
    if flag == '--cache-dir':
        argv += ['--output-dir', str(tmp_path / 'out')]
    err = _one_line_error(capsys, argv)
    assert f'{flag}: {mine} is not a pyterrier-lsr domain-adaptation' in err, err
    assert [p.name for p in mine.iterdir()] == ['notes.txt']
