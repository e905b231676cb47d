"""Defects owned outside the index: checkpoints and resume, model folders and settings, inputs and outputs of the
encoders, IDF tables and query weights, threads, report configs and pruning rules."""
import copy
import json
import math
import pathlib
import shutil
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
import torch

from pyterrier_lsr import Prune, Splade, StaticQueryEncoder
from pyterrier_lsr.core.checks import MAX_WEIGHT
from pyterrier_lsr.core.encoding import encode_texts
from pyterrier_lsr.core.model_files import ModelLoadError
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.models import SpladeModel
from pyterrier_lsr.report import ConfigError, load_config
from pyterrier_lsr.report.builder import _SystemBuilder
from pyterrier_lsr.stages.pruning import prune
from pyterrier_lsr.train import Example, TrainConfig, train


class _Planted:
    """Unpickling this touches ``marker``: stands for any code a pickle can run (os.system, ...)."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def examples(n=24):
    words = 'nuclear reactor physics cat dog electron density ionosphere transistor amplifier radio wave noise'.split()
    return [Example(' '.join(words[i % 13:i % 13 + 2]), ' '.join(words[(i + 3) % 13:(i + 3) % 13 + 4]),
                    [' '.join(words[(i + 7) % 13:(i + 7) % 13 + 4])]) for i in range(n)]


CONFIG = TrainConfig(steps=4, batch_size=8, save_every=2, warmup_steps=1, flops_warmup_steps=2, lr=1e-3)


# --- 3. code execution --------------------------------------------------------------------------------------------

def test_resume_refuses_pickled_state(tiny, tmp_path):
    model, tokenizer = tiny
    train(copy.deepcopy(model), tokenizer, examples(), tmp_path, CONFIG, verbose=False)
    marker = tmp_path / 'ran'
    torch.save({'step': 4, 'payload': _Planted(marker)}, tmp_path / 'checkpoint-4' / 'trainer_state.pt')
    with pytest.warns(UserWarning, match='skipping checkpoint .*checkpoint-4'):
        train(copy.deepcopy(model), tokenizer, examples(), tmp_path, CONFIG, resume=True, verbose=False)
    assert not marker.exists()
    shutil.rmtree(tmp_path / 'checkpoint-2')  # now the planted state is all there is
    torch.save({'step': 4, 'payload': _Planted(marker)}, tmp_path / 'checkpoint-4' / 'trainer_state.pt')
    with pytest.warns(UserWarning), pytest.raises(ValueError, match='no intact checkpoint'):
        train(copy.deepcopy(model), tokenizer, examples(), tmp_path, CONFIG, resume=True, verbose=False)
    assert not marker.exists()


class _Corpus:
    def __init__(self, docs):
        self.docs = docs

    def get_corpus_iter(self, verbose=False):
        return iter(self.docs)


def test_report_reads_only_indexes_and_never_unpickles(splade, tmp_path):
    # The report keeps no encoding cache of its own: a pruned index is made from the unpruned index's stored vectors.
    docs = [{'docno': 'a', 'text': 'nuclear physics'}, {'docno': 'b', 'text': 'electron density'}]
    builder = _SystemBuilder(_Corpus(docs), tmp_path, 10)
    builder.models['splade-tiny'] = splade
    marker = tmp_path / 'ran'
    for name in ('splade-tiny.toks.pkl', 'splade-tiny.toks.jsonl'):  # what older versions and other tools leave
        (tmp_path / name).write_bytes(__import__('pickle').dumps(_Planted(marker)))
    pruned = builder._index({'name': 's', 'model': 'splade-tiny'}, {'top_n': 1})
    assert dict(pruned.vectors()) == {d['docno']: prune(v, top_n=1)
                                      for d, v in zip(docs, splade.encode([d['text'] for d in docs]))}
    assert not marker.exists()


# --- 6. query weights (idf.json) ----------------------------------------------------------------------------------

@pytest.mark.parametrize('value', ['NaN', 'Infinity', '-Infinity', '"0.5"', '-1', '1e308', 'true', 'null', '[1]'])
def test_idf_json_rejects_bad_weights(splade, tmp_path, value):
    StaticQueryEncoder(splade.tokenizer, {'nuclear': 1.0}).save_pretrained(tmp_path)
    (tmp_path / 'idf.json').write_text(f'{{"physics": 2.0, "nuclear": {value}}}')
    with pytest.raises(ValueError, match="'nuclear'") as error:
        StaticQueryEncoder.from_pretrained(str(tmp_path))
    assert 'idf.json' in str(error.value)


def test_query_weight_cap():
    # the cap admits weights up to MAX_WEIGHT and refuses any above it
    from pyterrier_lsr.core.checks import check_weights
    assert check_weights({'a': MAX_WEIGHT, 'b': 0}) == {'a': MAX_WEIGHT, 'b': 0.}
    with pytest.raises(ValueError, match="'a'"):
        check_weights({'a': MAX_WEIGHT * 1.01})


# --- 7. thread race -----------------------------------------------------------------------------------------------

def test_thread_race_four_threads_equal_sequential(tiny):
    splade = Splade(*tiny, batch_size=4)
    queries = [f'nuclear reactor {"cat " * (i % 5)}electron {i}' for i in range(200)]
    sequential = [splade.encode([q])[0] for q in queries]
    scorer = splade.scorer()
    frame = pd.DataFrame({'qid': ['1', '1'], 'query': ['nuclear cat', 'nuclear cat'], 'docno': ['a', 'b'],
                          'text': ['nuclear reactor physics', 'the cat sat']})
    expected_scores = scorer(frame)['score'].tolist()

    def work(_):
        return [splade.encode([q])[0] for q in queries], [scorer(frame)['score'].tolist() for _ in range(8)]
    with ThreadPoolExecutor(4) as pool:
        for vectors, scores in pool.map(work, range(4)):
            assert vectors == sequential and scores == [expected_scores] * 8
    decoder = splade.model.mlm.get_output_embeddings()
    assert 'forward' not in vars(decoder)  # the module is never patched


@pytest.mark.parametrize('kind', ['bert', 'roberta', 'modernbert', 'distilbert', 'electra'])
def test_forward_equals_full_mlm_logits(kind):
    """The explicit backbone + head transform (and the fallback for other layouts) give what the whole MLM gives."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        DistilBertConfig,
        DistilBertForMaskedLM,
        ElectraConfig,
        ElectraForMaskedLM,
        ModernBertConfig,
        ModernBertForMaskedLM,
        RobertaConfig,
        RobertaForMaskedLM,
    )
    torch.manual_seed(0)
    common = dict(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    ids = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    mlm = {'bert': lambda: BertForMaskedLM(BertConfig(**common)),
           'roberta': lambda: RobertaForMaskedLM(RobertaConfig(type_vocab_size=1, **common, **ids)),
           'modernbert': lambda: ModernBertForMaskedLM(ModernBertConfig(cls_token_id=0, sep_token_id=2, **common,
                                                                        **ids)),
           'distilbert': lambda: DistilBertForMaskedLM(DistilBertConfig(vocab_size=120, dim=32, hidden_dim=64,
                                                                        n_layers=1, n_heads=2)),
           'electra': lambda: ElectraForMaskedLM(ElectraConfig(embedding_size=16, **common))}[kind]().eval()
    model = SpladeModel(mlm, [0, 1, 2]).eval()
    assert (model._head_layout is None) == (kind == 'electra')
    input_ids = torch.randint(3, 120, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])
    with torch.inference_mode():
        ours = model(input_ids, mask)
        logits = mlm(input_ids=input_ids, attention_mask=mask).logits
    ref = torch.log1p(torch.relu(logits.masked_fill(~mask.bool()[..., None], -math.inf).amax(1)))
    ref[:, [0, 1, 2]] = 0
    torch.testing.assert_close(ours, ref)


# --- 8. model folders that load silently wrong --------------------------------------------------------------------

def test_folder_without_mlm_head_is_refused():
    with pytest.raises(ModelLoadError, match='new_head=True'):
        Splade.from_pretrained(resolve_model('all-MiniLM-L6-v2'))
    assert Splade.from_pretrained(resolve_model('all-MiniLM-L6-v2'), new_head=True).model.vocab_size == 30522


def test_a_deliberate_new_head_loads_quietly(capfd):
    from transformers.utils import logging

    from pyterrier_lsr.models.heads import splade_from_encoder
    Splade.from_pretrained('all-MiniLM-L6-v2', new_head=True)
    splade_from_encoder(resolve_model('all-MiniLM-L6-v2'))
    out, err = capfd.readouterr()
    assert 'LOAD REPORT' not in out + err and 'Loading weights' not in out + err, out + err
    assert logging.get_verbosity() == logging.WARNING and logging.is_progress_bar_enabled()  # settings restored


def test_folder_without_tokenizer_is_refused(tmp_path):
    for name in ('config.json', 'model.safetensors'):
        shutil.copy(pathlib.Path(resolve_model('splade-tiny')) / name, tmp_path)
    with pytest.raises(ModelLoadError, match='tokenizer'):
        Splade.from_pretrained(str(tmp_path))


@pytest.mark.parametrize('key, value', [('head_scale', 0), ('head_scale', -2.0), ('head_scale', 'x'),
                                        ('head_scale', float('inf')), ('head_scale', float('nan')),
                                        ('kind', 'sae-splade'), ('kind', 'splad'), ('pooling', 'mean')])
def test_invalid_lsr_settings_are_refused(tiny, tmp_path, key, value):
    Splade(*tiny).save_pretrained(tmp_path)
    config = json.loads((tmp_path / 'config.json').read_text())
    config['lsr'][key] = value
    (tmp_path / 'config.json').write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=f'lsr.{key}'):
        Splade.from_pretrained(str(tmp_path))


# --- 9. missing values and non-text -------------------------------------------------------------------------------

def test_missing_values_and_non_text_inputs(splade):
    column = pd.Series(['nuclear physics', pd.NA, None, '\x00\x1b\x7f', '[CLS] [SEP]'], dtype='string').tolist()
    vectors = splade.encode(column)
    assert vectors[0] and vectors[1:] == [{}] * 4
    for bad in (b'nuclear physics', ['nuclear'], 3):
        with pytest.raises(TypeError, match='position 1'):
            splade.encode(['ok', bad])


def test_non_finite_model_output_names_the_text(tiny):
    class Broken(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            out = torch.ones(len(input_ids), 8)
            out[input_ids[:, 1] == 5] = math.inf  # the text whose first token is 'the'
            return out
    tokenizer = tiny[1]
    with pytest.raises(ValueError, match=r'non-finite .*positions \[2\]'):
        encode_texts(Broken(), tokenizer, ['cat', None, 'the dog', 'dog'], [f't{i}' for i in range(8)])


# --- 10. checkpoints ----------------------------------------------------------------------------------------------

def test_checkpoint_writes_are_atomic(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    real_save = torch.save

    def disk_full(obj, file, *args, **kwargs):  # the state is written to a stream (storage.write_stream)
        if 'checkpoint-4' in str(file.file.name):
            file.write(b'PK\x03\x04 truncated')
            raise OSError(28, 'No space left on device')
        return real_save(obj, file, *args, **kwargs)
    monkeypatch.setattr(torch, 'save', disk_full)
    with pytest.raises(OSError, match='No space'):
        train(copy.deepcopy(model), tokenizer, examples(), tmp_path, CONFIG, verbose=False)
    assert sorted(p.name for p in tmp_path.glob('checkpoint-*')) == ['checkpoint-2']


def test_resume_skips_a_broken_checkpoint_and_equals_an_uninterrupted_run(tiny, tmp_path):
    model, tokenizer = tiny
    full = copy.deepcopy(model)
    train(full, tokenizer, examples(), tmp_path / 'full', CONFIG, verbose=False)
    train(copy.deepcopy(model), tokenizer, examples(), tmp_path / 'split', CONFIG, verbose=False)
    state = tmp_path / 'split' / 'checkpoint-4' / 'trainer_state.pt'
    state.write_bytes(state.read_bytes()[:1000])  # a save cut short by an older version or a full disk
    resumed = copy.deepcopy(model)
    with pytest.warns(UserWarning, match='checkpoint-4'):
        train(resumed, tokenizer, examples(), tmp_path / 'split', CONFIG, resume=True, verbose=False)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_resume_refuses_a_changed_config(tiny, tmp_path):
    import dataclasses
    model, tokenizer = tiny
    train(copy.deepcopy(model), tokenizer, examples(), tmp_path, CONFIG, verbose=False)
    for change in ({'lr': 2e-3}, {'batch_size': 4}, {'seed': 1}, {'steps': 6}):
        with pytest.raises(ValueError, match=f"{next(iter(change))}: .* -> .*resume='force'"):
            train(copy.deepcopy(model), tokenizer, examples(), tmp_path, dataclasses.replace(CONFIG, **change),
                  resume=True, verbose=False)
    train(copy.deepcopy(model), tokenizer, examples(), tmp_path, dataclasses.replace(CONFIG, log_every=1),
          resume=True, verbose=False)  # logging settings may change
    forced = dataclasses.replace(CONFIG, steps=6, lr=2e-3, log_every=1)
    log = train(copy.deepcopy(model), tokenizer, examples(), tmp_path, forced, resume='force', verbose=False)
    assert [row['step'] for row in log[-2:]] == [5, 6] and (tmp_path / 'checkpoint-6').is_dir()
    assert log[-2]['lr'] == pytest.approx(2e-3 * (6 - 5) / (6 - 1))  # the new lr and schedule apply
    with pytest.raises(ValueError, match='resume must be'):
        train(copy.deepcopy(model), tokenizer, examples(), tmp_path, CONFIG, resume='yes', verbose=False)


# --- 11. late or raw errors ---------------------------------------------------------------------------------------

BASE = 'dataset: irds:vaswani\noutput: out\nsystems:\n  - {name: s, type: splade, model: splade-tiny%s}\n'


@pytest.mark.parametrize('text, key', [
    (BASE % ', doc_pruning: {top_n: many}', 'systems[0].doc_pruning.top_n'),
    (BASE % ', doc_pruning: {top_n: 2.5}', 'systems[0].doc_pruning.top_n'),
    (BASE % ', query_pruning: {ratio: .nan}', 'systems[0].query_pruning'),
    (BASE % ', query_pruning: {threshold: -1}', 'systems[0].query_pruning'),
    (BASE % ', levels: 5', 'systems[0].levels'),
    (BASE % ', levels: [{doc_pruning: {top_n: -3}}]', r'systems[0].levels[0].doc_pruning'),
    (BASE % ', levels: [7]', 'systems[0].levels[0]'),
    (BASE % ', model: [a]', 'systems[0].model'),
    (BASE % '' + 'measures: [nDCG@ten]\n', 'measures[0]'),
    (BASE % '' + 'measures: nDCG@10\n', 'measures'),
    (BASE % '' + 'x: colour\n', 'x'),
    (BASE % '' + 'num_results: 0\n', 'num_results'),
    (BASE % '' + 'num_results: true\n', 'num_results'),
    (BASE % '' + 'title: 3\n', 'title'),
    (BASE % '' + 'workdir: {a: 1}\n', 'workdir'),
    (BASE % '' + 'workdir: /tmp/elsewhere\n', 'workdir'),  # writes stay inside the config file's folder
    (BASE % '' + 'workdir: ../../..\n', 'workdir'),
    ('dataset: irds:vaswani\noutput: ../out\nsystems: [{name: b, type: bm25}]\n', 'output'),
    ('dataset: irds:vaswani\noutput: out\nsystems: [{name: b, type: bm25, doc_pruning: {top_n: 3}}]\n', 'systems[0]'),
    ('- a list\n', '<top level>'),
    ('dataset: [unclosed\n', 'not valid YAML'),
])
def test_report_config_is_validated_up_front(tmp_path, text, key):
    (tmp_path / 'c.yaml').write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / 'c.yaml')
    assert key in str(error.value) and '\n' not in str(error.value)


def test_report_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'sub' / 'c.yaml').write_text(BASE % '' + 'workdir: idx\n')
    monkeypatch.chdir(tmp_path)
    config = load_config('sub/c.yaml')
    assert config['workdir'] == str(tmp_path / 'sub' / 'idx')


def test_report_help_lists_every_key(capsys):
    from pyterrier_lsr.cli import main
    from pyterrier_lsr.report import LEVEL_KEYS, PRUNING_KEYS, SYSTEM_KEYS, TOP_KEYS
    with pytest.raises(SystemExit):
        main(['report', '--help'])
    out = capsys.readouterr().out
    for key in [*TOP_KEYS, *SYSTEM_KEYS, *LEVEL_KEYS, *PRUNING_KEYS]:
        assert f'{key}' in out, key


def test_report_cli_prints_one_line_error(tmp_path, capsys):
    from pyterrier_lsr.cli import main
    (tmp_path / 'c.yaml').write_text(BASE % ', levels: 5')
    with pytest.raises(SystemExit) as exit_:
        main(['report', str(tmp_path / 'c.yaml')])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count('\n') == 1 and 'systems[0].levels' in err


def test_report_never_deletes_a_folder_it_did_not_create(splade, tmp_path):
    builder = _SystemBuilder(_Corpus([{'docno': 'a', 'text': 'nuclear physics'}]), tmp_path, 10)
    builder.models['splade-tiny'] = splade
    mine = tmp_path / f'{builder.model_key("splade-tiny")}.{builder.corpus_tag}.lsr'
    mine.mkdir()
    (mine / 'thesis.tex').write_text('years of work')
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr index'):
        builder._index({'name': 's', 'model': 'splade-tiny'}, {})
    assert (mine / 'thesis.tex').read_text() == 'years of work'


@pytest.mark.parametrize('kwargs, shown', [({'threshold': math.nan}, 'nan'), ({'threshold': -0.5}, '-0.5'),
                                           ({'top_n': 2.5}, '2.5'), ({'top_n': -1}, '-1'), ({'top_n': True}, 'True'),
                                           ({'ratio': 1.5}, '1.5'), ({'ratio': math.nan}, 'nan'),
                                           ({'ratio': '0.5'}, "'0.5'")])
def test_prune_rejects_bad_rules(kwargs, shown):
    with pytest.raises((TypeError, ValueError), match=f'{next(iter(kwargs))} .*{shown}'):
        Prune(**kwargs)


def test_prune_rejects_nan_weights_and_non_dict_vectors():
    frame = pd.DataFrame({'docno': ['a', 'b'], 'toks': [{'x': 1.0}, {'x': 0.5, 'y': math.nan}]})
    with pytest.raises(ValueError, match="toks at row 1: .*nan .*'y'"):
        Prune(ratio=0.5)(frame)
    with pytest.raises(TypeError, match='toks at row 0 is list'):
        Prune(top_n=1)(pd.DataFrame({'docno': ['a'], 'toks': [[('x', 1.0)]]}))
