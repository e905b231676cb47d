import math
import random
import re

import pandas as pd
import pytest
import torch

from pyterrier_lsr import Splade, load_model
from pyterrier_lsr.models.heads import head_report, rescale_head
from pyterrier_lsr.train import (
    DenseScorer,
    Example,
    RetrieverScorer,
    TrainConfig,
    ZScoreFusion,
    batch_loss,
    flops,
    flops_weight,
    from_dataframe,
    infonce,
    kl_distillation,
    margin_mse,
    pseudo_query,
    self_supervised,
    train,
)

Q = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])
D = torch.tensor(
    [
        [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]],  # query 0: positive, negative
        [[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]],
    ]
)  # query 1: positive, negative


def test_infonce_by_hand():
    # own candidates only: scores q0 = [3, 0], q1 = [2, 0]
    expected = (-math.log(math.exp(3) / (math.exp(3) + 1)) - math.log(math.exp(2) / (math.exp(2) + 1))) / 2
    assert infonce(Q, D, in_batch=False).item() == pytest.approx(expected)
    # in-batch: q0 vs all four docs = [3, 0, 0, 1], target 0; q1 = [0, 1, 2, 0], target 2
    s0, s1 = [3, 0, 0, 1], [0, 1, 2, 0]
    expected = (-math.log(math.exp(3) / sum(map(math.exp, s0))) - math.log(math.exp(2) / sum(map(math.exp, s1)))) / 2
    assert infonce(Q, D, in_batch=True).item() == pytest.approx(expected)


def test_distillation_losses_by_hand():
    scores = torch.tensor([[3.0, 0.0], [2.0, 0.0]])
    teacher = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert margin_mse(scores, teacher).item() == pytest.approx(((3 - 1) ** 2 + (2 + 1) ** 2) / 2)
    p = [
        [math.exp(1) / (math.exp(1) + 1), 1 / (math.exp(1) + 1)],
        [1 / (math.exp(1) + 1), math.exp(1) / (math.exp(1) + 1)],
    ]
    qs = [
        [math.exp(3) / (math.exp(3) + 1), 1 / (math.exp(3) + 1)],
        [math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)],
    ]
    expected = sum(p[i][j] * math.log(p[i][j] / qs[i][j]) for i in range(2) for j in range(2)) / 2
    assert kl_distillation(scores, teacher).item() == pytest.approx(expected, rel=1e-5)


def test_flops_and_warmup():
    reps = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert flops(reps).item() == pytest.approx(2.0**2 + 0 + 1.0**2)
    assert [flops_weight(s, 0.4, 10) for s in (0, 5, 10, 20)] == pytest.approx([0, 0.1, 0.4, 0.4])
    assert flops_weight(3, 0.4, 0) == 0.4


def examples(n=32, negatives=1, teacher=False):
    rng = random.Random(0)
    words = ('nuclear reactor physics cat dog electron density ionosphere transistor amplifier radio wave noise '
             'circuit').split()
    out = []
    for i in range(n):
        pos = ' '.join(rng.sample(words, 5))
        query = ' '.join(pos.split()[:2])
        negs = [' '.join(rng.sample(words, 5)) for _ in range(negatives)]
        out.append(Example(query, pos, negs, [1.0] + [0.0] * negatives if teacher else None))
    return out


def test_few_steps_decrease_loss(tiny, tmp_path):
    model, tokenizer = tiny
    data = examples(64, teacher=True)
    config = TrainConfig(
        steps=30,
        batch_size=16,
        lr=3e-3,
        warmup_steps=0,
        losses={'infonce': 1.0, 'margin_mse': 1.0},
        lambda_q=0,
        lambda_d=0,
    )
    before = sum(batch_loss(model, tokenizer, data[i : i + 16], config, 0)[1]['loss'] for i in range(0, 64, 16))
    log = train(model, tokenizer, data, tmp_path, config, verbose=False)
    after = sum(batch_loss(model, tokenizer, data[i : i + 16], config, 0)[1]['loss'] for i in range(0, 64, 16))
    assert after < 0.7 * before
    assert {'loss', 'infonce', 'margin_mse', 'q_nnz', 'd_nnz', 'flops_q', 'flops_d', 'lr', 'step'} <= set(log[-1])
    assert (tmp_path / 'metrics.csv').exists() and (tmp_path / 'checkpoint-30' / 'config.json').exists()


@pytest.mark.parametrize('lr_multipliers', [{}, {'mlm.cls.': 10.0}])
def test_resume_equals_uninterrupted_run(tiny, tmp_path, lr_multipliers):
    import copy

    model, tokenizer = tiny
    data = examples(40)
    fresh = copy.deepcopy(model)
    config = TrainConfig(
        steps=6,
        batch_size=8,
        grad_accum=2,
        save_every=3,
        warmup_steps=2,
        flops_warmup_steps=4,
        lr_multipliers=lr_multipliers,
    )
    train(model, tokenizer, data, tmp_path / 'full', config, verbose=False)
    train(copy.deepcopy(fresh), tokenizer, data, tmp_path / 'split', config, verbose=False)
    # as if interrupted after step 3: keep only checkpoint-3, then resume a fresh copy of the initial model
    import shutil

    shutil.rmtree(tmp_path / 'split' / 'checkpoint-6')
    resumed = copy.deepcopy(fresh)
    train(resumed, tokenizer, data, tmp_path / 'split', config, resume=True, verbose=False)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(
        model.state_dict()['mlm.cls.predictions.bias'], fresh.state_dict()['mlm.cls.predictions.bias']
    )


def test_lr_multipliers_scale_their_groups(tiny, tmp_path):
    from pyterrier_lsr.train.loop import param_groups

    model, tokenizer = tiny
    config = TrainConfig(
        steps=3, batch_size=8, lr=1e-3, warmup_steps=0, lr_multipliers={'mlm.bert.encoder.': 0.0, 'mlm.cls.': 10.0}
    )
    extra = torch.nn.Parameter(torch.zeros(2))
    groups = param_groups(model, [extra], config)
    assert [g['lr'] for g in groups] == [1e-3, 0.0, 1e-2]
    assert any(p is extra for p in groups[0]['params'])  # extra parameters keep lr
    assert sum(len(g['params']) for g in groups) == len([p for p in model.parameters() if p.requires_grad]) + 1
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train(model, tokenizer, examples(24), tmp_path, config, verbose=False)
    for name, p in model.named_parameters():  # a 0 multiplier freezes the encoder layers; the rest still trains
        assert torch.equal(p, before[name]) == name.startswith('mlm.bert.encoder.'), name


def test_rescale_head_divides_logits_and_survives_save_load(splade, texts, tmp_path):
    model = Splade.from_pretrained(splade.name).model
    hidden_before = _pooled(model, splade, texts[:3])
    assert rescale_head(model, 16) == 16
    hidden_after = _pooled(model, splade, texts[:3])
    torch.testing.assert_close(hidden_after, hidden_before / 16)
    model.save_pretrained(str(tmp_path))
    splade.tokenizer.save_pretrained(str(tmp_path))
    again = Splade.from_pretrained(str(tmp_path))
    assert again.model.settings['head_scale'] == 16
    torch.testing.assert_close(_pooled(again.model, splade, texts[:3]), hidden_after)
    torch.testing.assert_close(to_weights(again, texts[:3]), torch.log1p(torch.relu(hidden_after)))


def to_weights(splade, texts):
    enc = splade.tokenizer(texts, padding=True, return_tensors='pt')
    with torch.no_grad():
        return splade.model(enc['input_ids'], enc['attention_mask'])


def _pooled(model, splade, texts):
    """Max-pooled logits before the activation (special tokens at -inf)."""
    from pyterrier_lsr.models.heads import _pooled_logits

    return _pooled_logits(model, splade.tokenizer, texts)[2]


def test_head_report_and_auto(splade, texts):
    model = Splade.from_pretrained(splade.name).model
    report = head_report(model, splade.tokenizer, texts[:10])
    assert report['decoder_row_norm_mean'] > 0 and report['nonzeros_per_text'] > 10
    k = rescale_head(model, 'auto', splade.tokenizer, texts[:10])
    assert k == pytest.approx(report['auto_factor'])
    assert head_report(model, splade.tokenizer, texts[:10])['token_logit_std'] == pytest.approx(3.0, rel=1e-3)
    with pytest.raises(ValueError, match='texts'):
        rescale_head(model, 'auto')
    with pytest.raises(ValueError, match='> 0'):
        rescale_head(model, 0)


def test_self_supervised_pairs_are_valid(vaswani_docs):
    docs = vaswani_docs[:200] + [{'docno': 'dup', 'text': vaswani_docs[0]['text']}, {'docno': 'blank', 'text': ''}]
    data = self_supervised(docs, num_negatives=3, seed=1, verbose=False)
    texts = {d['text'] for d in docs}
    assert len(data) == 201  # the blank document yields nothing
    for ex in data:
        assert ex.positive in texts and len(ex.negatives) == 3
        assert ex.positive not in ex.negatives and len(set(ex.negatives)) == 3
        assert set(ex.query.split()) <= set(ex.positive.split()) and 3 <= len(ex.query.split()) <= 12
    assert pseudo_query('one two three four five', random.Random(0)) in 'one two three four five'


def test_bad_inputs(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match='empty'):
        Example('query', float('nan'), ['neg'])
    with pytest.raises(KeyError, match='positive'):
        from_dataframe(pd.DataFrame({'query': ['q'], 'negative': ['n']}))
    with pytest.raises(ValueError, match='empty'):
        from_dataframe(pd.DataFrame(columns=['query', 'positive', 'negative']))
    with pytest.raises(ValueError, match='at least'):
        train(model, tokenizer, [], tmp_path, TrainConfig(steps=1), verbose=False)
    with pytest.raises(ValueError, match='teacher'):
        train(
            model,
            tokenizer,
            examples(16),
            tmp_path,
            TrainConfig(steps=1, batch_size=8, losses={'kl': 1.0}),
            verbose=False,
        )
    with pytest.raises(ValueError, match='losses'):
        TrainConfig(losses={'hinge': 1.0})
    with pytest.raises(ValueError, match='lr_multipliers'):
        TrainConfig(lr_multipliers={'mlm.': -1.0})
    with pytest.raises(ValueError, match=r"\['sae\.'\] match no trainable parameter"):
        train(
            model,
            tokenizer,
            examples(16),
            tmp_path,
            TrainConfig(steps=1, batch_size=8, lr_multipliers={'sae.': 10.0}),
            verbose=False,
        )
    with pytest.raises(ValueError, match='at least 2'):
        self_supervised([{'docno': '1', 'text': 'only one'}], verbose=False)
    frame = from_dataframe(
        pd.DataFrame({'query': ['q'], 'positive': ['p'], 'negatives': [['a', 'b']], 'teacher': [[1, 0, 0]]})
    )
    assert frame[0].negatives == ['a', 'b'] and frame[0].teacher == [1, 0, 0]


@pytest.mark.parametrize('field, value, message', [
    ('temperature', 0, 'temperature must be a finite number > 0'),
    ('temperature', float('nan'), 'temperature must be a finite number'),
    ('lr', -1e-4, 'lr must be a finite number > 0'),
    ('max_grad_norm', 0, 'max_grad_norm must be a finite number > 0'),
    ('weight_decay', float('inf'), 'weight_decay must be a finite number >= 0'),
    ('lambda_q', -1, 'lambda_q must be a finite number >= 0'),
    ('warmup_steps', -1, 'warmup_steps must be >= 0'),
    ('max_length', 2, 'max_length must be >= 3'),
    ('log_every', 0, 'log_every must be >= 1'),
    ('steps', 2.5, 'steps must be an integer'),
    ('precision', 'int8', "precision must be one of 'fp32', 'bf16'; got 'int8'"),
    ('losses', {'infonce': -1.0}, "losses['infonce'] must be a finite number >= 0"),
    ('losses', {'infonce': 0.0, 'kl': 0}, 'at least one loss a weight > 0'),  # else only FLOPS trains: empty vectors
])
def test_train_config_refuses_invalid_fields_when_made(field, value, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        TrainConfig(**{field: value})


@pytest.mark.parametrize('field', ['query_max_length', 'max_length'])
def test_train_refuses_a_length_past_the_tokenizers_before_any_step(tiny, tmp_path, field):
    model, tokenizer = tiny
    tokenizer.model_max_length = 64  # the model has no positions past it
    with pytest.raises(ValueError, match=re.escape(f'{field} must be >= 3 and <= 64, got 100')):
        train(model, tokenizer, examples(4), tmp_path / 'run', TrainConfig(steps=1, batch_size=4, **{field: 100}),
              verbose=False)
    assert not (tmp_path / 'run').exists()


def test_micro_batches_refuse_fewer_examples_than_a_batch():
    from pyterrier_lsr.train.loop import micro_batches
    with pytest.raises(ValueError, match='need at least batch_size=4 examples, got 3'):  # not an endless loop
        next(micro_batches(examples(3), 4, 0))


def test_cli_trains_from_a_dataframe_file(tiny, tmp_path, capsys):
    import json

    from pyterrier_lsr.cli import main

    model, tokenizer = tiny
    model.save_pretrained(str(tmp_path / 'model'))
    tokenizer.save_pretrained(str(tmp_path / 'model'))
    rows = [{'query': ex.query, 'positive': ex.positive, 'negative': ex.negatives[0]} for ex in examples(16)]
    (tmp_path / 'train.jsonl').write_text('\n'.join(json.dumps(r) for r in rows))
    main(
        [
            'train',
            '--model',
            str(tmp_path / 'model'),
            '--data',
            str(tmp_path / 'train.jsonl'),
            '--output-dir',
            str(tmp_path / 'out'),
            '--steps',
            '2',
            '--batch-size',
            '8',
            '--no-in-batch-negatives',
            '--rescale-head',
            '4',
        ]
    )
    log = json.loads((tmp_path / 'out' / 'metrics.json').read_text())
    assert log[-1]['step'] == 2
    assert Splade.from_pretrained(str(tmp_path / 'out' / 'checkpoint-2')).model.settings['head_scale'] == 4
    # the final model is in <output-dir>/model, and the command says so
    assert f"final model: {tmp_path / 'out' / 'model'}" in capsys.readouterr().out
    final = load_model(str(tmp_path / 'out' / 'model'))
    assert final.model.settings['head_scale'] == 4
    checkpoint = Splade.from_pretrained(str(tmp_path / 'out' / 'checkpoint-2'))
    assert final.encode(['nuclear reactor physics']) == checkpoint.encode(['nuclear reactor physics'])


def test_cli_train_takes_irds_cache_before_ir_datasets_is_imported(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, '-m', 'pyterrier_lsr.cli', 'train', '--model', 'splade-tiny', '--data',
               'self-supervised:vaswani', '--output-dir', str(tmp_path / 'o'), '--irds-cache', str(tmp_path / 'none')]
    done = subprocess.run(command, capture_output=True, text=True)
    # use_irds_cache itself answered (not "must be called before ir_datasets is imported")
    assert done.returncode == 2 and f'--irds-cache: no ir_datasets cache at {tmp_path / "none"}' in done.stderr


def test_splade_from_encoder_without_mlm_head_and_calibration(texts):
    from transformers import AutoTokenizer

    from pyterrier_lsr.core.names import resolve_model
    from pyterrier_lsr.models.heads import calibrate_activation, head_transform, splade_from_encoder

    path = resolve_model('all-MiniLM-L6-v2')
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = splade_from_encoder(path, tokenizer.all_special_ids)
    transform, decoder = head_transform(model.mlm), model.mlm.get_output_embeddings()
    assert torch.equal(transform.dense.weight, torch.eye(transform.dense.weight.shape[0]))
    assert decoder.weight is model.mlm.get_input_embeddings().weight and not decoder.bias.any()
    stats = calibrate_activation(model, tokenizer, texts[:20], target_active=0.01)
    assert stats['active_before'] > 0.5  # an uncalibrated new head starts dense
    assert stats['active_after'] == pytest.approx(0.01, abs=0.001)
    again = head_report(model, tokenizer, texts[:20])
    assert again['nonzeros_per_text'] == pytest.approx(
        0.01 * (model.vocab_size - len(tokenizer.all_special_ids)), rel=0.05
    )
    # the offline short name and the wrapper with its tokenizer give the same new head
    splade = Splade.from_encoder('all-MiniLM-L6-v2')
    assert splade.tokenizer.get_vocab() == tokenizer.get_vocab() and repr(splade) == "Splade('all-MiniLM-L6-v2')"
    fresh = splade_from_encoder(path, tokenizer.all_special_ids)
    for (name, a), b in zip(splade.model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), name



def _retriever_scorer():
    """RetrieverScorer over a stub retriever: d0 then d1 for every query."""
    import pyterrier as pt

    def retrieve(queries):
        return pt.model.add_ranks(pd.DataFrame([{'qid': qid, 'query': query, 'docno': docno, 'score': score}
                                                for qid, query in zip(queries['qid'], queries['query'])
                                                for docno, score in (('d0', 2.), ('d1', 1.))]))
    return RetrieverScorer(pt.apply.generic(retrieve), {'d0': 'text 0', 'd1': 'text 1'}, depth=10)


@pytest.mark.parametrize('teacher', [_retriever_scorer, lambda: ZScoreFusion([_retriever_scorer()])])
@pytest.mark.parametrize('change, message', [
    ({'query': 'another query'}, "qid 'q' has two query texts"),  # RetrieverScorer scored both by the first
    ({'docno': 'd0', 'text': 'text 0'}, "docno 'd0' occurs twice for qid 'q'"),  # the fusion's merge doubled rows
])
def test_teacher_scorers_check_their_result_frames(teacher, change, message):
    frame = pd.DataFrame({'qid': ['q', 'q'], 'query': ['a query'] * 2, 'docno': ['d0', 'd1'],
                          'text': ['text 0', 'text 1']})
    assert list(teacher()(frame)['score']) != [0., 0.]  # the stub scores the frame as it is
    changed = frame.copy()
    for column, value in change.items():
        changed.loc[1, column] = value
    with pytest.raises(ValueError, match=message):
        teacher()(changed)


@pytest.mark.parametrize('make, match', [
    (lambda: RetrieverScorer(None, {}, depth=0), 'depth must be >= 1, got 0'),
    (lambda: RetrieverScorer(None, ['d0'], depth=5), 'docs_text must be a {docno: text} mapping, got list'),
    (lambda: ZScoreFusion([None], [float('nan')]), 'weights[0] must be a finite number'),
    (lambda: ZScoreFusion([None, None], [1.]), 'one weight per scorer: 1 for 2'),
    (lambda: ZScoreFusion([]), 'scorers must hold at least one scorer'),
    (lambda: DenseScorer('all-MiniLM-L6-v2', batch_size=0), 'batch_size must be >= 1, got 0'),
    (lambda: DenseScorer('all-MiniLM-L6-v2', max_length=513), 'max_length must be >= 3 and <= 512, got 513'),
])
def test_teacher_scorers_check_their_settings(make, match):
    with pytest.raises((TypeError, ValueError), match=re.escape(match)):
        make()
