"""LsrIndex.tune: the cheapest setting reaching the target is recorded, reused by retriever() in a new process, never
for another query encoder, and an explicit engine wins (200 Vaswani documents, the offline SPLADE-tiny)."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from pyterrier_lsr import IDFQueryEncoder, LsrIndex, SpladeIndexer
from pyterrier_lsr.cli import main
from pyterrier_lsr.index import tuning
from pyterrier_lsr.stages.pruning import Prune

# query_cut=1 keeps a query's single heaviest term: far below R@10 0.99 against the exact ranking; query_cut=50 with
# heap_factor 0.5 keeps every term of these queries and skips almost nothing.
LOSSY, FULL = {'query_cut': 1, 'heap_factor': 1.}, {'query_cut': 50, 'heap_factor': 0.5}


@pytest.fixture(scope='module')
def index(splade, vaswani_docs, tmp_path_factory):
    return SpladeIndexer(tmp_path_factory.mktemp('tune') / 't.lsr', splade, verbose=False,
                         engines=('pisa', 'bmp', 'seismic')).index(vaswani_docs[:200])


@pytest.fixture(scope='module')
def topics(vaswani):
    return vaswani.get_topics().head(30)


def engine_of(retriever):
    toks = retriever.toks_retriever
    return toks.engine, toks.params


def test_picks_the_cheapest_setting_reaching_the_target(index, topics, monkeypatch, capsys):
    costs = {('seismic', 1): 0.1, ('seismic', 50): 0.5, ('pisa', None): 0.3}
    real = tuning._cost

    def fixed_cost(retriever, frame, repeats, one_a_call):  # the engines' real results, costs fixed: no clock asserted
        _, results = real(retriever, frame, repeats, one_a_call)
        toks = retriever
        return costs[(toks.engine, toks.params.get('query_cut'))], results

    monkeypatch.setattr(tuning, '_cost', fixed_cost)
    grids = {'seismic': [LOSSY, FULL], 'pisa': [{}]}
    record = index.tune(topics, engines=['seismic', 'pisa'], grids=grids)
    rows = {(r['engine'], r['settings'].get('query_cut')): r for r in record['rows']}
    assert rows[('seismic', 1)]['recall'] < 0.99 <= rows[('seismic', 50)]['recall']
    assert rows[('pisa', None)]['recall'] == 1.
    assert (record['engine'], record['settings']) == ('pisa', {})  # 0.1 ms misses the target; 0.3 < 0.5
    printed = capsys.readouterr().out
    assert 'Pareto front' in printed and '<- chosen' in printed
    assert [(r['engine'], r['cpu_ms']) for r in record['front']] == [('seismic', 0.1), ('pisa', 0.3)]
    costs[('pisa', None)] = 0.9
    record = index.tune(topics, engines=['seismic', 'pisa'], grids=grids, verbose=False)
    assert (record['engine'], record['settings']) == ('seismic', FULL)
    assert capsys.readouterr().out == ''
    saved = json.loads((index.path / tuning.TUNING_FILE).read_text())['tunings'][record['query_encoder']['identity']]
    assert saved['queries']['count'] == len(topics) and len(saved['queries']['digest']) == 64
    assert saved['cpu'] and saved['date'] and saved['build'] == index.build_id() and saved['one_a_call'] is False
    monkeypatch.setattr(tuning, '_cost', real)
    one = index.tune(topics.head(5), engines=['seismic'], grids={'seismic': [FULL]}, one_a_call=True, verbose=False)
    assert one['one_a_call'] is True and one['cpu_ms'] > 0 and one['recall'] >= 0.99
    assert engine_of(index.retriever(10)) == ('seismic', FULL)


def test_choice_survives_a_new_process_and_explicit_engine_wins(index, topics):
    index.tune(topics, engines=['seismic'], grids={'seismic': [LOSSY, FULL]}, verbose=False)
    code = ('import json, sys; from pyterrier_lsr import LsrIndex; '
            'r = LsrIndex(sys.argv[1]).retriever(10); t = r.toks_retriever; '
            'print(json.dumps([t.engine, t.params, repr(r)]))')
    out = subprocess.run([sys.executable, '-c', code, str(index.path)], capture_output=True, text=True, check=True)
    engine, params, label = json.loads(out.stdout.strip().splitlines()[-1])
    assert (engine, params) == ('seismic', FULL) and label.endswith('SEISMIC')
    reopened = LsrIndex(index.path)
    assert engine_of(reopened.retriever(10)) == ('seismic', FULL)
    assert engine_of(reopened.retriever(10, engine='pisa')) == ('pisa', {})
    assert engine_of(reopened.retriever(10, engine='seismic')) == ('seismic', {})  # explicit: its own defaults
    assert engine_of(reopened.retriever(10, query_algorithm='maxscore')) == ('pisa', {'query_algorithm': 'maxscore'})
    # % k keeps the tuned engine and settings
    fused = (reopened.retriever(100) % 5).compile().toks_retriever
    assert (fused.engine, fused.params, fused.num_results) == ('seismic', FULL, 5)


def test_another_query_encoder_does_not_reuse_the_record(index, topics, splade):
    index.tune(topics, engines=['seismic'], grids={'seismic': [FULL]}, verbose=False)
    idf = IDFQueryEncoder.from_index(index)
    assert engine_of(index.retriever(10, query_encoder=idf))[0] == 'pisa'
    pruned = splade.query_encoder() >> Prune(top_n=5)
    assert engine_of(index.retriever(10, query_encoder=pruned))[0] == 'pisa'
    assert engine_of(index.retriever(10))[0] == 'seismic'  # the model's own record still holds
    assert tuning.encoder_identity(idf) == tuning.encoder_identity(IDFQueryEncoder.from_index(LsrIndex(index.path)))
    assert tuning.encoder_identity(pruned) != tuning.encoder_identity(splade.query_encoder() >> Prune(top_n=6))
    record = index.tune(topics, engines=['bmp'], grids={'bmp': [{'alpha': 1., 'beta': 1.}]}, query_encoder=idf,
                        verbose=False)
    assert record['engine'] == 'bmp'
    assert engine_of(index.retriever(10, query_encoder=idf))[0] == 'bmp'
    assert engine_of(index.retriever(10))[0] == 'seismic'


def test_rebuilt_engine_drops_the_record_and_bad_arguments_are_named(index, topics, tmp_path):
    with pytest.raises(ValueError, match='target_recall'):
        index.tune(topics, target_recall=1.5)
    with pytest.raises(ValueError, match="no 'nope' engine"):
        index.tune(topics, engines=['nope'])
    with pytest.raises(ValueError, match='no setting reached'):
        index.tune(topics, engines=['seismic'], grids={'seismic': [LOSSY]}, verbose=False)
    (tmp_path / 'topics.tsv').write_text(''.join(f'{q}\t{" ".join(t.split())}\n'
                                                 for q, t in zip(topics['qid'], topics['query'])))
    main(['tune', str(index.path), '--topics', str(tmp_path / 'topics.tsv'), '--engines', 'seismic', '--quiet'])
    assert engine_of(index.retriever(10))[0] == 'seismic'
    index.build_engine('seismic', overwrite=True, n_postings=100)
    assert tuning.recorded(index) is None and engine_of(index.retriever(10))[0] == 'pisa'


def test_the_index_as_a_retriever_follows_a_new_tuning_and_a_rebuild(index, topics, splade, vaswani_docs, tmp_path):
    queries = topics.head(5)[['qid', 'query']]
    default = index % 10  # made once, reused call after call while the index and its tunings stay as they are
    index.tune(topics, engines=['pisa'], grids={'pisa': [{}]}, verbose=False)
    pd.testing.assert_frame_equal(default(queries), index.retriever(10, engine='pisa')(queries))
    index.tune(topics, 0.01, engines=['seismic'], grids={'seismic': [LOSSY]}, verbose=False)
    lossy = index.retriever(10, engine='seismic', **LOSSY)(queries)
    assert not lossy.equals(index.retriever(10, engine='pisa')(queries))
    pd.testing.assert_frame_equal(default(queries), lossy)
    small = SpladeIndexer(tmp_path / 's.lsr', splade, verbose=False).index(vaswani_docs[:20])
    default = small % 3
    assert set(default(queries)['docno']) <= {d['docno'] for d in vaswani_docs[:20]}
    SpladeIndexer(tmp_path / 's.lsr', splade, verbose=False, overwrite=True).index(vaswani_docs[20:40])
    assert set(default(queries)['docno']) <= {d['docno'] for d in vaswani_docs[20:40]}
