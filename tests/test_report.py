"""The report CLI for coursework: subsets, every model kind and engine, index reuse keyed on the model, the latency
split and the plot."""
import time

import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_lsr import LsrIndex, SpladeIndexer
from pyterrier_lsr.core.collection import corpus_key
from pyterrier_lsr.report import ConfigError, System, figure, load_config, place_labels, query_times, report, run_config
from pyterrier_lsr.report.builder import _SystemBuilder
from pyterrier_lsr.report.plot import label_size

# Of the first 40 Vaswani documents, only topics 51, 55 and 62 have relevant ones.
SUBSET = ('dataset: irds:vaswani\ndocs: 40\ntopics: [51, 55, 62, 1]\npasses: 1\noutput: out\nworkdir: idx\n'
          'measures: [nDCG@10, AP]\n')


def _count_encoded(monkeypatch) -> list:
    """Counts documents encoded from text by any index build (documents given as toks are not encoded)."""
    encoded = []
    original = LsrIndex._encoded

    def counting(self, docs):
        for doc in docs:
            encoded.extend([doc['docno']] if 'toks' not in doc else [])
            yield from original(self, [doc])

    monkeypatch.setattr(LsrIndex, '_encoded', counting)
    return encoded


def test_subset_run_then_rerun_encodes_nothing(tmp_path, monkeypatch, vaswani_docs):
    (tmp_path / 'c.yaml').write_text(SUBSET + """systems:
  - {name: BM25, type: bm25}
  - {name: SPLADE, model: splade-tiny}
  - {name: pruned, model: splade-tiny, levels: [{doc_pruning: {top_n: 8}}, {query_pruning: {top_n: 3}}]}
  - {name: IDF, type: idf_queries, model: splade-tiny}
""")
    encoded = _count_encoded(monkeypatch)
    first = run_config(tmp_path / 'c.yaml')
    # one encoding of the first 40 documents serves all three systems of the model and the pruned index
    assert sorted(encoded) == sorted(d['docno'] for d in vaswani_docs[:40])
    assert list(first['name']) == ['BM25', 'SPLADE', 'pruned @ d:top_n=8', 'pruned @ q:top_n=3', 'IDF']
    built = sorted(p.name for p in (tmp_path / 'idx').iterdir() if not p.name.startswith('.'))
    # named by the documents they hold: the first 40, and the corpus key of those 40
    key = corpus_key({d['docno']: d['text'] for d in vaswani_docs[:40]})
    assert built[0] == f'bm25.first40-{key}.pisa' and all(f'.first40-{key}.' in name for name in built)
    assert len(built) == 3 and LsrIndex(tmp_path / 'idx' / built[1]).num_docs() == 40
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / 'idx').rglob('*')}

    encoded.clear()
    monkeypatch.setattr(LsrIndex, 'index', lambda *a: pytest.fail('an index was rebuilt'))
    second = run_config(tmp_path / 'c.yaml')
    assert encoded == [] and {p: p.stat().st_mtime_ns for p in (tmp_path / 'idx').rglob('*')} == stamps
    assert second[['nDCG@10', 'AP', 'postings_per_query']].equals(first[['nDCG@10', 'AP', 'postings_per_query']])
    assert first['doc_nnz'][2] <= 8 < first['doc_nnz'][1] and first['query_nnz'][3] == 3
    notes = (tmp_path / 'out' / 'report.md').read_text()
    assert 'the first 40 documents; 4 topics, 3 of them with a relevant document' in notes


def test_index_names_key_on_model_content_and_docs(splade, tmp_path):
    folder = tmp_path / 'm'
    splade.save_pretrained(folder)
    builder = _SystemBuilder(None, tmp_path, 10, docs=100)
    key = builder.model_key(str(folder))
    assert key.startswith('m-') and builder.docs_tag == 'first100'
    assert _SystemBuilder(None, tmp_path, 10).docs_tag == 'all'
    splade.save_pretrained(folder)  # the same weights again: the same identity
    assert _SystemBuilder(None, tmp_path, 10).model_key(str(folder)) == key
    changed = type(splade).from_pretrained(str(folder))
    with __import__('torch').no_grad():
        next(changed.model.parameters()).mul_(1.01)
    changed.save_pretrained(folder)  # retrained in place: a new identity, so the old index is never reused
    assert _SystemBuilder(None, tmp_path, 10).model_key(str(folder)) != key


def test_every_model_kind_and_engine(tiny, tmp_path, vaswani_docs):
    from pyterrier_lsr import SaeSplade
    from pyterrier_lsr.kinds.latent_terms import LatentTerms
    from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
    from pyterrier_lsr.models.sae_splade import SaeSpladeModel, structural_token_ids

    sae = SparseAutoencoder(SAEConfig(d_in=384, n_latents=256, k=8, seed=1))
    LatentTerms('all-MiniLM-L6-v2', sae, mode='single', batch_size=8).save_pretrained(tmp_path / 'models' / 'lt')
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    sae_splade = SaeSplade(SaeSpladeModel(mlm.bert, SparseAutoencoder(SAEConfig(d_in=32, n_latents=64, k=4, seed=1)),
                                          structural_token_ids(tokenizer)), tokenizer, batch_size=8,
                           max_length=128)
    given = SpladeIndexer(tmp_path / 'given.lsr', sae_splade, verbose=False).index(vaswani_docs[:40])
    given_meta = (given.path / 'lsr.json').read_bytes()
    (tmp_path / 'c.yaml').write_text(SUBSET + """systems:
  - {name: LT, model: models/lt}
  - {name: SAE-SPLADE, index: given.lsr, levels: [{}, {doc_pruning: {top_n: 2}}]}
  - {name: BMP, model: splade-tiny, engine: bmp, engine_params: {alpha: 0.5}}
  - {name: Seismic, model: splade-tiny, engine: seismic, levels: [{engine_params: {query_cut: 2}}, {}]}
""")
    table = run_config(tmp_path / 'c.yaml')
    assert list(table['name']) == ['LT', 'SAE-SPLADE', 'SAE-SPLADE @ d:top_n=2', 'BMP @ e:alpha=0.5',
                                   'Seismic @ e:query_cut=2', 'Seismic']
    assert list(table['engine']) == ['pisa', 'pisa', 'pisa', 'bmp', 'seismic', 'seismic']
    assert table[['nDCG@10', 'retrieve_ms_median', 'postings_per_query']].notna().all().all()
    assert (table['postings_per_query'] > 0).all() and table['query_nnz'][4] == table['query_nnz'][5]
    lt = [p for p in (tmp_path / 'idx').iterdir() if p.name.startswith('lt-')]
    assert len(lt) == 1 and LsrIndex(lt[0]).scoring['kind'] == 'bm25'  # Latent Terms' own scoring
    assert (given.path / 'lsr.json').read_bytes() == given_meta  # a given index is read, never written

    (tmp_path / 'c.yaml').write_text(SUBSET + 'systems: [{name: x, index: given.lsr, engine: bmp}]\n')
    with pytest.raises(ConfigError, match=r'systems\[0\].engine: .*has no bmp engine'):
        run_config(tmp_path / 'c.yaml')
    SpladeIndexer(tmp_path / 'bare.lsr', verbose=False).index([{'docno': 'a', 'toks': {'x': 1.0}}])
    (tmp_path / 'c.yaml').write_text(SUBSET + 'systems: [{name: x, index: bare.lsr}]\n')
    with pytest.raises(ConfigError, match=r'systems\[0\].index: .*records no model'):
        run_config(tmp_path / 'c.yaml')
    (tmp_path / 'c.yaml').write_text(SUBSET + 'systems: [{name: x, type: idf_queries, model: models/lt}]\n')
    with pytest.raises(ConfigError, match=r'systems\[0\].type: idf_queries needs'):
        run_config(tmp_path / 'c.yaml')


class _Stalling(pt.Transformer):
    """Takes ``stall`` seconds on the listed calls (counted from 0, the warm-up included), no time otherwise."""

    def __init__(self, stall_calls, stall=0.05):
        self.calls, self.stall_calls, self.stall = 0, set(stall_calls), stall

    def transform(self, inp):
        if self.calls in self.stall_calls:
            time.sleep(self.stall)
        self.calls += 1
        return inp


def test_query_times_take_the_median_over_passes():
    topics = pd.DataFrame({'qid': ['1', '2', '3'], 'query': ['a', 'b', 'c']})
    # calls: warm-up, then passes of 3 queries; query 1 stalls in the second pass only, query 3 in every pass
    times = query_times(_Stalling({4, 3, 6, 9}), topics, passes=3)
    assert times[0] < 25 and times[1] < 25 and times[2] >= 50
    assert query_times(_Stalling({2}), topics, passes=1)[1] >= 50
    with pytest.raises(ValueError, match='passes'):
        query_times(_Stalling(()), topics, passes=0)


def test_latency_is_split_into_encoding_and_retrieval(splade, vaswani_docs, tmp_path):
    from pyterrier.measures import nDCG

    from pyterrier_lsr.stages.query import IDFQueryEncoder

    index = SpladeIndexer(tmp_path / 'idx.lsr', splade, verbose=False).index(vaswani_docs[:60])
    topics = pd.DataFrame({'qid': ['1', '2', '3'], 'query': ['electron density', 'dielectric constant', 'radio wave']})
    qrels = pd.DataFrame({'qid': ['1'], 'docno': [vaswani_docs[0]['docno']], 'label': [1]})
    encoder = _Stalling(set(range(1, 40)), stall=0.03)  # 30 ms per encoding call after the warm-up
    systems = [
        System('SPLADE', index.toks_retriever(), str(index.path), encoder >> splade.query_encoder(), engine='pisa'),
        System('IDF', index.toks_retriever(), str(index.path), IDFQueryEncoder.from_index(index), engine='pisa'),
    ]
    table = report(systems, topics, qrels, [nDCG @ 10], tmp_path / 'out', x='retrieve_ms_median', passes=2)
    assert table['encode_ms_median'][0] >= 30 > table['encode_ms_median'][1]
    assert table['retrieve_ms_median'][0] < table['encode_ms_median'][0]  # the encoder's time is not in retrieval
    assert (table['encode_ms_p95'] >= table['encode_ms_median']).all()
    assert (table['retrieve_ms_p95'] >= table['retrieve_ms_median']).all()
    assert 'index_mb' in table and table['index_mb'][0] * 2 ** 20 < sum(
        f.stat().st_size for f in index.path.rglob('*') if f.is_file())  # the model copy is not index size


def test_plot_numbers_never_overlap(tmp_path):
    table = pd.DataFrame({
        'name': ['BM25', 'SPLADE', 'SPLADE bmp', 'SPLADE @ d:top_n=8', 'SPLADE @ d:top_n=4', 'SPLADE seismic'],
        'nDCG@10': [0.36, 0.50, 0.50, 0.48, 0.47, 0.50001],
        'postings_per_query': [70, 740, 740, 120, 118, 740.1],
    })
    fig = figure(table, 'nDCG@10', 'postings_per_query')
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [f'{i}  {n}' for i, n in enumerate(table['name'], 1)]
    assert not legend.get_window_extent().overlaps(ax.get_window_extent())
    labels = {t.get_text(): t.get_window_extent() for t in ax.texts}
    assert set(labels) == {'1', '2,3,6', '4', '5'}
    boxes = list(labels.values())
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    marker_colours = [line.get_color() for line in ax.lines if line.get_marker() == 'o']
    assert marker_colours.count('grey') == 1  # 2, 3 and 6 belong to three groups


def _box(centre, offset, text):
    width, height = label_size(text, 1.0)
    x, y = centre[0] + offset[0], centre[1] + offset[1]
    return x - width / 2, y - height / 2, x + width / 2, y + height / 2


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_joined_labels_of_coinciding_points_go_beside_every_marker():
    # a PISA/BMP pair sharing one marker at (100, 100), a second shared marker just up-right of it where the first
    # label would go, and a single point to the left: no label may cover a marker or another label
    centres = [(100., 100.), (125., 125.), (75., 100.)]
    labels = ['2,3', '4,5,6', None]
    offsets = place_labels(centres, labels, diameter=14., points_to_pixels=1.)
    assert offsets[2] is None  # a single point's number sits in its marker
    boxes = [_box(c, o, t) for c, o, t in zip(centres, offsets, labels) if o is not None]
    markers = [(x - 7, y - 7, x + 7, y + 7) for x, y in centres]
    assert not any(_overlap(b, m) for b in boxes for m in markers)
    assert not _overlap(*boxes)


def test_joined_labels_stay_inside_the_axes_when_they_can():
    offsets = place_labels([(95., 95.)], ['1,2,3'], diameter=14., points_to_pixels=1., bounds=(0., 0., 100., 100.))
    box = _box((95., 95.), offsets[0], '1,2,3')  # a marker in the top-right corner: its label goes down-left
    assert box[0] >= 0 and box[1] >= 0 and box[2] <= 100 and box[3] <= 100


def test_many_coinciding_clusters_keep_apart():
    centres = [(100. + 16 * i, 100.) for i in range(5)]  # five shared markers in a row, just apart
    labels = [','.join(str(n) for n in range(3 * i + 1, 3 * i + 4)) for i in range(len(centres))]
    offsets = place_labels(centres, labels, diameter=14., points_to_pixels=1.)
    boxes = [_box(c, o, t) for c, o, t in zip(centres, offsets, labels)]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


@pytest.mark.parametrize('text,key', [
    ('docs: 0\n', 'docs'),
    ('passes: 0\n', 'passes'),
    ('topics: []\n', 'topics'),
    ('topics: [1, "1"]\n', 'topics'),
    ('topics: [[1]]\n', 'topics[0]'),
    ('topics: twenty\n', 'topics'),
    ('systems: [{name: s, model: splade-tiny, engine: lucene}]\n', 'systems[0].engine'),
    ('systems: [{name: s, model: splade-tiny, engine: seismic, engine_params: {alpha: 1}}]\n',
     'systems[0].engine_params.alpha'),
    ('systems: [{name: s, model: splade-tiny, levels: [{engine_params: {nprobe: 3}}]}]\n',
     'systems[0].levels[0].engine_params.nprobe'),
    ('systems: [{name: s, model: splade-tiny, index: i}]\n', 'systems[0]: model and index exclude each other'),
    ('systems: [{name: s}]\n', 'systems[0].model (or systems[0].index)'),
    ('systems: [{name: s, index: nowhere}]\n', 'systems[0].index'),
])
def test_new_keys_are_validated(tmp_path, text, key):
    base = 'dataset: irds:vaswani\noutput: out\n'
    if not text.startswith('systems'):
        text += 'systems: [{name: b, type: bm25}]\n'
    (tmp_path / 'c.yaml').write_text(base + text)
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / 'c.yaml')
    assert key in str(error.value) and '\n' not in str(error.value)


@pytest.mark.parametrize('key', ['output', 'workdir'])
def test_an_output_or_workdir_that_is_a_file_is_a_config_error(tmp_path, key):
    # refused when read, not by a mkdir after every system was indexed and measured
    (tmp_path / 'taken').write_text('mine')
    (tmp_path / 'c.yaml').write_text(f'dataset: irds:vaswani\noutput: out\n{key}: taken\n'
                                     'systems: [{name: b, type: bm25}]\n')
    with pytest.raises(ConfigError, match=f'config key {key}: .*taken is a file'):
        load_config(tmp_path / 'c.yaml')
    assert (tmp_path / 'taken').read_text() == 'mine'


def test_unknown_or_unjudged_topics_are_config_errors(tmp_path):
    (tmp_path / 'c.yaml').write_text('dataset: irds:vaswani\noutput: out\ntopics: [1, 99999]\n'
                                     'systems: [{name: b, type: bm25}]\n')
    with pytest.raises(ConfigError, match=r"qids \['99999'\]"):
        run_config(tmp_path / 'c.yaml')
    (tmp_path / 'c.yaml').write_text('dataset: irds:vaswani\noutput: out\ndocs: 40\ntopics: 4\n'
                                     'systems: [{name: b, type: bm25}]\n')
    with pytest.raises(ConfigError, match=r'none of the 4 topics .* first 40 documents.*topics: \[51, 55, 62\]'):
        run_config(tmp_path / 'c.yaml')
    assert not (tmp_path / 'indices').exists()  # found before anything is built


def test_explicit_topics_and_relative_model_paths(splade, tmp_path):
    splade.save_pretrained(tmp_path / 'sub' / 'my-model')
    (tmp_path / 'sub' / 'c.yaml').write_text(
        'dataset: irds:vaswani\noutput: out\ntopics: [3, "1"]\nsystems: [{name: s, model: my-model}]\n')
    config = load_config(tmp_path / 'sub' / 'c.yaml')
    assert config['systems'][0]['model'] == str(tmp_path / 'sub' / 'my-model')
    from pyterrier_lsr.report import select_topics

    topics = pd.DataFrame({'qid': ['1', '2', '3'], 'query': ['a', 'b', 'c']})
    assert list(select_topics(topics, config['topics'])['qid']) == ['3', '1']
    assert list(select_topics(topics, 2)['qid']) == ['1', '2']


def _user_folder(folder):
    folder.mkdir(parents=True)
    (folder / 'report.md').write_text('my own notes')
    return {'report.md': 'my own notes'}


def test_report_refuses_a_folder_it_did_not_make_before_any_work(tmp_path):
    from pyterrier.measures import nDCG
    mine = _user_folder(tmp_path / 'mine')
    never = System('s', pt.apply.generic(lambda frame: pytest.fail('retrieved although the folder is refused')), '')
    with pytest.raises(FileExistsError, match='is not a pyterrier-lsr report folder'):
        report([never], pd.DataFrame({'qid': ['1'], 'query': ['a']}), None, [nDCG @ 10], tmp_path / 'mine')
    assert {p.name: p.read_text() for p in (tmp_path / 'mine').iterdir()} == mine


def test_a_config_whose_output_is_a_user_folder_is_refused_when_read(tmp_path):
    mine = _user_folder(tmp_path / 'out')
    (tmp_path / 'c.yaml').write_text(SUBSET + 'systems: [{name: b, type: bm25}]\n')
    with pytest.raises(ConfigError, match=r'config key output: .*out is not a pyterrier-lsr report folder') as error:
        run_config(tmp_path / 'c.yaml')
    assert '\n' not in str(error.value)
    assert {p.name: p.read_text() for p in (tmp_path / 'out').iterdir()} == mine and not (tmp_path / 'idx').exists()
