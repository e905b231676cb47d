import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_lsr import Prune, SpladeIndexer
from pyterrier_lsr.report import ConfigError, System, load_config, posting_lengths, report
from pyterrier_lsr.stages.pruning import prune

V = {'a': 3.0, 'b': 2.0, 'c': 2.0, 'd': 0.5, 'z': 0.0}


def test_prune_rules_by_hand():
    assert prune(V, top_n=2) == {'a': 3.0, 'b': 2.0}  # tie b/c broken by term
    assert prune(V, top_n=3) == {'a': 3.0, 'b': 2.0, 'c': 2.0}
    assert prune(V, ratio=2 / 3) == {'a': 3.0, 'b': 2.0, 'c': 2.0}
    assert prune(V, ratio=1.0) == {'a': 3.0}
    assert prune(V, threshold=0.5) == {'a': 3.0, 'b': 2.0, 'c': 2.0, 'd': 0.5}
    assert prune(V, threshold=2.5, top_n=5) == {'a': 3.0}
    assert prune(V, top_n=0) == {}
    assert prune({}, top_n=3) == {} and prune({'x': 0.0, 'y': 0.0}, ratio=0.5) == {}


@pytest.mark.parametrize('rule', [{'top_n': 1}, {'top_n': 100}, {'ratio': 0.2}, {'threshold': 1.0}])
def test_pruning_never_adds_or_changes_terms(splade, texts, rule):
    for vec in splade.encode(texts[:10]):
        pruned = prune(vec, **rule)
        assert pruned.items() <= vec.items()


def test_prune_transformer(splade):
    docs = pd.DataFrame({'docno': ['1', '2'], 'text': ['nuclear reactor physics of the ionosphere', None]})
    out = (splade.doc_encoder() >> Prune(top_n=3))(docs)
    assert len(out['toks'][0]) == 3 and out['toks'][1] == {}
    queries = pd.DataFrame({'qid': ['1'], 'query': ['electron density'], 'toks': [{'x': 1.0}]})
    out = (splade.query_encoder() >> Prune(top_n=2, fields=['query_toks']))(queries)
    assert len(out['query_toks'][0]) == 2 and out['toks'][0] == {'x': 1.0}
    assert len(Prune(top_n=1)(pd.DataFrame(columns=['qid', 'query_toks']))) == 0
    with pytest.raises(pt.validate.InputValidationError, match='toks'):
        Prune(top_n=1)(pd.DataFrame({'docno': ['1']}))
    with pytest.raises(ValueError, match='at least one'):
        Prune()


def test_report_on_tiny_corpus(splade, vaswani_docs, tmp_path):
    index = SpladeIndexer(tmp_path / 'idx.lsr', splade, verbose=False).index(vaswani_docs[:150])
    df = posting_lengths(index.path)
    assert df == index.document_frequencies()
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['electron density', 'dielectric constant of liquids']})
    qrels = pd.DataFrame(
        {'qid': ['1', '2'], 'docno': [vaswani_docs[0]['docno'], vaswani_docs[1]['docno']], 'label': [1, 1]}
    )
    systems = [
        System('SPLADE', index.toks_retriever(), str(index.path), splade.query_encoder()),
        System(
            'SPLADE pruned',
            index.toks_retriever(),
            str(index.path),
            splade.query_encoder() >> Prune(top_n=2, fields=['query_toks']),
        ),
    ]
    from pyterrier.measures import AP, nDCG

    table = report(systems, topics, qrels, [nDCG @ 10, AP], tmp_path / 'out')
    from pyterrier_lsr.report.costs import COST_COLUMNS
    assert {'name', 'nDCG@10', *COST_COLUMNS} <= set(table.columns)
    assert table['query_nnz'][1] == 2 and table['query_nnz'][0] > 2
    assert table['postings_per_query'][1] < table['postings_per_query'][0]
    assert table['doc_nnz'][0] == pytest.approx(sum(df.values()) / 150)
    png = (tmp_path / 'out' / 'report.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 5000
    assert (tmp_path / 'out' / 'report.md').read_text().startswith('| name |')


@pytest.mark.parametrize(
    'text,key',
    [
        ('systems: []\noutput: x\n', 'dataset'),
        ('dataset: irds:vaswani\noutput: x\nsystems: [{name: a, type: splade}]\n', 'systems[0].model'),
        ('dataset: irds:vaswani\noutput: x\nsystems: [{name: a, type: dense}]\n', 'systems[0].type'),
        ('dataset: irds:vaswani\noutput: x\nsystems: [{name: a, type: bm25, colour: red}]\n', 'systems[0].colour'),
        (
            'dataset: irds:vaswani\noutput: x\nsystems: [{name: a, type: splade, model: m, doc_pruning: {top: 3}}]\n',
            'systems[0].doc_pruning.top',
        ),
        ('dataset: irds:vaswani\noutput: x\nsytems: []\n', 'sytems'),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, key):
    (tmp_path / 'c.yaml').write_text(text)
    with pytest.raises(ConfigError, match=key.replace('[', r'\[').replace(']', r'\]')):
        load_config(tmp_path / 'c.yaml')


@pytest.mark.parametrize('name', ['report_vaswani.yaml', 'report_assignment.yaml'])
def test_example_configs_are_valid(name):
    from pathlib import Path

    config = load_config(Path(__file__).parents[1] / 'examples' / name)
    assert len(config['systems']) >= 4
