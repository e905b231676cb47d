"""The index's guarantees: atomic, guarded writes; validation at the boundary; damaged files detected; the model it
records reloads from anywhere; the artifact round-trips through PyTerrier's packaging.  One test per defect of the
hardening issue that concerns the index (numbers refer to its list)."""
import contextlib
import json
import math
import os
import subprocess
import sys

import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_lsr import LsrIndex, Prune, SpladeIndexer
from pyterrier_lsr.core.storage import _lock
from pyterrier_lsr.index import MAX_WEIGHT

DOCS = [{'docno': f'd{i}', 'toks': {'alpha': 1.0 + i, 'beta': 0.5, f'only{i}': 2.0}} for i in range(6)]
QUERY = pd.DataFrame({'qid': ['q1'], 'query_toks': [{'alpha': 1.0, 'only3': 1.0}]})


def build(path, docs=DOCS, **kwargs):
    return SpladeIndexer(path, verbose=False, **kwargs).index(docs)


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob('*')) if p.is_file()}


# 1. overwrite=True deleted any folder, and deleted before building.
def test_overwrite_refuses_a_folder_that_is_not_an_index(tmp_path):
    folder = tmp_path / 'thesis'
    folder.mkdir()
    (folder / 'thesis.tex').write_text('x')
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr index'):
        build(folder, overwrite=True)
    assert (folder / 'thesis.tex').read_text() == 'x'
    empty = tmp_path / 'empty'
    empty.mkdir()
    assert build(empty, overwrite=True).num_docs() == 6  # an empty folder is fine


def test_failed_rebuild_leaves_the_old_index_intact(tmp_path):
    index = build(tmp_path / 'x.lsr')
    before = snapshot(index.path)

    def failing_docs():
        yield from DOCS[:3]
        raise RuntimeError('corpus reader died')
    with pytest.raises(RuntimeError, match='corpus reader died'):
        build(index.path, failing_docs(), overwrite=True)
    assert snapshot(index.path) == before
    assert [p.name for p in tmp_path.iterdir() if 'building' in p.name] == []  # no temporary folder left behind
    assert build(index.path, DOCS[:2], overwrite=True).num_docs() == 2  # a successful rebuild replaces it


# 2. Two writers of one path both reported success.
def test_a_second_writer_fails_clearly(tmp_path):
    path = tmp_path / 'x.lsr'
    with _lock(path.absolute()):  # another writer holds the path
        with pytest.raises(RuntimeError, match='another process is writing'):
            build(path)
    assert not path.exists()
    assert build(path).num_docs() == 6


def test_concurrent_processes_never_interleave(tmp_path):
    script = (f'import sys; sys.path.insert(0, {os.getcwd()!r})\n'
              'from pyterrier_lsr import SpladeIndexer\n'
              'docs = [{"docno": f"{sys.argv[1]}{i}", "toks": {"t": 1.0}} for i in range(3000)]\n'
              'try:\n    SpladeIndexer(sys.argv[2], verbose=False, overwrite=True).index(docs); print("ok")\n'
              'except (RuntimeError, FileExistsError) as ex:\n    print("refused", ex)\n')
    path = str(tmp_path / 'shared.lsr')
    procs = [subprocess.Popen([sys.executable, '-c', script, name, path], stdout=subprocess.PIPE, text=True)
             for name in ('a', 'b')]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(o.startswith(('ok', 'refused')) for o in outputs), outputs
    docnos = LsrIndex(path).vectors().docnos()
    assert len(docnos) == 3000 and len({d[0] for d in docnos}) == 1  # one writer's documents, whole


# 4. A docno containing a line break shifted every later docno.
@pytest.mark.parametrize('docno', ['x\ny', 'x\ry', '', ' padded', 'nul\x00'])
def test_docnos_pisa_cannot_store_are_rejected(tmp_path, docno):
    docs = [{'docno': 'a', 'toks': {'t': 1.}}, {'docno': docno, 'toks': {'t': 1.}}]
    with pytest.raises(ValueError, match='docno'):
        build(tmp_path / 'x.lsr', docs)
    assert not (tmp_path / 'x.lsr').exists()


# 5. All-empty collections aborted the process; a never-queried index aborted when opened read-only.
@pytest.mark.parametrize('docs, match', [
    ([{'docno': 'a', 'toks': {}}, {'docno': 'b', 'toks': {}}], 'documents has an empty vector'),
    ([{'docno': 'a', 'toks': None}], 'its text missing, e.g. None'),
    ([{'docno': 'a', 'toks': {'t': 0.004}}], 'empty after quantization'),  # below 1 / scale
])
def test_an_all_empty_collection_is_a_clear_error(tmp_path, docs, match):
    with pytest.raises(ValueError, match=match):
        build(tmp_path / 'x.lsr', docs)


def test_a_collection_of_missing_texts_says_so(splade, tmp_path):
    # a one-document corpus whose text is None used to be reported as "empty after quantization"
    with pytest.raises(ValueError, match='its text missing, e.g. None'):
        LsrIndex(tmp_path / 'x.lsr', splade, verbose=False).index([{'docno': 'a', 'text': None}])


def test_prune_to_nothing_is_a_clear_error(tmp_path):
    pruned = Prune(top_n=0)(pd.DataFrame(DOCS))
    with pytest.raises(ValueError, match='empty vector'):
        build(tmp_path / 'x.lsr', pruned.to_dict('records'))


def test_querying_writes_nothing_into_the_index(tmp_path):
    index = build(tmp_path / 'x.lsr')
    before = snapshot(index.path)
    res = LsrIndex(index.path).toks_retriever()(QUERY)
    assert res['docno'].tolist()[0] == 'd3'
    assert snapshot(index.path) == before  # so a read-only copy can be queried


@pytest.mark.parametrize('victim', ['inv.freqs', 'inv.docs', 'vectors/part-00000.parquet', 'fwd.documents'])
def test_truncated_or_missing_files_are_detected(tmp_path, victim):
    index = build(tmp_path / 'x.lsr')
    target = index.path / victim
    target.write_bytes(target.read_bytes()[:-4])
    with pytest.raises(ValueError, match=f'damaged: {victim}'):
        LsrIndex(index.path).toks_retriever()
    target.unlink()
    with pytest.raises(ValueError, match='missing'):
        LsrIndex(index.path).num_docs()


# 6. Huge or non-finite weights hung PISA or aborted the process; 11. non-dict toks were indexed as empty.
@pytest.mark.parametrize('weight', [1e7, math.inf, math.nan, -1.0, '2', None, True])
def test_bad_query_weights_name_the_query(tmp_path, weight):
    index = build(tmp_path / 'x.lsr')
    frame = pd.DataFrame({'qid': ['ok', 'bad'], 'query_toks': [{'alpha': 1.}, {'alpha': weight}]})
    with pytest.raises((ValueError, TypeError), match="query 'bad'"):
        index.toks_retriever()(frame)


@pytest.mark.parametrize('toks, error', [
    ({'t': math.inf}, ValueError), ({'t': math.nan}, ValueError), ({'t': -0.5}, ValueError),
    ({'t': MAX_WEIGHT * 2}, ValueError), ({'t': 'x'}, TypeError), ({'two words': 1.}, ValueError),
    ({'': 1.}, ValueError), ('t', TypeError), ([('t', 1.)], TypeError), (3, TypeError),
])
def test_bad_document_vectors_name_the_document(tmp_path, toks, error):
    docs = [{'docno': 'good', 'toks': {'t': 1.}}, {'docno': 'bad', 'toks': toks}]
    with pytest.raises(error, match="document 'bad'"):
        build(tmp_path / 'x.lsr', docs)
    assert not (tmp_path / 'x.lsr').exists()


def test_missing_query_toks_mean_no_results(tmp_path):
    index = build(tmp_path / 'x.lsr')
    frame = pd.DataFrame({'qid': ['a', 'b'], 'query_toks': [None, {}]})
    res = index.toks_retriever()(frame)
    assert len(res) == 0 and list(res.columns) == ['qid', 'docno', 'score', 'rank']


def test_retriever_output_has_no_internal_columns(tmp_path):
    index = build(tmp_path / 'x.lsr')
    res = index.toks_retriever()(QUERY.assign(query='alpha'))
    assert list(res.columns) == ['qid', 'query', 'docno', 'score', 'rank']


# The index as a PyTerrier artifact.
def test_artifact_load_and_reuse(tmp_path):
    index = build(tmp_path / 'x.lsr')
    loaded = pt.Artifact.load(str(index.path))
    assert isinstance(loaded, LsrIndex) and loaded.num_docs() == 6
    assert pt.inspect.artifact_type_format(loaded) == ('sparse_index', 'lsr')
    again = LsrIndex(index.path)
    assert again.built()
    with pytest.raises(FileExistsError, match='already exists'):  # re-running a cell is an error only when asked
        build(index.path)


def test_artifact_round_trips_through_hf_packaging(tmp_path, monkeypatch):
    index = build(tmp_path / 'x.lsr')
    package = tmp_path / 'upload' / 'artifact.tar.lz4'
    package.parent.mkdir()
    index.build_package(str(package))  # the file to_hf uploads
    monkeypatch.setenv('PYTERRIER_HOME', str(tmp_path / 'pt_home'))

    @contextlib.contextmanager
    def offline_download(url, headers=None, expected_sha256=None, verbose=True):
        local = package.parent / url.rsplit('/', 1)[1]
        if not local.exists():
            raise OSError(f'{url} not found')
        with open(local, 'rb') as f:
            yield f
    monkeypatch.setattr(pt.io, 'download_stream', offline_download)
    loaded = pt.Artifact.from_hf('someone/vaswani.lsr')
    assert isinstance(loaded, LsrIndex) and loaded.num_docs() == 6
    pd.testing.assert_frame_equal(loaded.toks_retriever()(QUERY), index.toks_retriever()(QUERY))


# Indexes that carry their model (course-experience issue).
def test_index_reloads_its_model_from_another_directory_and_process(tmp_path, tiny):
    from pyterrier_lsr import Splade
    model, tokenizer = tiny
    splade = Splade(model, tokenizer)  # trained in memory, never saved: the index keeps its own copy
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(['nuclear reactor physics', 'the cat sat',
                                                                   'radio wave noise circuit', 'electron density'])]
    index = SpladeIndexer(tmp_path / 'idx.lsr', splade, verbose=False).index(docs)
    expected = index.retriever()(pd.DataFrame({'qid': ['1'], 'query': ['reactor electron']}))
    script = ('import sys, pandas as pd\nfrom pyterrier_lsr import LsrIndex\n'
              'res = LsrIndex("idx.lsr").retriever()(pd.DataFrame({"qid": ["1"], "query": ["reactor electron"]}))\n'
              'print(res[["docno", "score"]].to_json(orient="records"))\n')
    env = dict(os.environ, PYTHONPATH=os.getcwd(), HF_HUB_OFFLINE='1')
    out = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == json.loads(expected[['docno', 'score']].to_json(orient='records'))
