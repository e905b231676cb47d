"""Failure modes at the package's edges, each with the behaviour it must have: no abort of the process (a corpus
without a term PISA keeps, a failed write under PISA), no silently wrong result (a store's model reloaded from a
replaced folder, resumed encodings keyed by the text's string form, a byte-order mark starting a later line, ties cut
differently at every k, judged documents missing from a subset's corpus, one corpus's index reused for another), clear
errors (huge qrels labels, ``% 0`` / ``% -1``, engine and batch settings, full disks, damaged or foreign model folders,
a BOM starting a JSONL corpus) and promises kept (``verbose=False`` and transformers' bars; BMP without scipy)."""
import json
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
import torch

from pyterrier_lsr import LsrIndex, MaxSimIndex, MultiVector, SpladeIndexer, SSRIndex, load_collection, load_model
from pyterrier_lsr.core.model_files import ModelLoadError
from pyterrier_lsr.index.engines import ENGINES
from pyterrier_lsr.kinds.ssr import SSR
from pyterrier_lsr.models.multivector import MultiVectorModel
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
from pyterrier_lsr.systems import bm25

TOPICS = pd.DataFrame({'qid': ['1', '2'], 'query': ['reactor physics', 'radio noise']})


def _encoder(tokenizer, seed=0):
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    backbone = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    model = MultiVectorModel(backbone, dim=8, skip_ids=[tokenizer.cls_token_id, tokenizer.sep_token_id])
    return MultiVector(model, tokenizer, device='cpu', batch_size=4)


# --- the abort -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('texts', [['日本語のテキスト', 'Ελληνικά κείμενα'], ['é à ü', '٣٤ ǅ Ｆｕｌｌ']])
def test_bm25_refuses_a_corpus_without_a_term_pisa_keeps_before_pisa_runs(texts, tmp_path):
    # letters and digits, but none that PISA's tokenizer keeps (ASCII runs only): PISA aborted the process
    corpus = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(texts)]
    with pytest.raises(ValueError, match="has a word PISA indexes: its BM25 tokenizer keeps runs of ASCII"):
        bm25(tmp_path / 'b.pisa', corpus, verbose=False)
    assert not (tmp_path / 'b.pisa').exists()
    # one document with an ASCII word is enough: the others are indexed as empty documents
    found = bm25(tmp_path / 'c.pisa', corpus + [{'docno': 'x', 'text': 'cat 東京'}], verbose=False)(
        pd.DataFrame({'qid': ['1'], 'query': ['cat']}))
    assert list(found['docno']) == ['x']


# --- silently wrong results ------------------------------------------------------------------------------------------

def test_a_maxsim_store_keeps_its_encoder_whatever_becomes_of_the_model_folder(tiny, tmp_path):
    _, tokenizer = tiny
    _encoder(tokenizer).save_pretrained(tmp_path / 'enc')
    encoder = MultiVector.from_pretrained(tmp_path / 'enc', device='cpu')
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(['the nuclear reactor physics', 'radio wave noise',
                                                                  'electron density', 'the cat sat on the dog'])]
    expected = MaxSimIndex(tmp_path / 's', encoder, verbose=False).indexer().index(docs).retriever()(TOPICS)
    shutil.rmtree(tmp_path / 'enc')
    _encoder(tokenizer, seed=1).save_pretrained(tmp_path / 'enc')  # other weights under the recorded name
    reopened = MaxSimIndex(tmp_path / 's')
    pd.testing.assert_frame_equal(reopened.retriever()(TOPICS), expected)  # queries encoded by the stored copy
    # an encoder of another dimension is refused, and weights edited inside the store are noticed
    other = MultiVector(MultiVectorModel(encoder.model.backbone, dim=4, skip_ids=[]), tokenizer, device='cpu')
    with pytest.raises(ValueError, match='vectors of 8 dimensions; the model given embeds in 4'):
        MaxSimIndex(tmp_path / 's', other).retriever()(TOPICS)
    weights = tmp_path / 's' / 'model' / 'model.safetensors'
    weights.write_bytes(weights.read_bytes()[:-8] + b'\0' * 8)
    with pytest.raises(ValueError, match='model/model.safetensors'):
        MaxSimIndex(tmp_path / 's').retriever()(TOPICS)
    # a store keeping no copy does not reload a folder by its name
    MaxSimIndex(tmp_path / 'bare', encoder, save_model=False, verbose=False).indexer().index(docs)
    with pytest.raises(ValueError, match='keeps no copy of its model'):
        MaxSimIndex(tmp_path / 'bare').retriever()(TOPICS)


@pytest.mark.parametrize('missing, text', [(None, 'None'), (float('nan'), 'nan')])
def test_a_resumed_encoding_tells_a_missing_text_from_its_name(missing, text, splade, tmp_path):
    from pyterrier_lsr import scaleout
    docs = [{'docno': 'a', 'text': 'radio waves'}, {'docno': 'b', 'text': missing}]
    scaleout.encode(docs, splade, tmp_path / 'v', num_workers=0, shard_size=8, verbose=False)
    docs[1]['text'] = text  # now a word: its shard must be encoded again
    store = scaleout.encode(docs, splade, tmp_path / 'v', num_workers=0, shard_size=8, verbose=False)
    assert dict(store)['b'] == splade.encode_docs(['radio waves', text])[1] != {}  # one chunk, as the shard's


def _collection(folder, topics: bytes, qrels: bytes):
    folder.mkdir()
    (folder / 'docs.jsonl').write_text('{"docno": "d1", "text": "x"}\n{"docno": "d2", "text": "y"}\n')
    (folder / 'topics.tsv').write_bytes(topics)
    (folder / 'qrels.txt').write_bytes(qrels)
    return folder


def test_a_byte_order_mark_starting_any_line_is_dropped(tmp_path):
    bom = '\ufeff'.encode()
    # two files joined end to end: each starts with its mark
    folder = _collection(tmp_path / 'c', bom + b'1\tradio\n' + bom + b'2\tnoise\n',
                         bom + b'1 0 d1 1\n' + bom + b'2 0 d2 1\n')
    collection = load_collection(str(folder))
    assert list(collection.topics['qid']) == ['1', '2'] and list(collection.qrels['qid']) == ['1', '2']
    lines = [b'{"docno": "d1", "text": "x"}\n', b'{"docno": "d2", "text": "y"}\n']
    (folder / 'docs.jsonl').write_bytes(bom + lines[0] + bom + lines[1])
    assert [d['docno'] for d in load_collection(str(folder)).corpus] == ['d1', 'd2']


def test_a_subset_counts_only_judged_documents_the_corpus_holds(tmp_path):
    folder = _collection(tmp_path / 'c', b'1\tradio\n', b'1 0 gone1 1\n1 0 gone2 1\n1 0 d2 1\n')
    small = load_collection(str(folder)).subset(docs=1)
    assert [d['docno'] for d in small.corpus] == ['d2']  # it was empty: two absent judged docnos took the place


TIED = [{'docno': f'd{i:02d}', 'toks': {'a': 1.0, 'b': 0.5 if i % 3 == 0 else 0.0}} for i in (7, 3, 11, 0, 5, 9, 1,
                                                                                           10, 2, 8, 6, 4)]


def _prefixes(retriever, queries, n):
    """The un-cut ranking, checked to follow the rule (score descending, then docno), and each cut-off against it."""
    full = retriever(queries)
    for _, ranking in full.groupby('qid', sort=False):
        keys = list(zip(-ranking['score'], ranking['docno']))
        assert keys == sorted(keys) and list(ranking['rank']) == list(range(len(ranking)))
    for k in range(1, n + 2):
        cut = (retriever % k).compile()(queries)
        pd.testing.assert_frame_equal(cut, full[full['rank'] < k].reset_index(drop=True), check_dtype=False)
    return full


@pytest.mark.parametrize('engine', sorted(ENGINES))
def test_ties_break_by_docno_at_every_cutoff_on_every_engine(engine, tmp_path):
    index = SpladeIndexer(tmp_path / 'x.lsr', engines=sorted(ENGINES), verbose=False).index(
        [{'docno': d['docno'], 'toks': {t: w for t, w in d['toks'].items() if w}} for d in TIED])
    queries = pd.DataFrame({'qid': ['q1', 'q2'], 'query_toks': [{'a': 1.0}, {'a': 1.0, 'b': 1.0}]})
    full = _prefixes(index.toks_retriever(engine=engine), queries, len(TIED))
    # every engine ranks alike: the rule, not the engine's internal order
    assert list(full['docno'][full['qid'] == 'q1']) == sorted(d['docno'] for d in TIED)
    pisa = index.toks_retriever(engine='pisa')(queries)
    assert list(full['docno']) == list(pisa['docno'])


@pytest.mark.parametrize('engine', sorted(ENGINES))
def test_the_result_frame_built_from_arrays_keeps_every_input_column_as_pandas_would(engine, tmp_path):
    index = SpladeIndexer(tmp_path / 'x.lsr', engines=sorted(ENGINES), verbose=False).index(
        [{'docno': d['docno'], 'toks': {t: w for t, w in d['toks'].items() if w}} for d in TIED])
    queries = pd.DataFrame({'qid': ['q1', 'q2', 'q3'], 'note': ['x', None, 'z'], 'n': [3, 1, 2],
                            'w': [0.5, np.nan, 1.5], 'query_toks': [{'a': 1.0}, {'zzz': 1.0}, {'b': 2.0}]})
    out = index.toks_retriever(4, engine=engine)(queries)
    expected = queries.drop(columns='query_toks').set_index('qid').loc[out['qid']].reset_index()
    pd.testing.assert_frame_equal(out[['qid', 'note', 'n', 'w']], expected)
    assert list(out.columns) == ['qid', 'note', 'n', 'w', 'docno', 'score', 'rank']
    assert out['docno'].dtype == pd.Series(['d'], dtype='str').dtype and set(out['qid']) == {'q1', 'q3'}
    assert list(out['rank']) == [0, 1, 2, 3] * 2


def test_verbose_pisa_retrievers_show_pyterrier_pisa_s_bar_and_rank_alike(tmp_path, capfd):
    from pyterrier_lsr.index.bm25 import BM25
    index = SpladeIndexer(tmp_path / 'x.lsr', verbose=False).index(
        [{'docno': d['docno'], 'toks': {t: w for t, w in d['toks'].items() if w}} for d in TIED])
    queries = pd.DataFrame({'qid': ['q1', 'q2'], 'query_toks': [{'a': 1.0}, {'a': 1.0, 'b': 1.0}]})
    corpus = [{'docno': f'd{i:02d}', 'text': 'alpha beta' if i % 2 else 'alpha'} for i in range(12)]
    text = bm25(tmp_path / 'b.pisa', corpus, verbose=False)
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['alpha', 'beta']})
    capfd.readouterr()
    for quiet, loud, inp in ((index.toks_retriever(5), index.toks_retriever(5, verbose=True), queries),
                             (text % 5, BM25(text.index, num_results=5, verbose=True), topics)):
        pd.testing.assert_frame_equal(loud(inp), quiet(inp))
        assert 'PISA' in capfd.readouterr().err


@pytest.mark.parametrize('k', [1, 3, 10, 40, 99, 200])
def test_the_tie_rule_holds_whatever_subset_of_ties_an_engine_keeps(k):
    from pyterrier_lsr.index.ranking import Hits, top_hits
    rng = np.random.default_rng(k)
    docnos = np.array([f'd{i}' for i in rng.permutation(150)], dtype=object)
    table = [rng.integers(0, levels, len(docnos)).astype(float) for levels in (3, 40, 1)]

    def search(rows, depth):  # an engine's best `depth`, ties kept in the worst order: docno descending
        queries, found, scores = [], [], []
        for place, query in enumerate(range(len(table)) if rows is None else rows):
            order = sorted(range(len(docnos)),
                           key=lambda i: (-table[query][i], [-ord(c) for c in docnos[i]]))[:depth]
            queries += [place] * len(order)
            found.append(docnos[order])
            scores.append(table[query][order])
        return Hits(np.array(queries), np.concatenate(found), np.concatenate(scores))
    hits, ranks = top_hits(search, k, len(docnos))
    for query in range(len(table)):
        mine = hits.queries == query
        expected = sorted(zip(-table[query], docnos))[:k]
        assert list(zip(-hits.scores[mine], hits.docnos[mine])) == expected
        assert list(ranks[mine]) == list(range(min(k, len(docnos))))
    assert list(dict.fromkeys(hits.queries)) == [0, 1, 2]


def test_ties_break_by_docno_in_bm25(tmp_path):
    order = [7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 6, 4]
    corpus = [{'docno': f'd{i:02d}', 'text': 'alpha beta'} for i in order] + \
        [{'docno': 'z', 'text': 'gamma delta'}]
    retriever = bm25(tmp_path / 'b.pisa', corpus, verbose=False)
    full = _prefixes(retriever, pd.DataFrame({'qid': ['1'], 'query': ['alpha']}), len(order))
    assert list(full['docno']) == sorted(f'd{i:02d}' for i in order)


@pytest.mark.parametrize('kind', ['maxsim', 'ssr'])
def test_ties_break_by_docno_in_the_token_stores(kind, tiny, tmp_path):
    _, tokenizer = tiny
    encoder = _encoder(tokenizer)
    docs = [{'docno': f'd{i:02d}', 'text': 'radio wave noise'} for i in (5, 2, 7, 0, 3)] + \
        [{'docno': 'x', 'text': 'the cat sat'}]
    if kind == 'maxsim':
        store = MaxSimIndex(tmp_path / 's', encoder, verbose=False).indexer().index(docs)
    else:
        ssr = SSR(encoder, SparseAutoencoder(SAEConfig(d_in=8, n_latents=32, k=4, seed=1)))
        store = SSRIndex(tmp_path / 's', ssr, verbose=False).indexer().index(docs)
    full = _prefixes(store.retriever(), pd.DataFrame({'qid': ['1'], 'query': ['radio wave noise']}), len(docs))
    same = full[full['docno'] != 'x']
    assert list(same['docno'])[:5] == ['d00', 'd02', 'd03', 'd05', 'd07']


def test_ties_break_by_docno_in_the_dense_retriever():
    from pyterrier_lsr.systems.dense import DenseRetriever

    class Embedder:  # one pooled vector per text, as a single-mode LatentTerms gives them
        mode, dense_name = 'single', 'stub'

        def embed(self, texts):
            return np.ones((len(texts), 2), np.float32) / np.sqrt(2), np.arange(len(texts) + 1)
    docnos = [f'd{i:02d}' for i in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 6, 4)]
    vectors = np.tile(np.float32([[0.6, 0.8]]), (len(docnos), 1))
    vectors[5] = [1, 0]  # d09 alone below the tie
    full = _prefixes(DenseRetriever(Embedder(), docnos, vectors), pd.DataFrame({'qid': ['1'], 'query': ['x']}), 12)
    assert list(full['docno']) == sorted(set(docnos) - {'d09'}) + ['d09']


# --- unclear crashes -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('label', ['1' * 25, '-3000000000', '9' * 5000])
def test_a_qrels_label_out_of_range_names_file_and_line(label, tmp_path):
    folder = _collection(tmp_path / 'c', b'1\tradio\n', f'1 0 d1 1\n1 0 d2 {label}\n'.encode())
    with pytest.raises(ValueError, match=r'qrels.txt, line 2: label .* is out of range'):
        load_collection(str(folder))


def _retrievers(tmp_path, tiny, splade):
    """One of each retriever, with its queries."""
    _, tokenizer = tiny
    encoder = _encoder(tokenizer)
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(['nuclear reactor physics', 'radio wave noise',
                                                                  'electron density', 'the cat sat on the dog'])]
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, engines=sorted(ENGINES), verbose=False).index(docs)
    toks = splade.query_encoder()(TOPICS)
    ssr = SSR(encoder, SparseAutoencoder(SAEConfig(d_in=8, n_latents=32, k=4, seed=1)))
    out = [(index.toks_retriever(engine=e), toks) for e in sorted(ENGINES)]
    out += [(index, TOPICS), (index.retriever(), TOPICS), (bm25(tmp_path / 'b.pisa', docs, verbose=False), TOPICS),
            (MaxSimIndex(tmp_path / 'm', encoder, verbose=False).indexer().index(docs), TOPICS),
            (SSRIndex(tmp_path / 's', ssr, verbose=False).indexer().index(docs).retriever(), TOPICS)]
    return out


def test_a_cutoff_of_zero_or_less_is_pyterrier_s_rank_cutoff_on_every_retriever(tiny, splade, tmp_path):
    for retriever, queries in _retrievers(tmp_path, tiny, splade):
        full = retriever(queries)
        for k in (0, -1):
            for pipeline in (retriever % k, (retriever % k).compile()):
                cut = pipeline(queries)
                expected = pt.RankCutoff(k)(full)
                assert len(cut) == 0 and list(cut.columns) == list(expected.columns), (retriever, k)


@pytest.mark.parametrize('setting, value, error', [('k1', '0.9', TypeError), ('b', 1.5, ValueError),
                                                    ('threads', 0, ValueError), ('num_results', 2.5, TypeError),
                                                    ('query_algorithm', 'fast', ValueError),
                                                    ('k2', 1.0, TypeError)])
def test_bm25_settings_are_checked_before_any_work(setting, value, error, tmp_path):
    with pytest.raises(error, match=setting):
        bm25(tmp_path / 'b.pisa', [{'docno': 'a', 'text': 'radio'}], verbose=False, **{setting: value})
    assert not (tmp_path / 'b.pisa').exists()  # refused before the index was built


def test_engines_are_checked_and_built_once(tmp_path):
    index = LsrIndex(tmp_path / 'x.lsr', engines=('pisa', 'pisa'), verbose=False).indexer().index(
        [{'docno': 'a', 'toks': {'x': 1.0}}, {'docno': 'b', 'toks': {'y': 1.0}}])
    assert dict(index.vectors()) == {'a': {'x': 1.0}, 'b': {'y': 1.0}}  # a second PISA build removed them
    assert list(index.toks_retriever()(pd.DataFrame({'qid': ['1'], 'query_toks': [{'y': 1.0}]}))['docno']) == ['b']
    with pytest.raises(TypeError, match='engines must be an engine name or a list of them'):
        LsrIndex(tmp_path / 'y.lsr', engines=None)


@pytest.mark.parametrize('size, error', [(0, ValueError), (2.5, TypeError), ('8', TypeError)])
def test_a_per_call_batch_size_is_checked(size, error, splade):
    with pytest.raises(error, match='batch_size'):  # 0 was the default silently, 2.5 a raw error inside range()
        splade.encode_docs(['radio waves'], batch_size=size)


def _limited(limit):
    """File writes beyond ``limit`` bytes fail (EFBIG) for the block, as on a full disk."""
    class Limit:
        def __enter__(self):
            self.handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            self.soft, self.hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, self.hard))

        def __exit__(self, *exc):
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.soft, self.hard))
            signal.signal(signal.SIGXFSZ, self.handler)
    return Limit()


def test_a_failed_write_of_a_checkpoint_is_an_oserror(tiny, tmp_path):
    from pyterrier_lsr.train import TrainConfig
    from pyterrier_lsr.train.checkpoints import STATE_FILE, save_checkpoint
    model, tokenizer = tiny
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    args = (model, tokenizer, optimizer, scheduler, 1)
    save_checkpoint(*args, tmp_path / 'whole', TrainConfig(), [], [])
    weights = (tmp_path / 'whole' / 'model.safetensors').stat().st_size
    assert (tmp_path / 'whole' / STATE_FILE).stat().st_size > weights + 4096
    for limit in (weights // 2, weights + 4096):  # the weights (safetensors) fail, then the trainer state (torch)
        with _limited(limit), pytest.raises(OSError):
            save_checkpoint(*args, tmp_path / f'cut{limit}', TrainConfig(), [], [])
        assert not (tmp_path / f'cut{limit}').exists()


@pytest.mark.parametrize('full', [False, True])
def test_a_failed_write_of_a_bm25_index_is_an_error_not_an_abort(full, tmp_path, monkeypatch):
    # PISA checks none of its writes: it aborted the process, or (past the first files) left an index missing documents
    from collections import namedtuple

    from pyterrier_lsr.index import bm25 as module
    letters = 'abcdefghijklmnopqrstuvwxyz'
    corpus = [{'docno': f'd{i}', 'text': ' '.join(letters[(i * j) % 26] + letters[j % 26] for j in range(200))}
              for i in range(500)]
    collection = sum(len(d['docno']) + len(d['text']) + 2 for d in corpus)  # PISA's input file, written first
    if full:  # a disk that is full once PISA stops: the OSError of ENOSPC
        usage = namedtuple('usage', 'total used free')
        monkeypatch.setattr(module.shutil, 'disk_usage', lambda path: usage(1, 1, 0))
    with _limited(collection + 4096), pytest.raises(OSError if full else RuntimeError, match='PISA'):
        bm25(tmp_path / 'b.pisa', corpus, verbose=False)
    assert not (tmp_path / 'b.pisa').exists()


@pytest.fixture
def splade_folder(tmp_path):
    from pyterrier_lsr.core.names import resolve_model
    folder = tmp_path / 'model'
    shutil.copytree(resolve_model('splade-tiny'), folder)
    return folder


@pytest.mark.parametrize('damage', [lambda b: b[:len(b) // 2], lambda b: b''])
def test_a_damaged_weights_file_is_named(damage, splade_folder):
    weights = splade_folder / 'model.safetensors'
    weights.write_bytes(damage(weights.read_bytes()))
    with pytest.raises(ModelLoadError, match=f'its weights file {weights} is damaged, cut short or emptied: Safe'):
        load_model(splade_folder)


def test_an_index_folder_is_not_a_model_folder(splade, tmp_path):
    index = SpladeIndexer(tmp_path / 'x.lsr', splade, verbose=False).index([{'docno': 'a', 'text': 'radio'}])
    with pytest.raises(ModelLoadError, match=f'{index.path} is not a model folder .*its model is the copy in'):
        load_model(index.path)
    (tmp_path / 'notes').mkdir()
    (tmp_path / 'notes' / 'a.txt').write_text('x')
    with pytest.raises(ModelLoadError, match='is not a model folder .it has no config.json'):
        load_model(tmp_path / 'notes')


def test_a_config_with_other_layers_than_the_weights_is_refused(splade_folder):
    config = json.loads((splade_folder / 'config.json').read_text())
    for layers, says in ((config['num_hidden_layers'] - 1, 'the weights hold layers its config.json has no place'),
                         (config['num_hidden_layers'] + 1, 'its config.json describes layers the weights do not')):
        (splade_folder / 'config.json').write_text(json.dumps(dict(config, num_hidden_layers=layers)))
        with pytest.raises(ModelLoadError, match=says):
            load_model(splade_folder)


def test_a_jsonl_corpus_is_read_by_the_strict_reader(tmp_path):
    from pyterrier_lsr.scaleout import read_corpus
    bom = '\ufeff'.encode()
    (tmp_path / 'a.jsonl').write_bytes(bom + b'{"docno": "a", "text": "x"}\n' + bom + b'{"docno": "b", "text": "y"}\n')
    assert [d['docno'] for d in read_corpus(str(tmp_path / 'a.jsonl'))[0]] == ['a', 'b']
    (tmp_path / 'b.jsonl').write_bytes(b'{"docno": "a", "text": "x"}\n{"docno": \n')
    with pytest.raises(ValueError, match=r'b.jsonl, line 2: not valid JSON'):
        list(read_corpus(str(tmp_path / 'b.jsonl'))[0])


# --- promises --------------------------------------------------------------------------------------------------------

def test_verbose_false_is_silent_in_training_and_scaleout(tiny, splade, tmp_path, capfd):
    from pyterrier_lsr import Splade, scaleout
    from pyterrier_lsr.train import Example, TrainConfig, train
    from pyterrier_lsr.train.domain import DomainConfig, domain_adapt
    model, tokenizer = tiny
    examples = [Example('radio wave', 'radio wave noise', ['the cat sat'], None)] * 8
    capfd.readouterr()
    train(model, tokenizer, examples, tmp_path / 'run', TrainConfig(steps=2, batch_size=4, save_every=1),
          verbose=False)
    assert capfd.readouterr() == ('', '')
    scaleout.encode([{'docno': 'a', 'text': 'radio'}], splade, tmp_path / 'v', num_workers=0, shard_size=8,
                    verbose=False)
    assert capfd.readouterr() == ('', '')
    corpus = [{'docno': f'd{i}', 'text': f'radio wave noise number {i}. electron density {i}.'} for i in range(40)]
    config = DomainConfig.two_sided(steps=2, batch_size=4, eval_every=2, heldout=5, heldout_pool=5, pool=5,
                                    teachers=('bm25',))
    domain_adapt(Splade(model, tokenizer, device='cpu'), corpus, tmp_path / 'adapt', config, verbose=False)
    assert capfd.readouterr() == ('', '')


def test_bmp_without_scipy_names_the_engines_extra(tmp_path):
    script = ('import sys; sys.modules["scipy"] = None\n'
              'from pyterrier_lsr import SpladeIndexer\n'
              'index = SpladeIndexer(sys.argv[1], verbose=False).index([{"docno": "a", "toks": {"x": 1.0}}])\n'
              'try:\n    index.build_engine("bmp")\n    index.toks_retriever(engine="bmp")\n'
              'except ImportError as e:\n    print(e)\n')
    done = subprocess.run([sys.executable, '-c', script, str(tmp_path / 'x.lsr')], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'pip install "pyterrier-lsr[engines]"' in done.stdout and 'scipy' in done.stdout


def test_a_report_refuses_two_systems_of_one_name(tmp_path):
    from pyterrier_lsr.report import ConfigError, load_config
    (tmp_path / 'c.yaml').write_text('dataset: irds:vaswani\noutput: out\nworkdir: idx\n'
                                     'systems: [{name: x, type: bm25}, {name: x, type: bm25}]\n')
    with pytest.raises(ConfigError, match=r"systems\[1\].name: 'x' is also the name of systems\[0\]"):
        load_config(tmp_path / 'c.yaml')


def test_a_report_never_serves_one_corpus_s_index_for_another(splade, tmp_path):
    from pyterrier_lsr.report.builder import _SystemBuilder

    class Dataset:
        def __init__(self, docs):
            self.docs = docs

        def get_corpus_iter(self, verbose=False):
            return iter(self.docs)
    first = [{'docno': 'a', 'text': 'radio waves'}, {'docno': 'b', 'text': 'electron density'}]
    second = [{'docno': 'x', 'text': 'nuclear reactor'}, {'docno': 'y', 'text': 'the cat sat'}]
    indexes = []
    for docs in (first, second):
        builder = _SystemBuilder(Dataset(docs), tmp_path / 'work', 10)
        builder.models['splade-tiny'] = splade
        indexes.append(builder._base_index({'model': 'splade-tiny'}))
    assert indexes[0].path != indexes[1].path and sorted(dict(indexes[1].vectors())) == ['x', 'y']
    assert np.all([LsrIndex(i.path).num_docs() == 2 for i in indexes])
