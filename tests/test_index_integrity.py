"""The index is replaced only when it is ours (marker), is built with a digest of every file, and notices tampering,
damage and rebuilds: each test here fails on the format-2 index (guard by file name, sizes only, cached metadata)."""
import json

import pandas as pd
import pytest

from pyterrier_lsr import LsrIndex, SpladeIndexer
from pyterrier_lsr.core import storage
from pyterrier_lsr.index import artifact

DOCS = [{'docno': f'd{i}', 'toks': {'alpha': 1.0 + i, 'beta': 0.5, f'only{i}': 2.0}} for i in range(6)]
QUERY = pd.DataFrame({'qid': ['q1'], 'query_toks': [{'alpha': 1.0, 'only3': 1.0}]})


def build(path, docs=DOCS, **kwargs):
    return SpladeIndexer(path, verbose=False, **kwargs).index(docs)


def rewrite_meta(index, **changes):
    """Edits lsr.json *and* re-records its digest in the marker, as a consistent forgery would: what is left to
    notice it are the field checks."""
    meta = json.loads((index.path / 'lsr.json').read_text())
    meta.update(changes)
    storage.write_json(index.path / 'lsr.json', meta)
    marker = storage.read_marker(index.path)
    storage.mark(index.path, marker.pop('artifact'), **{**marker, 'meta_sha256': storage.file_digest(
        index.path / 'lsr.json')})


def test_a_user_folder_holding_a_file_named_lsr_json_survives_overwrite(tmp_path):
    folder = tmp_path / 'mine'
    folder.mkdir()
    (folder / 'lsr.json').write_text('{"my": "notes"}')
    (folder / 'thesis.tex').write_text('x')
    with pytest.raises(FileExistsError, match='not a pyterrier-lsr index'):
        build(folder, overwrite=True)
    assert (folder / 'thesis.tex').read_text() == 'x' and (folder / 'lsr.json').read_text() == '{"my": "notes"}'
    assert not artifact.is_lsr_index(folder)
    assert artifact.is_lsr_index(build(tmp_path / 'x.lsr').path)


def test_an_old_format_index_gets_a_clear_version_error(tmp_path):
    folder = tmp_path / 'old.lsr'
    folder.mkdir()
    (folder / 'lsr.json').write_text(json.dumps({'version': 2, 'scale': 100., 'files': {}}))
    with pytest.raises(ValueError, match='format version 2.*reads version 3.*rebuild'):
        LsrIndex(folder).num_docs()


def test_an_edited_lsr_json_is_refused_naming_it(tmp_path):
    index = build(tmp_path / 'x.lsr')
    meta = json.loads((index.path / 'lsr.json').read_text())
    (index.path / 'lsr.json').write_text(json.dumps(dict(meta, scale=1000.)))
    with pytest.raises(ValueError, match=r'lsr\.json is missing or was edited'):
        LsrIndex(index.path).num_docs()


def test_a_same_size_edit_of_df_json_is_refused_naming_it(tmp_path):
    index = build(tmp_path / 'x.lsr')
    path = index.path / 'df.json'
    text = path.read_text()
    edited = text.replace('"alpha": 6', '"alpha": 5')
    assert edited != text and len(edited) == len(text)
    path.write_text(edited)
    with pytest.raises(ValueError, match=r'df\.json \(content differs'):
        LsrIndex(index.path).document_frequencies()


def test_a_shortened_shard_with_rerecorded_sizes_is_refused(tmp_path):
    index = build(tmp_path / 'x.lsr')
    shard = index.path / 'vectors' / 'part-00000.parquet'
    shard.write_bytes(shard.read_bytes()[:-8])
    size = shard.stat().st_size
    manifest = json.loads((index.path / 'vectors' / 'vectors.json').read_text())
    manifest['shards'][0]['bytes'] = size
    (index.path / 'vectors' / 'vectors.json').write_text(json.dumps(manifest))
    meta = json.loads((index.path / 'lsr.json').read_text())
    meta['files']['vectors/part-00000.parquet']['bytes'] = size
    meta['files']['vectors/vectors.json']['bytes'] = (index.path / 'vectors' / 'vectors.json').stat().st_size
    (index.path / 'lsr.json').write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r'lsr\.json is missing or was edited'):
        LsrIndex(index.path).vectors()


@pytest.mark.parametrize('content', ['{not json', '[1, 2]', '{"alpha": [1]}'])
def test_garbled_json_is_a_one_line_error_naming_the_file(tmp_path, content):
    index = build(tmp_path / 'x.lsr')
    (index.path / 'df.json').write_text(content)
    with pytest.raises(ValueError, match='df.json') as info:
        LsrIndex(index.path).document_frequencies()
    assert '\n' not in str(info.value)


@pytest.mark.parametrize('changes, field', [
    ({'model': {'path': '../elsewhere'}}, 'model'),
    ({'model': {'path': '/etc'}}, 'model'),
    ({'num_docs': 'six'}, 'num_docs'),
    ({'scale': float('inf')}, 'scale'),
    ({'scoring': {'kind': 'bm25', 'k1': 'x', 'b': 0.5}}, 'scoring'),
    ({'engines': {'pisa': {'factor': float('nan')}}}, 'engines'),
    ({'files': ['x']}, 'files'),
])
def test_lsr_json_fields_are_checked_even_when_its_digest_is_rerecorded(tmp_path, changes, field):
    index = build(tmp_path / 'x.lsr')
    rewrite_meta(index, **changes)
    with pytest.raises(ValueError, match=rf'lsr\.json: .*{field}'):
        LsrIndex(index.path).num_docs()


def test_open_checks_small_files_and_verify_checks_every_file(tmp_path, monkeypatch):
    index = build(tmp_path / 'x.lsr')
    shard = index.path / 'vectors' / 'part-00000.parquet'
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match='part-00000.parquet'):  # small: caught on open
        LsrIndex(index.path).num_docs()
    monkeypatch.setattr(storage, 'CHEAP_DIGEST_BYTES', 0)  # as if every file were large
    reopened = LsrIndex(index.path)
    assert reopened.num_docs() == 6
    with pytest.raises(ValueError, match='part-00000.parquet.*content differs'):
        reopened.verify()


def test_model_weights_edited_in_place_are_noticed_when_loaded(splade, tmp_path, monkeypatch):
    index = SpladeIndexer(tmp_path / 'm.lsr', splade, verbose=False).index(
        [{'docno': 'a', 'text': 'nuclear physics'}, {'docno': 'b', 'text': 'electron density'}])
    weights = next(p for p in (index.path / 'model').iterdir() if p.suffix == '.safetensors')
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(storage, 'CHEAP_DIGEST_BYTES', 0)  # the open-time check alone would not see it
    reopened = LsrIndex(index.path)
    assert reopened.num_docs() == 2
    with pytest.raises(ValueError, match=rf'model/{weights.name}'):
        reopened.model()


def test_an_index_object_notices_its_folder_was_rebuilt(tmp_path):
    path = tmp_path / 'x.lsr'
    old = build(path)
    reader = LsrIndex(path)
    retriever = reader.toks_retriever(num_results=3)
    assert reader.num_docs() == 6 and len(retriever(QUERY))
    build(path, DOCS[:2], overwrite=True)  # by another object (or process): the reader caches nothing stale
    assert reader.num_docs() == 2 and old.num_docs() == 2
    assert reader.vectors().docnos() == ['d0', 'd1']
    with pytest.raises(RuntimeError, match='rebuilt after this retriever was made'):
        retriever(QUERY)
    assert set(reader.toks_retriever(num_results=3)(QUERY).docno) <= {'d0', 'd1'}


def test_a_model_loaded_from_the_index_is_reloaded_after_a_rebuild(splade, tmp_path):
    path = tmp_path / 'm.lsr'
    docs = [{'docno': 'a', 'text': 'nuclear physics'}]
    SpladeIndexer(path, splade, verbose=False).index(docs)
    reader = LsrIndex(path)
    first = reader.model()
    assert reader.model() is first  # cached while the build is the same
    SpladeIndexer(path, splade, verbose=False, overwrite=True).index(docs)
    assert reader.model() is not first


def test_adding_an_engine_rebuilds_beside_and_keeps_the_rest(tmp_path):
    pytest.importorskip('bmp')
    index = build(tmp_path / 'x.lsr')
    reader = LsrIndex(index.path)
    before = reader.build_id()
    retriever = reader.toks_retriever(num_results=3)
    vectors = (index.path / 'vectors' / 'part-00000.parquet').stat().st_ino
    index.build_engine('bmp')
    assert 'bmp' in reader.meta['engines']  # the reader sees the new lsr.json
    assert reader.build_id() == before and len(retriever(QUERY))  # the documents did not change: still valid
    assert (index.path / 'vectors' / 'part-00000.parquet').stat().st_ino == vectors  # hard-linked, not rewritten
    reader.verify()
    assert [p.name for p in tmp_path.iterdir()] == ['x.lsr']  # nothing left beside it


@pytest.mark.parametrize('docnos, error, match', [
    (['d0', 1], TypeError, 'docnos must be strings'),
    (['d0', b'd1'], TypeError, 'docnos must be strings'),
    (['d0', None], ValueError, 'missing'),
    (['d0', 'd1', 'd0', 'd1'], ValueError, "'d0' occurs twice"),
])
def test_docnos_are_non_empty_unique_strings(tmp_path, docnos, error, match):
    docs = [{'docno': d, 'toks': {'alpha': 1.0}} for d in docnos]
    with pytest.raises(error, match=match):
        build(tmp_path / 'x.lsr', docs, shard_size=1)  # across chunks too
    assert not (tmp_path / 'x.lsr').exists()


def test_index_takes_a_dataframe_and_refuses_a_string(tmp_path):
    frame = pd.DataFrame(DOCS)
    assert build(tmp_path / 'x.lsr', frame).vectors().docnos() == [d['docno'] for d in DOCS]
    with pytest.raises(TypeError, match='iterable of documents'):
        build(tmp_path / 'y.lsr', 'docno,toks')
    with pytest.raises(TypeError, match='document 1 is a str'):
        build(tmp_path / 'z.lsr', [DOCS[0], 'd1'])


def test_a_rebuild_by_another_process_is_noticed(tmp_path):
    import os
    import subprocess
    import sys
    path = tmp_path / 'x.lsr'
    reader = build(path)
    assert reader.num_docs() == 6
    script = (f'import sys; sys.path.insert(0, {os.getcwd()!r})\n'
              'from pyterrier_lsr import SpladeIndexer\n'
              'SpladeIndexer(sys.argv[1], verbose=False, overwrite=True).index('
              '[{"docno": "z", "toks": {"alpha": 1.0}}])\n')
    subprocess.run([sys.executable, '-c', script, str(path)], check=True, timeout=300)
    assert reader.num_docs() == 1 and reader.vectors().docnos() == ['z']
