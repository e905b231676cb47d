import json
import re

import pandas as pd
import pytest
import torch

from pyterrier_lsr.train import (
    DomainConfig,
    Example,
    domain_adapt,
    from_qrels,
    keyword_query,
)
from pyterrier_lsr.train.domain import SELECT_ON, cache, driver, heldout_scores

WORDS = ('nuclear reactor physics electron density ionosphere transistor amplifier measurement dielectric constant '
         'liquids radio wave noise circuit').split()


@pytest.fixture
def corpus():
    import random
    rng = random.Random(0)
    return [{'docno': f'd{i}', 'text': '. '.join(' '.join(rng.sample(WORDS, 6)) for _ in range(3)) + '.'}
            for i in range(60)]


def _splade(tiny):
    from pyterrier_lsr import Splade
    model, tokenizer = tiny
    return Splade(model, tokenizer, device='cpu')


def _config(**kw):
    return DomainConfig.two_sided(**{'steps': 4, 'batch_size': 4, 'eval_every': 2, 'heldout': 10, 'heldout_pool': 5,
                                     'pool': 10, 'teachers': ('bm25',), 'lr': 1e-2, 'precision': 'fp32', **kw})


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same_vectors(got: list, expected: list):
    """Vector by vector: pytest.approx compares dicts, not lists of them (a TypeError from pytest 9.2 on)."""
    assert len(got) == len(expected) and all(g == pytest.approx(e) for g, e in zip(got, expected))


def _prefer_last_step(monkeypatch) -> list:
    """Held-out scoring stays real but its selection signal rises at every evaluation, so the last step is selected;
    returns the list the real scores are appended to."""
    real, calls = heldout_scores, []

    def rising(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return {**calls[-1], 'heldout_first_ndcg': len(calls)}
    monkeypatch.setattr(driver, 'heldout_scores', rising)
    return calls


def test_guard_returns_starting_model_and_cache_is_reused(tiny, corpus, tmp_path, monkeypatch):
    splade = _splade(tiny)
    start = _weights(splade.model)
    model, log = domain_adapt(splade, corpus, tmp_path / 'a', _config(min_gain=10.), verbose=False)
    assert log['guard'] and log['selected_step'] == 0 and 'never-worse guard' in log['decision']
    assert 'held-out pseudo-queries' in log['decision']  # says what it measured: not test topics
    assert [row['step'] for row in log['curve']] == [0, 2, 4]
    assert not log['cache_hit']
    # training did move the weights (the held-out scores changed), and the guard put the starting ones back
    assert log['curve'][-1]['heldout_mrr'] != log['curve'][0]['heldout_mrr'] or \
        log['curve'][-1]['heldout_ndcg'] != log['curve'][0]['heldout_ndcg']
    assert all(torch.equal(v, start[k]) for k, v in model.model.state_dict().items())
    assert json.loads((tmp_path / 'a' / 'domain_adapt.json').read_text())['guard']

    def no_teacher(*args, **kwargs):
        raise AssertionError('teacher rebuilt although its scores are cached')
    monkeypatch.setattr(cache, 'Teacher', no_teacher)
    _, log2 = domain_adapt(_splade(tiny), corpus, tmp_path / 'b', _config(min_gain=10., lr=1e-3),
                           cache_dir=tmp_path / 'a' / 'cache', verbose=False)
    assert log2['cache_hit'] and log2['examples'] == log['examples']


def test_heldout_selection_picks_best_step(tiny, corpus, tmp_path, monkeypatch):
    scripted = iter([0.2, 0.1, 0.5, 0.3, 0.4])   # steps 0, 2, 4, 6, 8: step 4 is best
    seen = {}

    def fake_scores(model, tokenizer, heldout, docs, config, extra, query_encoder, doc_encoder):
        step = len(seen) * 2
        seen[step] = _weights(model)
        score = next(scripted)
        return dict.fromkeys(SELECT_ON, score)
    monkeypatch.setattr(driver, 'heldout_scores', fake_scores)
    model, log = domain_adapt(_splade(tiny), corpus, tmp_path / 'run', _config(steps=8), verbose=False)
    assert not log['guard'] and log['selected_step'] == 4 and log['best_score'] == 0.5
    final = model.model.state_dict()
    assert all(torch.equal(v, seen[4][k]) for k, v in final.items())
    assert not all(torch.equal(v, seen[8][k]) for k, v in final.items())
    assert (tmp_path / 'run' / 'model' / 'config.json').exists()


@pytest.mark.parametrize('scripted, selected', [([0.2, 0.1, 0.5], 4), ([0.5, 0.1, 0.2], 0)])
def test_doc_only_trains_its_query_table(tiny, corpus, tmp_path, monkeypatch, scripted, selected):
    """An inference-free model adapts with its static query side: the selected table comes back (saved with the
    model), and the starting one when the guard fires."""
    from pyterrier_lsr import IDFQueryEncoder, InferenceFreeSplade, load_model
    model, tokenizer = tiny
    idf = IDFQueryEncoder.from_corpus(tokenizer, [d['text'] for d in corpus])
    splade = InferenceFreeSplade(model, tokenizer, idf, device='cpu')
    scripted, tables = iter(scripted), []

    def fake_scores(model, tokenizer, heldout, docs, config, extra, query_encoder, doc_encoder):
        tables.append(query_encoder.weight.detach().clone())
        return dict.fromkeys(SELECT_ON, next(scripted))
    monkeypatch.setattr(driver, 'heldout_scores', fake_scores)
    out, log = domain_adapt(splade, corpus, tmp_path / 'run', _config(steps=4), verbose=False)
    assert log['selected_step'] == selected and not torch.equal(tables[0], tables[-1])
    vocab = tokenizer.get_vocab()
    for reloaded in (out, load_model(tmp_path / 'run' / 'model')):
        assert isinstance(reloaded, InferenceFreeSplade)
        weights = reloaded.query_side.weights
        if selected == 0:
            assert weights == pytest.approx(idf.weights)
        else:
            assert all(abs(w - float(tables[selected // 2][vocab[t]])) < 1e-5 for t, w in weights.items())
            assert weights != pytest.approx(idf.weights)


@pytest.mark.parametrize('scripted, selected', [([0.2, 0.1, 0.5], 4), ([0.5, 0.1, 0.2], 0)])
def test_query_side_adapts_a_copy_of_the_query_encoder(tiny, corpus, tmp_path, monkeypatch, scripted, selected):
    """side='query': documents come from the starting model, frozen; only a copy trains for queries, and the result
    is an AsymmetricSplade (saved and reloaded as one), or the starting model itself when the guard fires."""
    from pyterrier_lsr import AsymmetricSplade, Splade, load_model
    from pyterrier_lsr.train.domain.vectors import sparse_vectors
    splade = _splade(tiny)
    start = _weights(splade.model)
    scripted, seen = iter(scripted), []

    def fake_scores(model, tokenizer, heldout, docs, config, extra, query_encoder, doc_encoder):
        text = corpus[0]['text']
        expected = sparse_vectors(splade.model, tokenizer, [text], splade.max_length, 'fp32').to_dense()
        assert model is not splade.model
        assert torch.allclose(doc_encoder([text], tokenizer, 96), expected, atol=1e-5)
        seen.append(_weights(model))
        return dict.fromkeys(SELECT_ON, next(scripted))
    monkeypatch.setattr(driver, 'heldout_scores', fake_scores)
    out, log = domain_adapt(splade, corpus, tmp_path / 'run', _config(side='query', candidates='teacher', negatives=7),
                            verbose=False)
    assert log['selected_step'] == selected
    assert all(torch.equal(v, start[k]) for k, v in splade.model.state_dict().items())  # left as it was
    assert not all(torch.equal(v, start[k]) for k, v in seen[-1].items())  # the copy trained
    if selected == 0:
        assert out is splade
        return
    assert isinstance(out, AsymmetricSplade) and out.model is splade.model
    assert all(torch.equal(v, seen[selected // 2][k]) for k, v in out.query_splade.model.state_dict().items())
    reloaded = load_model(tmp_path / 'run' / 'model')
    assert isinstance(reloaded, AsymmetricSplade) and reloaded.sides is Splade
    # folders written before `sides` was recorded hold SPLADE models and load as before
    from pyterrier_lsr.core.folders import model_settings, update_settings
    settings = model_settings(tmp_path / 'run' / 'model')
    assert settings['kind'] == 'asymmetric' and settings['sides'] == 'splade'
    update_settings(tmp_path / 'run' / 'model', sides=None)
    assert load_model(tmp_path / 'run' / 'model').sides is Splade
    texts = [d['text'] for d in corpus[:3]]
    _same_vectors(reloaded.encode(texts), splade.encode(texts))
    queries = pd.DataFrame({'qid': ['1'], 'query': ['radio wave noise']})
    adapted = out.query_encoder()(queries)['query_toks'][0]
    assert reloaded.query_encoder()(queries)['query_toks'][0] == pytest.approx(adapted)
    assert adapted != splade.query_encoder()(queries)['query_toks'][0]
    # indexing the adapted model writes the starting model's documents, and its retriever runs the adapted queries:
    # an index of the starting model serves it the same
    from pyterrier_lsr import SpladeIndexer
    own = SpladeIndexer(str(tmp_path / 'own.lsr'), out, verbose=False).index(corpus)
    start_index = SpladeIndexer(str(tmp_path / 'start.lsr'), splade, verbose=False).index(corpus)
    assert isinstance(own.model(), AsymmetricSplade)
    out.name = 'runs/adapted'  # as systems.adapted names its models: both sides follow
    assert repr(out.query_encoder()) == "AsymmetricSplade('adapted').query"
    assert repr(out) == "AsymmetricSplade('adapted')"
    ranked = own.retriever()(queries)
    pd.testing.assert_frame_equal(ranked, start_index.retriever(query_encoder=out.query_encoder())(queries))
    assert not ranked.equals(start_index.retriever()(queries))


def test_query_side_trains_for_real(tiny, corpus, tmp_path):
    """Without any fake: the frozen documents' vectors feed the real loss and held-out scores."""
    from pyterrier_lsr import Splade, SpladeIndexer
    splade = _splade(tiny)
    start = _weights(splade.model)
    config = _config(side='query', negatives=7, candidates='teacher')
    out, log = domain_adapt(splade, corpus, tmp_path / 'run', config, tmp_path / 'cache', verbose=False)
    assert log['examples'] > 0 and log['config']['side'] == 'query'
    assert [row['step'] for row in log['curve']] == [0, 2, 4]
    assert len({row['heldout_first_ndcg'] for row in log['curve']}) > 1
    assert all(torch.equal(v, start[k]) for k, v in splade.model.state_dict().items())
    # the documents read from an index of the starting model instead of encoded: the same run
    index = SpladeIndexer(str(tmp_path / 'start.lsr'), splade, verbose=False).index(corpus)
    _, again = domain_adapt(splade, corpus, tmp_path / 'again', config, tmp_path / 'cache', verbose=False,
                            documents=index)
    assert [row['heldout_first_ndcg'] for row in again['curve']] == pytest.approx(
        [row['heldout_first_ndcg'] for row in log['curve']])
    assert again['selected_step'] == log['selected_step']
    assert log['documents_from'] is None and again['documents_from'] == str(index.path)
    # an index of what another model (here: other max_length) encodes is refused, and so is a two-sided config
    short = Splade(*tiny, device='cpu', max_length=8)
    other = SpladeIndexer(str(tmp_path / 'short.lsr'), short, verbose=False).index(corpus)
    with pytest.raises(ValueError, match='does not hold the documents as this model encodes them'):
        domain_adapt(splade, corpus, tmp_path / 'other', config, tmp_path / 'cache', verbose=False, documents=other)
    with pytest.raises(ValueError, match="serves query-side adaptation"):
        domain_adapt(splade, corpus, tmp_path / 'both', _config(), verbose=False, documents=index)
    assert not (tmp_path / 'both').exists()
    with pytest.raises(ValueError, match='side must be one of'):
        DomainConfig(side='documents')

    class Other(Splade):  # a kind whose query side cannot adapt alone
        kind = 'other'
    with pytest.raises(ValueError, match="side='query' adapts the query encoder"):  # refused before any work
        domain_adapt(Other(*tiny), corpus, tmp_path / 'other-kind', _config(side='query'), verbose=False)
    assert not (tmp_path / 'other-kind').exists()


def test_query_side_of_a_doc_only_model_trains_its_table_alone(tiny, corpus, tmp_path, monkeypatch):
    """side='query' on an inference-free model: its static table trains against the indexed documents, which
    stay as they were, so the index built before adaptation serves the adapted table."""
    from pyterrier_lsr import IDFQueryEncoder, InferenceFreeSplade, SpladeIndexer, load_model
    doc_only = InferenceFreeSplade(*tiny, IDFQueryEncoder.from_corpus(tiny[1], [d['text'] for d in corpus]),
                                   device='cpu')
    start, idf_side = _weights(doc_only.model), doc_only.query_side
    idf = dict(idf_side.weights)
    index = SpladeIndexer(str(tmp_path / 'doc-only.lsr'), doc_only, verbose=False).index(corpus)
    calls = _prefer_last_step(monkeypatch)
    out, log = domain_adapt(doc_only, corpus, tmp_path / 'run', _config(side='query', negatives=7, lr=1e-1,
                                                                        candidates='teacher'),
                            tmp_path / 'cache', verbose=False, documents=index)
    assert out is doc_only and log['selected_step'] == 4 and log['documents_from'] == str(index.path)
    assert all(torch.equal(v, start[k]) for k, v in doc_only.model.state_dict().items())
    assert all(p.requires_grad for p in doc_only.model.parameters())  # frozen for the run only
    assert doc_only.query_side.weights != pytest.approx(idf) and calls[0]['heldout_ndcg'] != calls[-1]['heldout_ndcg']
    queries = pd.DataFrame({'qid': ['1'], 'query': ['radio wave noise']})
    reloaded = load_model(tmp_path / 'run' / 'model')
    assert reloaded.query_side.weights == pytest.approx(doc_only.query_side.weights)
    ranked = index.retriever(query_encoder=reloaded.query_encoder())(queries)
    assert len(ranked) and not ranked.equals(index.retriever(query_encoder=idf_side)(queries))


def test_defaults_adapt_queries_and_builders_that_train_documents_refuse_them(corpus, tmp_path):
    from pyterrier_lsr.systems import sae_splade, vt_splade
    assert DomainConfig().side == 'query' and DomainConfig.two_sided().side == 'both'
    assert DomainConfig.two_sided(steps=7).steps == 7 and DomainConfig.two_sided().negatives == 3
    for build in (vt_splade, sae_splade):
        with pytest.raises(ValueError, match='two_sided'):
            build(corpus, tmp_path / 'x', DomainConfig())
    assert not (tmp_path / 'x').exists()


def test_heldout_scores_and_keyword_queries(tiny, corpus):
    import random
    from collections import Counter
    splade = _splade(tiny)
    docs = {d['docno']: d['text'] for d in corpus}
    heldout = [{'query': 'reactor physics', 'pos': 'd1', 'ranked': ['d1', 'd2', 'd3']},
               {'query': 'radio noise', 'pos': 'd9', 'ranked': ['d4', 'd5']}]
    s = heldout_scores(splade.model, splade.tokenizer, heldout, docs, _config())
    assert 0 < s['heldout_ndcg'] <= 1 and 0 < s['heldout_mrr'] <= 0.5  # d9 is not in its pool: RR 0
    # first-stage: the same queries retrieve from every pool plus extra documents, which can only push pool
    # documents down, and can find a source document that is outside its query's pool
    first = heldout_scores(splade.model, splade.tokenizer, heldout, docs, _config(), ['d6', 'd9'])
    assert first['heldout_ndcg'] == s['heldout_ndcg'] and first['heldout_first_ndcg'] <= s['heldout_ndcg']
    alone = heldout_scores(splade.model, splade.tokenizer, heldout[1:], docs, _config(), ['d9'])
    assert alone['heldout_mrr'] == 0 and alone['heldout_first_mrr'] > 0
    # a doc-only query side (a trainable static table) scores the same way
    from pyterrier_lsr.stages.query import StaticQueryWeights
    table = heldout_scores(splade.model, splade.tokenizer, heldout, docs, _config(), ['d6'],
                                         StaticQueryWeights(splade.tokenizer))
    assert set(table) == set(s) and 0 < table['heldout_ndcg'] <= 1
    df = Counter({'the': 60, 'reactor': 1, 'physics': 1})
    words = {keyword_query('the reactor the physics the', df, 60, random.Random(i), 1, 2) for i in range(20)}
    assert words <= {'reactor', 'physics', 'reactor physics', 'the', 'the reactor', 'the physics'}
    assert 'reactor physics' in words


@pytest.mark.parametrize('field, value, message', [
    ('per_doc', 0, 'per_doc must be >= 1, got 0'),
    ('steps', 0, 'steps must be >= 1, got 0'),
    ('batch_size', 0, 'batch_size must be >= 1, got 0'),
    ('heldout', 0, 'heldout must be >= 1, got 0'),
    ('heldout_pool', 0, 'heldout_pool must be >= 1, got 0'),
    ('negatives', 0, 'negatives must be >= 1, got 0'),
    ('pool', 0, 'pool must be >= 1, got 0'),
    ('lr', 0, 'lr must be a finite number > 0'),
    ('teacher_scale', float('nan'), 'teacher_scale must be a finite number'),
    ('min_gain', -0.1, 'min_gain must be a finite number >= 0'),
    ('teachers', ('bm25', 'colbert'), 'teachers must be a non-empty subset'),
    ('teachers', 'bm25', 'teachers must be a non-empty subset'),
    ('select_on', 'ndcg', 'select_on must be one of'),
    ('losses', {'infonce': 1.0, 'hinge': 1.0}, 'losses must be a non-empty dict'),
    ('dense_teacher', '', 'dense_teacher must be a non-empty string'),  # else a failed load after the queries
    ('latent_teacher', 5, 'latent_teacher must be a string'),
])
def test_domain_config_refuses_invalid_fields_when_made(field, value, message):
    import re
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        DomainConfig(**{field: value})


def test_fewer_examples_than_a_batch_is_an_error_not_an_endless_loop(tiny, corpus, tmp_path, monkeypatch):
    data = {'examples': [{'query': 'reactor', 'pos': 'd1', 'negatives': ['d2', 'd3', 'd4'], 'teacher': [1., 0, 0, 0]}]
            * 3, 'heldout': [{'query': 'noise', 'pos': 'd5', 'ranked': ['d5']}], 'heldout_extra': []}
    monkeypatch.setattr(driver, 'build_data', lambda *args: (data, True))  # 3 examples survived; batches of 4
    with pytest.raises(ValueError, match='3 training examples, fewer than batch_size=4'):
        domain_adapt(_splade(tiny), corpus, tmp_path / 'run', _config(), verbose=False)


def test_heldout_measures_come_from_ir_measures_and_equal_the_formula():
    """nDCG@10 (the teacher's rank r has gain 10 - r) and RR of the source document, by ir_measures, equal the
    formula written out (as domain.py computed them by hand), with the student's order kept for ties."""
    import math

    from pyterrier_lsr.train.domain import rank_measures
    teacher = [[f'd{i}' for i in range(10)], [f'e{i}' for i in range(10)]]
    rankings = [['d3', 'x', 'd0', 'd1', 'd9'], ['y', 'z', 'e0', 'e9', 'e8']]  # the 2nd ends in docno order reversed
    ideal = sum((10 - r) / math.log2(r + 2) for r in range(10))

    def ndcg(ranking, ranked):
        gain = {d: 10 - r for r, d in enumerate(ranked)}
        return sum(gain.get(d, 0) / math.log2(r + 2) for r, d in enumerate(ranking[:10])) / ideal
    got = rank_measures(rankings, teacher, ['d1', 'w'])
    assert got['ndcg'] == pytest.approx((ndcg(rankings[0], teacher[0]) + ndcg(rankings[1], teacher[1])) / 2,
                                        abs=1e-12)
    assert got['mrr'] == pytest.approx((1 / 4 + 0) / 2)  # d1 at rank 4; w never ranked


def test_from_qrels_by_hand():
    import pyterrier as pt
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['a', 'b']})
    qrels = pd.DataFrame({'qid': ['1', '1', '1', '2'], 'docno': ['x', 'y', 'n1', 'z'], 'label': [1, 2, 0, 1]})
    texts = {d: f'text {d}' for d in ['x', 'y', 'z', 'n1', 'n2', 'n3']}
    run = pd.DataFrame({'qid': ['1'] * 4 + ['2'], 'docno': ['x', 'n1', 'n2', 'y', 'n3'], 'score': [4., 3, 2, 1, 1]})
    retriever = pt.Transformer.from_df(run)
    out = from_qrels(topics, qrels, texts, retriever, num_negatives=2, depth=3)
    # topic 1: relevant x and y; non-relevant pool in its top 3 = n1, n2. Topic 2: one candidate only -> skipped
    assert sorted(ex.positive for ex in out) == ['text x', 'text y']
    assert all(sorted(ex.negatives) == ['text n1', 'text n2'] and ex.query == 'a' for ex in out)
    assert all(isinstance(ex, Example) for ex in out)


def test_cli_domain_adapt_on_a_folder(corpus, tmp_path, capsys):
    from pyterrier_lsr.cli import main
    folder = tmp_path / 'coll'
    folder.mkdir()
    (folder / 'docs.jsonl').write_text(''.join(json.dumps(d) + '\n' for d in corpus))
    (folder / 'topics.tsv').write_text('1\treactor\n')
    (folder / 'qrels.txt').write_text('1 0 d1 1\n')
    from pyterrier_lsr import Splade, SpladeIndexer
    from pyterrier_lsr.core.names import resolve_model
    index = SpladeIndexer(str(tmp_path / 'start.lsr'), Splade.from_pretrained(resolve_model('splade-tiny')),
                          verbose=False).index(corpus)
    main(['domain-adapt', '--model', 'splade-tiny', '--collection', str(folder), '--output-dir', str(tmp_path / 'out'),
          '--set', 'steps=2', 'batch_size=4', 'eval_every=1', 'heldout=5', 'pool=10', 'negatives=7',
          'teachers=bm25', '--documents', str(index.path)])
    out = capsys.readouterr().out
    assert out.count('held-out pseudo-queries') == 1 and '"decision"' not in out, out  # the decision, once
    log = json.loads((tmp_path / 'out' / 'domain_adapt.json').read_text())
    assert [row['step'] for row in log['curve']] == [0, 1, 2] and log['config']['teachers'] == ['bm25']
    assert log['config']['side'] == 'query'  # the default recipe
    assert log['documents_from'] == str(index.path)  # the documents' vectors were read from the index
    assert (tmp_path / 'out' / 'model' / 'config.json').exists()
    # any saved model of the project starts a run, e.g. a second stage from the first one's model folder
    from pyterrier_lsr import load_model
    main(['domain-adapt', '--model', str(tmp_path / 'out' / 'model'), '--collection', str(folder), '--output-dir',
          str(tmp_path / 'again'), '--cache-dir', str(tmp_path / 'out' / 'cache'), '--set', 'steps=2', 'batch_size=4',
          'eval_every=1', 'heldout=5', 'pool=10', 'negatives=7', 'teachers=bm25', '--documents', str(index.path)])
    again = json.loads((tmp_path / 'again' / 'domain_adapt.json').read_text())
    selected = log['start_score'] if log['guard'] else log['best_score']
    assert again['cache_hit'] and again['start_score'] == pytest.approx(selected)
    assert type(load_model(tmp_path / 'again' / 'model')) is type(load_model(tmp_path / 'out' / 'model'))


def test_vt_splade_warmup_trains_only_the_added_words_first(tiny, corpus, tmp_path, monkeypatch):
    import shutil

    from pyterrier_lsr import Splade, load_model
    from pyterrier_lsr.models.vocab_transfer import transfer_vocabulary
    from pyterrier_lsr.models.vocabularies import extend_vocabulary
    from pyterrier_lsr.systems import vt_splade
    model, tokenizer = tiny
    corpus = [{**d, 'text': d['text'] + ' Plasma spectra of a magnetron.'} for d in corpus]  # 3 words to add
    base = tmp_path / 'base'
    Splade(model, tokenizer).save_pretrained(str(base))
    with pytest.raises(ValueError, match='nothing to add'):
        vt_splade(corpus[:1], tmp_path / 'none', base=str(base))
    scores = iter([0.1, 0.2, 0.3] * 2)  # warm-up, then the full run: each selects its last step
    monkeypatch.setattr(driver, 'heldout_scores',
                        lambda *args, **kwargs: dict.fromkeys(SELECT_ON, next(scores)))
    config, warmup = _config(steps=2, eval_every=1), _config(steps=2, eval_every=1, lr=0.1)
    vt = vt_splade(corpus, tmp_path / 'vt', config, str(base), extend=3, warmup=warmup, cache_dir=tmp_path / 'cache')
    assert json.loads((tmp_path / 'vt' / 'warmup' / 'domain_adapt.json').read_text())['selected_step'] == 2
    warm = dict(load_model(tmp_path / 'vt' / 'warmup' / 'model').model.mlm.named_parameters())
    composed = dict(transfer_vocabulary(model, tokenizer, extend_vocabulary(
        tokenizer, [d['text'] for d in corpus], 3)[0])[0].mlm.named_parameters())
    first, start = model.vocab_size, dict(model.mlm.named_parameters())
    rows = ('bert.embeddings.word_embeddings.weight', 'cls.predictions.bias')
    for name, p in warm.items():
        if name in rows:
            assert len(p) == first + 3 and torch.equal(p[:first], composed[name][:first]), name  # bit for bit
            assert not torch.allclose(p[first:], composed[name][first:]), name  # the added words trained
        else:
            assert torch.equal(p, start[name]), name  # the rest of the network frozen
    assert set(rows) <= set(warm)
    # then the whole model trains
    name = 'bert.encoder.layer.0.output.dense.weight'
    assert not torch.equal(dict(vt.model.mlm.named_parameters())[name], start[name])
    # a finished model is not reused with or without a warm-up it was not trained with
    with pytest.raises(ValueError, match='with an embedding warm-up'):
        vt_splade(corpus, tmp_path / 'vt', config, str(base), extend=3)
    assert vt_splade(corpus, tmp_path / 'vt', config, str(base), extend=3, warmup=warmup).encode(['x']) == \
        vt.encode(['x'])
    with pytest.raises(ValueError, match=r'other settings \(extend\)'):  # the builder's own settings count too
        vt_splade(corpus, tmp_path / 'vt', config, str(base), extend=2, warmup=warmup)
    # a finished warm-up with other settings is refused before any work
    shutil.copytree(tmp_path / 'vt' / 'warmup', tmp_path / 'vt2' / 'warmup')
    with pytest.raises(ValueError, match=r'other settings \(lr\)'):
        vt_splade(corpus, tmp_path / 'vt2', config, str(base), extend=3, warmup=_config(steps=2, eval_every=1))


def test_query_side_adapts_an_sae_splade_and_keeps_its_kind(tiny, corpus, tmp_path, monkeypatch):
    """An SAE-SPLADE model's queries adapt against its indexed documents: the result holds two SAE-SPLADE models,
    saves and reloads as such, and an index of the starting model serves its adapted queries."""
    from pyterrier_lsr import AsymmetricSplade, SaeSplade, SpladeIndexer, load_model
    from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
    from pyterrier_lsr.models.sae_splade import SaeSpladeModel, structural_token_ids
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    sae = SparseAutoencoder(SAEConfig(d_in=32, n_latents=64, k=4, seed=1))
    start = SaeSplade(SaeSpladeModel(mlm.bert, sae, structural_token_ids(tokenizer)), tokenizer, device='cpu')
    index = SpladeIndexer(str(tmp_path / 'sae.lsr'), start, verbose=False).index(corpus)
    calls = _prefer_last_step(monkeypatch)
    out, log = domain_adapt(start, corpus, tmp_path / 'run', _config(side='query', negatives=7, candidates='teacher'),
                            tmp_path / 'cache', verbose=False, documents=index)
    assert log['selected_step'] == 4 and calls[0]['heldout_ndcg'] != calls[-1]['heldout_ndcg']
    assert not log['guard'] and isinstance(out, AsymmetricSplade) and out.sides is SaeSplade
    assert isinstance(out.query_splade, SaeSplade) and out.model is start.model
    reloaded = load_model(tmp_path / 'run' / 'model')
    assert isinstance(reloaded, AsymmetricSplade) and reloaded.sides is SaeSplade
    queries = pd.DataFrame({'qid': ['1'], 'query': ['radio wave noise']})
    adapted = out.query_encoder()(queries)['query_toks'][0]
    assert adapted and all(t.startswith('l') for t in adapted)
    assert adapted != pytest.approx(start.query_encoder()(queries)['query_toks'][0])
    assert reloaded.query_encoder()(queries)['query_toks'][0] == pytest.approx(adapted)
    texts = [d['text'] for d in corpus[:3]]
    _same_vectors(reloaded.encode(texts), start.encode(texts))
    ranked = index.retriever(query_encoder=reloaded.query_encoder())(queries)
    assert len(ranked) and not ranked.equals(index.retriever()(queries))


def test_experiment_evaluator_retrieves_from_a_given_index(tiny, corpus, tmp_path):
    """``index=`` scores each step's queries against that index instead of indexing the corpus again."""
    from pyterrier_lsr import SpladeIndexer
    from pyterrier_lsr.train import experiment_evaluator
    splade = _splade(tiny)
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['radio wave noise', 'nuclear reactor physics']})
    qrels = pd.DataFrame([{'qid': q, 'docno': f'd{i}', 'label': 1} for q in '12' for i in range(30, 60)])
    full = SpladeIndexer(str(tmp_path / 'full.lsr'), splade, verbose=False).index(corpus)
    part = SpladeIndexer(str(tmp_path / 'part.lsr'), splade, verbose=False).index(corpus[:30])
    indexed = experiment_evaluator(splade.tokenizer, corpus, topics, qrels, doc_model=splade.model)(splade.model)
    assert experiment_evaluator(splade.tokenizer, corpus, topics, qrels, index=full)(splade.model) == indexed
    assert indexed['nDCG@10'] > 0
    assert experiment_evaluator(splade.tokenizer, corpus, topics, qrels, index=part)(splade.model)['nDCG@10'] == 0


@pytest.mark.parametrize('docnos, error, match', [
    ([1, '1'], TypeError, 'docnos must be strings'),  # str() made them one document
    (['a', 'a'], ValueError, "'a' occurs twice"),
    (['a', None], ValueError, 'missing'),
])
def test_domain_adapt_checks_docnos_before_any_work(splade, tmp_path, docnos, error, match):
    corpus = [{'docno': d, 'text': 'nuclear reactor physics'} for d in docnos]
    with pytest.raises(error, match=match):
        domain_adapt(splade, corpus, tmp_path / 'out', verbose=False)
    assert not (tmp_path / 'out').exists()


def test_domain_adapt_refuses_a_max_length_past_the_tokenizers_when_made(tiny, corpus, tmp_path):
    splade = _splade(tiny)
    splade.tokenizer.model_max_length = 64
    with pytest.raises(ValueError, match=re.escape('max_length must be >= 3 and <= 64, got 96')):
        domain_adapt(splade, corpus, tmp_path / 'out', DomainConfig(), verbose=False)
    assert not (tmp_path / 'out').exists()


def test_domain_adapt_refuses_a_user_model_folder_before_any_work(splade, tmp_path):
    from pyterrier_lsr.core import storage
    (tmp_path / 'out' / 'model').mkdir(parents=True)
    storage.mark(tmp_path / 'out', driver.OUTPUT_KIND)  # an earlier run's folder, where the user put a model/
    (tmp_path / 'out' / 'model' / 'mine.txt').write_text('mine')
    corpus = [{'docno': f'd{i}', 'text': 'nuclear reactor physics'} for i in range(3)]
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr model folder'):
        domain_adapt(splade, corpus, tmp_path / 'out', verbose=False)
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['.lsr-artifact.json', 'model']  # nothing built


@pytest.mark.parametrize('where', ['output', 'cache'])
def test_domain_adapt_refuses_a_user_folder_as_output_or_cache_and_touches_none_of_it(splade, tmp_path, where):
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    (mine / 'domain_adapt.json').write_text('mine too')  # the run's log would have replaced it
    output, cache_dir = (mine, None) if where == 'output' else (tmp_path / 'out', mine)
    corpus = [{'docno': f'd{i}', 'text': 'nuclear reactor physics'} for i in range(3)]
    what = 'folder' if where == 'output' else 'cache folder'
    with pytest.raises(FileExistsError, match=re.escape(f'{mine} is not a pyterrier-lsr domain-adaptation {what}')):
        domain_adapt(splade, corpus, output, cache_dir=cache_dir, verbose=False)
    assert {p.name: p.read_text() for p in mine.iterdir()} == {'notes.txt': 'mine', 'domain_adapt.json': 'mine too'}



def test_the_builders_write_their_settings_into_a_folder_of_ours_only(corpus, tmp_path):
    from pyterrier_lsr.systems import adapted
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')  # system.json was written beside it, then the run trained into it

    def start():
        raise AssertionError('the model was built although the folder is refused')
    with pytest.raises(FileExistsError, match='is not a pyterrier-lsr domain-adaptation folder'):
        adapted(start, corpus, mine, _config(), system={'method': 'mine'})
    assert {p.name: p.read_text() for p in mine.iterdir()} == {'notes.txt': 'mine'}
