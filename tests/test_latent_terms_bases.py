"""Latent Terms over any sentence-transformers-style dense base: offline names (split archives too), the pooling a
folder declares, and a resumable embedding pass."""
import io
import json
import os
import zipfile

import numpy as np
import pytest
import torch

from pyterrier_lsr.core import offline, storage
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import OfflineModel
from pyterrier_lsr.kinds import latent_terms
from pyterrier_lsr.kinds.latent_terms import LatentTerms, cached_embeddings

TEXTS = ['nuclear reactor physics and electron density', 'the cat sat on the mat', 'radio wave noise in circuits',
         'dielectric constant of liquids', 'transistor amplifier measurement', 'a much longer text about the '
         'measurement of dielectric constants in polar liquids at radio frequencies']


def test_an_offline_base_is_not_copied_into_a_saved_model():
    # an offline short name resolves anywhere the package is installed, so a saved model does not copy it
    assert not LatentTerms('all-MiniLM-L6-v2')._includes_dense()


def _split_package(root, tmp_path, monkeypatch, files):
    """A fake model shipped as one zip split over three packages (like all-mpnet-base-v2's five)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, 'w') as archive:
        for name, data in files.items():
            archive.writestr(f'fake-model/{name}', data)
    data = buffer.getvalue()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    modules = []
    for i in range(3):
        module = f'fake-model-part_{i + 1:03d}'
        (root / module / 'input').mkdir(parents=True)
        (root / module / '__init__.py').write_text('')
        (root / module / 'input' / f'fake-model.zip.{i + 1:03d}').write_bytes(data[cuts[i]:cuts[i + 1]])
        modules.append(module)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setitem(offline.OFFLINE_MODELS, 'fake-model',
                        OfflineModel(tuple(modules), ('fake-part-1==1.0', 'fake-part-2==1.0', 'fake-part-3==1.0'),
                                     'fake-model.zip'))
    monkeypatch.setenv(offline.CACHE_ENV, str(tmp_path / 'cache'))


def test_split_archive_is_joined_extracted_once_without_desktop_ini(tmp_path, monkeypatch):
    weights = os.urandom(50_000)  # incompressible, so every part holds some of it
    files = {'config.json': '{"a": 1}', 'model.bin': weights, 'sub/desktop.ini': 'x', 'sub/pooling.json': '{}'}
    _split_package(tmp_path / 'site', tmp_path, monkeypatch, files)
    folder = resolve_model('fake-model')
    assert sorted(str(p.relative_to(folder)) for p in __import__('pathlib').Path(folder).rglob('*') if p.is_file()) \
        == ['config.json', 'model.bin', 'sub/pooling.json']
    assert open(os.path.join(folder, 'model.bin'), 'rb').read() == weights
    monkeypatch.setattr(zipfile, 'ZipFile', None)  # a second resolution reads no archive
    assert resolve_model('fake-model') == folder


def test_a_missing_part_names_the_packages(tmp_path, monkeypatch):
    _split_package(tmp_path / 'site', tmp_path, monkeypatch, {'config.json': '{}'})
    monkeypatch.setitem(offline.OFFLINE_MODELS, 'fake-model', offline.OFFLINE_MODELS['fake-model']._replace(
        modules=('fake-model-part_001', 'not-installed-part')))
    with pytest.raises(ImportError, match='fake-part-1==1.0'):
        resolve_model('fake-model')


def _st_copy(tmp_path, modes):
    """all-MiniLM-L6-v2 as a local sentence-transformers folder declaring the pooling ``modes``."""
    source = resolve_model('all-MiniLM-L6-v2')
    folder = tmp_path / 'st'
    (folder / '1_Pooling').mkdir(parents=True)
    for name in os.listdir(source):
        if os.path.isfile(os.path.join(source, name)):
            os.symlink(os.path.join(source, name), folder / name)
    (folder / 'modules.json').unlink(missing_ok=True)
    (folder / 'modules.json').write_text(json.dumps([
        {'idx': 0, 'name': '0', 'path': '', 'type': 'sentence_transformers.models.Transformer'},
        {'idx': 1, 'name': '1', 'path': '1_Pooling', 'type': 'sentence_transformers.models.Pooling'}]))
    (folder / '1_Pooling' / 'config.json').write_text(json.dumps(
        {'word_embedding_dimension': 384, **{f'pooling_mode_{m}': True for m in modes}}))
    return folder


def test_a_local_folder_declaring_cls_pooling_is_pooled_by_cls(tmp_path):
    lt = LatentTerms(str(_st_copy(tmp_path, ['cls_token'])), mode='single')
    vectors, _ = lt.embed(TEXTS[:2])
    tokens = lt.tokenizer(TEXTS[1], return_tensors='pt')
    with torch.no_grad():
        hidden = lt.features.dense(**tokens).last_hidden_state[0]
    assert np.allclose(vectors[1], torch.nn.functional.normalize(hidden[0], dim=-1).numpy(), atol=1e-5)
    mean = LatentTerms('all-MiniLM-L6-v2', mode='single').embed(TEXTS[:2])[0]
    assert not np.allclose(vectors, mean, atol=1e-3)


def test_an_unsupported_pooling_is_refused_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r'1_Pooling/config.json.*max_tokens'):
        LatentTerms(str(_st_copy(tmp_path, ['max_tokens'])))


def test_texts_are_truncated_where_the_folder_declares(tmp_path):
    folder = _st_copy(tmp_path, ['mean_tokens'])
    settings = folder / 'sentence_bert_config.json'
    settings.unlink()
    assert LatentTerms(str(folder)).max_length == 256  # a folder declaring nothing
    settings.write_text(json.dumps({'max_seq_length': 16}))
    long_text = [' '.join(TEXTS)]  # about 60 tokens
    declared, explicit = LatentTerms(str(folder), mode='single'), LatentTerms(str(folder), mode='single', max_length=64)
    assert (declared.max_length, explicit.max_length) == (16, 64)
    assert np.allclose(declared.embed(long_text)[0],
                       LatentTerms(str(folder), mode='single', max_length=16).embed(long_text)[0])
    assert not np.allclose(declared.embed(long_text)[0], explicit.embed(long_text)[0], atol=1e-3)
    settings.write_text(json.dumps({'max_seq_length': 'long'}))
    with pytest.raises(TypeError, match='max_seq_length in .*sentence_bert_config.json'):
        LatentTerms(str(folder))


def test_an_interrupted_embedding_pass_resumes_where_it_stopped(tmp_path, monkeypatch):
    lt = LatentTerms('all-MiniLM-L6-v2', mode='multi', batch_size=1)
    expected, expected_offsets = lt.embed(TEXTS)
    forward, calls = type(lt.features).forward, []

    def failing_after_four(self, *args, **kwargs):
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append(1)
        return forward(self, *args, **kwargs)
    monkeypatch.setattr(type(lt.features), 'forward', failing_after_four)
    monkeypatch.setattr(latent_terms, 'CHECKPOINT_BATCHES', 2)
    with pytest.raises(KeyboardInterrupt):
        cached_embeddings(lt, TEXTS, tmp_path, verbose=False)
    assert not list(tmp_path.glob('*.offsets.npy'))
    calls.clear()
    monkeypatch.setattr(type(lt.features), 'forward',
                        lambda self, *args, **kwargs: (calls.append(1), forward(self, *args, **kwargs))[1])
    vectors, offsets = cached_embeddings(lt, TEXTS, tmp_path, verbose=False)
    assert len(calls) == len(TEXTS) - 4  # only the batches after the last checkpoint ran again
    assert np.array_equal(offsets, expected_offsets) and np.allclose(vectors, expected, atol=1e-6)
    # the token vectors and the pooled ones, no progress file left
    assert sorted(p.name.split('.')[-2] for p in tmp_path.iterdir() if p.name != storage.MARKER) == \
        ['offsets', 'offsets', 'vectors', 'vectors']


def test_the_token_pass_caches_the_pooled_embeddings_a_single_mode_pass_gives(tmp_path, monkeypatch):
    texts = TEXTS + ['  ']
    multi = LatentTerms('all-MiniLM-L6-v2', mode='multi', batch_size=2)
    cached_embeddings(multi, texts, tmp_path, verbose=False)
    single = LatentTerms('all-MiniLM-L6-v2', mode='single', batch_size=2)
    expected, expected_offsets = single.embed(texts)

    def no_pass(*args, **kwargs):
        raise AssertionError('embedded again')
    monkeypatch.setattr(LatentTerms, 'embed', no_pass)
    vectors, offsets = cached_embeddings(single, texts, tmp_path, verbose=False)
    assert np.array_equal(offsets, expected_offsets) and np.allclose(vectors, expected, atol=1e-6)


def test_an_embedding_cache_is_a_folder_of_ours(tmp_path):
    # cached_embeddings wrote into (and removed progress files from) any folder: a user's own is refused, untouched
    lt = LatentTerms('all-MiniLM-L6-v2', mode='single', batch_size=2)
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('my notes')
    with pytest.raises(FileExistsError, match='cache_dir: .*mine is not a pyterrier-lsr embedding cache'):
        cached_embeddings(lt, TEXTS, mine, verbose=False)
    assert [p.name for p in mine.iterdir()] == ['notes.txt']
    # a new folder becomes ours; a domain adaptation's cache is shared (one cache_dir for a course's systems)
    cached_embeddings(lt, TEXTS, tmp_path / 'new', verbose=False)
    assert storage.artifact_type(tmp_path / 'new') == latent_terms.CACHE_KIND
    from pyterrier_lsr.train.domain import claim_cache
    claim_cache(tmp_path / 'new')
    (claim_cache(tmp_path / 'domain') / 'domain-data-x.json').write_text('{}')
    cached_embeddings(lt, TEXTS, tmp_path / 'domain', verbose=False)


def test_the_course_kit_takes_mpnet_when_its_packages_are_installed(monkeypatch):
    from pyterrier_lsr.systems import best_dense, builders
    monkeypatch.setattr(builders, 'installed', lambda name: True)
    assert best_dense() == 'all-mpnet-base-v2'
    monkeypatch.setattr(builders, 'installed', lambda name: name == 'all-MiniLM-L6-v2')
    assert best_dense() == 'all-MiniLM-L6-v2'
    assert offline.installed('all-MiniLM-L6-v2') and not offline.installed('someone/else')
    assert not offline.installed('sentence-transformers/all-MiniLM-L6-v2')  # a hub name is the hub's
