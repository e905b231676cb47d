"""Nothing of the user's is replaced or removed, bad input is refused before anything is written, and results stay
per input row: the distributed vector folder, the MaxSim store, training checkpoints and static query tables.  Each
test fails on the code before the shared storage layer (rmtree of user folders, ``part-*`` globbing, merges on qid,
``str()`` of any query)."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from pyterrier_lsr import scaleout as distributed
from pyterrier_lsr.core import storage
from pyterrier_lsr.index.maxsim import MaxSimIndex

DOCS = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(
    ['nuclear reactor physics', 'electron density', 'radio wave noise', 'dielectric constant', 'the cat sat'])]


# -- distributed encoding ----------------------------------------------------------------------------------------
def encode(docs, model, folder, **kwargs):
    return distributed.encode(docs, model, folder, num_workers=0, shard_size=2, verbose=False, **kwargs)


def test_distributed_encode_refuses_a_user_folder_and_leaves_it_alone(splade, tmp_path):
    folder = tmp_path / 'mine'
    (folder / 'model').mkdir(parents=True)
    (folder / 'model' / 'weights.bin').write_text('my model')
    (folder / 'part-00000.parquet').write_text('my data')
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr vector folder'):
        encode(DOCS, splade, folder)
    assert (folder / 'model' / 'weights.bin').read_text() == 'my model'
    assert (folder / 'part-00000.parquet').read_text() == 'my data'


def test_distributed_encode_never_replaces_a_model_folder_it_did_not_write(splade, tmp_path):
    folder = tmp_path / 'vectors'
    encode(DOCS, splade, folder)
    storage.remove_artifact(folder / 'model', distributed.MODEL_KIND)
    (folder / 'model').mkdir()
    (folder / 'model' / 'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match='refusing to replace'):
        encode(DOCS, splade, folder)
    assert (folder / 'model' / 'notes.txt').read_text() == 'mine'


def test_a_shorter_corpus_names_its_shards_and_touches_no_other_file(splade, tmp_path):
    folder = tmp_path / 'vectors'
    encode(DOCS, splade, folder)  # 3 shards
    (folder / 'part-00007.json').write_text('{"my": "notes"}')
    (folder / 'part-00002.parquet.bak').write_text('backup')
    store = encode(DOCS[:2], splade, folder)  # 1 shard: shards 1 and 2 stay for the longer corpus
    assert store.docnos() == ['d0', 'd1'] and len(store.manifest['shards']) == 1
    assert (folder / 'part-00001.parquet').exists() and (folder / 'part-00002.json').exists()
    assert (folder / 'part-00007.json').read_text() == '{"my": "notes"}'
    assert (folder / 'part-00002.parquet.bak').read_text() == 'backup'


def test_resuming_with_the_same_model_object_in_the_same_process(splade, tmp_path):
    folder = tmp_path / 'vectors'
    first = list(encode(DOCS, splade, folder))
    splade.tokenizer(['x ' * 50], truncation=True, max_length=7, padding='max_length')  # runtime tokenizer state
    assert list(encode(DOCS, splade, folder)) == first


@pytest.mark.parametrize('docnos, error, match', [
    (['d0', 'd1', 'd2', 'd0'], ValueError, "'d0' occurs twice"),
    (['d0', 1, 'd2', 'd3'], TypeError, 'docnos must be strings'),
])
def test_distributed_docnos_are_unique_strings(splade, tmp_path, docnos, error, match):
    docs = [{'docno': d, 'text': 'x'} for d in docnos]
    with pytest.raises(error, match=match):
        encode(docs, splade, tmp_path / 'vectors')


@pytest.mark.parametrize('setting, value, error', [
    ('num_workers', -1, ValueError), ('num_workers', 1.5, TypeError), ('threads_per_worker', 0, ValueError),
    ('max_retries', -1, ValueError), ('in_flight', 0, ValueError), ('gpus_per_worker', -1, ValueError),
    ('gpus_per_worker', float('nan'), ValueError), ('model_kwargs', [1], TypeError),
])
def test_distributed_settings_are_checked_before_any_work(splade, tmp_path, setting, value, error):
    kwargs = {'num_workers': 0, 'shard_size': 2, 'verbose': False, setting: value}
    with pytest.raises(error, match=setting):  # before Ray starts or the folder is claimed
        distributed.encode(DOCS, splade, tmp_path / 'vectors', **kwargs)
    assert not (tmp_path / 'vectors').exists()


@pytest.mark.parametrize('kwargs, error, match', [
    ({}, FileExistsError, 'not ours to replace, with or without overwrite=True'),
    ({'overwrite': True}, FileExistsError, 'refusing to replace'),
    ({'scale': -1.}, ValueError, 'scale'), ({'overwrite': 'no'}, TypeError, 'overwrite'),
])
def test_distributed_index_refuses_its_target_and_settings_before_encoding(splade, tmp_path, kwargs, error, match):
    target = tmp_path / 'mine'
    target.mkdir()
    (target / 'thesis.tex').write_text('mine')
    with pytest.raises(error, match=match):
        distributed.index(DOCS, splade, target, num_workers=0, shard_size=2, verbose=False, **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['mine']  # no mine.vectors: nothing was encoded
    assert [p.name for p in target.iterdir()] == ['thesis.tex']


# -- the MaxSim store --------------------------------------------------------------------------------------------
class HashEncoder:
    """Stands for a MultiVector: one 4-d unit vector per word, from the word's hash (deterministic)."""
    name = None
    dim = 4

    def embed(self, texts, query=False, verbose=False):
        rows = [np.random.default_rng(sum(map(ord, w))).normal(size=4) for t in texts for w in t.split()]
        vectors = np.array(rows, dtype=np.float32).reshape(-1, 4)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
        offsets = np.concatenate([[0], np.cumsum([len(t.split()) for t in texts])]).astype(np.int64)
        return vectors, offsets


def write_store(path, docs=DOCS, **kwargs):
    vectors, offsets = HashEncoder().embed([d['text'] for d in docs])
    return MaxSimIndex.write(path, [d['docno'] for d in docs], vectors, offsets, HashEncoder(), **kwargs)


def test_maxsim_overwrite_refuses_a_user_folder(tmp_path):
    folder = tmp_path / 'mine'
    folder.mkdir()
    (folder / 'maxsim.json').write_text('{}')
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr MaxSim store'):
        write_store(folder, overwrite=True)
    assert (folder / 'maxsim.json').read_text() == '{}'


def test_maxsim_overwrite_validates_before_touching_the_old_store(tmp_path):
    store = write_store(tmp_path / 'store')
    vectors, offsets = HashEncoder().embed(['a b', 'c'])
    with pytest.raises(ValueError, match='offsets'):
        MaxSimIndex.write(store.path, ['x', 'y'], vectors, offsets + 1, overwrite=True)
    with pytest.raises(ValueError, match="'x' occurs twice"):
        MaxSimIndex.write(store.path, ['x', 'x'], vectors, offsets, overwrite=True)
    with pytest.raises(TypeError, match='docnos must be strings'):
        MaxSimIndex.write(store.path, ['x', 2], vectors, offsets, overwrite=True)
    assert MaxSimIndex(store.path).docnos == [d['docno'] for d in DOCS]
    assert write_store(store.path, DOCS[:2], overwrite=True).docnos == ['d0', 'd1']  # our store: replaced


def test_maxsim_offsets_past_the_vectors_are_a_clear_error(tmp_path):
    store = write_store(tmp_path / 'store')
    offsets = np.load(store.path / 'offsets.npy')
    offsets[-1] += 5
    with open(store.path / 'offsets.npy', 'wb') as f:
        np.save(f, offsets)
    with pytest.raises(ValueError, match='offsets.npy .content differs'):
        MaxSimIndex(store.path, HashEncoder()).num_docs()
    # records rewritten to match: the layout check behind the digests still refuses the offsets
    marker = storage.read_marker(store.path)
    storage.mark(store.path, 'maxsim_store', build=marker['build'], files=storage.record_files(store.path))
    with pytest.raises(ValueError, match='offsets must start at 0'):
        MaxSimIndex(store.path, HashEncoder()).num_docs()


@pytest.mark.parametrize('query', [b'nuclear', ['nuclear', 'physics']])
def test_maxsim_queries_must_be_text(tmp_path, query):
    store = write_store(tmp_path / 'store')
    with pytest.raises(TypeError, match='query.*not str'):
        store.retriever()(pd.DataFrame({'qid': ['1'], 'query': [query]}))


def test_maxsim_duplicate_qids_are_refused_not_cross_joined(tmp_path):
    store = write_store(tmp_path / 'store')
    queries = pd.DataFrame({'qid': ['1', '1'], 'query': ['nuclear physics', 'the cat'], 'tag': ['a', 'b']})
    with pytest.raises(ValueError, match="qid '1' occurs twice"):
        store.retriever(num_results=2)(queries)


def test_rescore_uses_each_rows_own_query_embeddings(tmp_path):
    store = write_store(tmp_path / 'store')
    vectors, offsets = HashEncoder().embed(['nuclear physics', 'the cat'], query=True)
    queries = [torch.from_numpy(vectors[offsets[i]:offsets[i + 1]]) for i in range(2)]
    frame = pd.DataFrame({'qid': ['1'] * 4, 'docno': ['d0', 'd4', 'd0', 'd4'], 'g': [0, 0, 1, 1]})
    res = store.rescore(frame, frame['g'], queries, groups=frame['g'])
    for g, query in enumerate(queries):
        rows = res[res.g == g]
        expected = dict(zip(['d0', 'd4'], store.score_docs(query, np.array([0, 4])).tolist()))
        assert dict(zip(rows.docno, rows.score)) == pytest.approx(expected)
        assert rows['rank'].tolist() == [0, 1] and rows.score.is_monotonic_decreasing


# -- checkpoints and query tables ----------------------------------------------------------------------------------
def test_a_checkpoint_with_a_negative_step_is_refused(tmp_path):
    from pyterrier_lsr.train import checkpoints as loop
    folder = tmp_path / 'run' / 'checkpoint-3'
    folder.mkdir(parents=True)
    torch.save({'step': -3, 'optimizer': {}, 'scheduler': {}, 'model': {}, 'extra': [], 'torch_rng': torch.zeros(1),
                'config': {}, 'log': []}, folder / loop.STATE_FILE)
    with pytest.warns(UserWarning, match='step -3'), pytest.raises(ValueError, match='no intact checkpoint'):
        loop.latest_checkpoint(tmp_path / 'run')


def test_training_refuses_a_user_folder_before_any_step(tmp_path):
    from conftest import make_tiny
    from test_train import examples

    from pyterrier_lsr.train import TrainConfig, train
    run = tmp_path / 'run'
    run.mkdir()
    (run / 'metrics.csv').write_text('mine')  # used to be replaced by the run's log
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr training folder'):
        train(*make_tiny(), examples(), run, TrainConfig(steps=1, batch_size=2), verbose=False)
    assert [p.name for p in run.iterdir()] == ['metrics.csv'] and (run / 'metrics.csv').read_text() == 'mine'


def test_saving_a_step_again_refuses_a_user_folder_of_that_name(tmp_path):
    from conftest import make_tiny

    from pyterrier_lsr.train import TrainConfig
    from pyterrier_lsr.train import checkpoints as loop
    model, tokenizer = make_tiny()
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.)
    path = tmp_path / 'checkpoint-1'
    loop.save_checkpoint(model, tokenizer, optimizer, scheduler, 1, path, TrainConfig(), [], [])
    loop.save_checkpoint(model, tokenizer, optimizer, scheduler, 1, path, TrainConfig(), [], [])  # ours: replaced
    assert loop.latest_checkpoint(tmp_path) == path
    mine = tmp_path / 'checkpoint-2'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr checkpoint'):
        loop.save_checkpoint(model, tokenizer, optimizer, scheduler, 2, mine, TrainConfig(), [], [])
    assert (mine / 'notes.txt').read_text() == 'mine'


def test_a_garbled_query_table_names_its_file(tiny, tmp_path):
    from pyterrier_lsr.stages.query import StaticQueryEncoder
    _, tokenizer = tiny
    StaticQueryEncoder(tokenizer, {'nuclear': 1.5}).save_pretrained(str(tmp_path / 'q'))
    assert StaticQueryEncoder.from_pretrained(str(tmp_path / 'q')).weights == {'nuclear': 1.5}
    (tmp_path / 'q' / 'idf.json').write_text('{"nuclear": ')
    with pytest.raises(ValueError, match='idf.json is not valid JSON'):
        StaticQueryEncoder.from_pretrained(str(tmp_path / 'q'))


def test_model_digest_ignores_tokenizer_runtime_state(tiny, tmp_path):
    _, tokenizer = tiny
    tokenizer.save_pretrained(str(tmp_path / 'a'))
    tokenizer(['x ' * 20], truncation=True, max_length=5, padding='max_length')
    tokenizer.save_pretrained(str(tmp_path / 'b'))
    assert (tmp_path / 'a' / 'tokenizer.json').read_bytes() != (tmp_path / 'b' / 'tokenizer.json').read_bytes()
    assert storage.model_digest(tmp_path / 'a') == storage.model_digest(tmp_path / 'b')
    config = json.loads((tmp_path / 'b' / 'tokenizer.json').read_text())
    config['model']['vocab']['nuclear'] = 0
    (tmp_path / 'b' / 'tokenizer.json').write_text(json.dumps(config))
    assert storage.model_digest(tmp_path / 'a') != storage.model_digest(tmp_path / 'b')
