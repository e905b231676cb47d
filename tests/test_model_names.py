"""Model names as users mean them: a hub name loads the Hugging Face cache's model (offline, from a fake cache whose
weights differ from the pip-packaged copy), falls back to that copy only when the hub and its cache both fail (with one
warning line), and the pip copies keep their short names."""
import shutil
import warnings
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pyterrier_lsr import LatentTerms, Splade, load_model
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import offline_folder
from pyterrier_lsr.systems import dense_retriever

MINILM_HUB = 'sentence-transformers/all-MiniLM-L6-v2'
REVISION = '0123456789abcdef0123456789abcdef01234567'
TEXTS = ['radio waves in the ionosphere', 'the dielectric constant of polar liquids', 'transistor amplifiers']


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline: huggingface_hub reads both settings when called (its constants), and
    the environment is set too for anything started from here."""
    cache = tmp_path / 'hf-cache'
    cache.mkdir()
    monkeypatch.setenv('HF_HUB_CACHE', str(cache))
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(cache))
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    return cache


def cache_model(cache: Path, repo: str, source: str, tensor: str) -> Path:
    """Puts a copy of the model folder ``source`` into ``cache`` as the hub's ``repo`` (the cache's layout:
    ``models--org--name/snapshots/<revision>/`` and ``refs/main``), with ``tensor`` perturbed."""
    storage = cache / f'models--{repo.replace("/", "--")}'
    snapshot = storage / 'snapshots' / REVISION
    shutil.copytree(source, snapshot)
    (storage / 'refs').mkdir()
    (storage / 'refs' / 'main').write_text(REVISION)
    weights = load_file(str(snapshot / 'model.safetensors'))
    weights[tensor] = weights[tensor] + torch.randn(weights[tensor].shape, generator=torch.Generator().manual_seed(0))
    save_file(weights, str(snapshot / 'model.safetensors'), metadata={'format': 'pt'})
    return snapshot


def test_a_hub_name_loads_the_caches_model_not_the_pip_copy(hub_cache, tmp_path):
    snapshot = cache_model(hub_cache, MINILM_HUB, offline_folder('all-MiniLM-L6-v2'),
                           'embeddings.word_embeddings.weight')
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no fallback happens, so no warning
        assert Path(resolve_model(MINILM_HUB)) == snapshot
        hub = LatentTerms(MINILM_HUB, mode='single', device='cpu')
    pip = LatentTerms('all-MiniLM-L6-v2', mode='single', device='cpu')
    cached = load_file(str(snapshot / 'model.safetensors'))['embeddings.word_embeddings.weight']
    assert torch.equal(hub.features.dense.embeddings.word_embeddings.weight, cached)
    assert not torch.equal(pip.features.dense.embeddings.word_embeddings.weight, cached)
    assert hub._includes_dense()  # a hub model is not a pip copy: a saved model carries it
    # the dense retriever of the hub name embeds with the cache's weights
    corpus = [{'docno': str(i), 'text': t} for i, t in enumerate(TEXTS)]
    retriever = dense_retriever(corpus, MINILM_HUB, cache_dir=tmp_path / 'embeddings', device='cpu')
    expected = hub.embed(TEXTS)[0]
    assert np.allclose(retriever.vectors, expected, atol=1e-6)
    assert not np.allclose(retriever.vectors, pip.embed(TEXTS)[0], atol=1e-3)


def test_a_splade_hub_name_loads_the_caches_weights(hub_cache):
    cache_model(hub_cache, 'naver/splade-fake', offline_folder('splade-tiny'), 'bert.embeddings.word_embeddings.weight')
    hub = Splade.from_pretrained('naver/splade-fake', device='cpu')
    also = load_model('naver/splade-fake', device='cpu')
    pip = Splade.from_pretrained('splade-tiny', device='cpu')
    assert hub.encode(TEXTS) == also.encode(TEXTS)
    assert hub.encode(TEXTS) != pip.encode(TEXTS)
    assert hub.name == 'naver/splade-fake'


def test_a_hub_name_falls_back_to_the_pip_copy_with_one_warning_line(hub_cache):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        folder = resolve_model(MINILM_HUB)
    assert folder == offline_folder('all-MiniLM-L6-v2')
    assert len(caught) == 1
    message = str(caught[0].message)
    assert '\n' not in message and MINILM_HUB in message and "'all-MiniLM-L6-v2'" in message


def test_a_hub_name_without_cache_or_copy_is_an_error_naming_it(hub_cache):
    with pytest.raises(FileNotFoundError, match='naver/not-cached') as error:
        resolve_model('naver/not-cached')
    assert 'splade-tiny' in str(error.value)  # it says what to pass instead
    with pytest.raises(FileNotFoundError, match='never looked up'):
        resolve_model('./no/such/folder')


def test_short_names_and_paths(hub_cache, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert resolve_model('splade-tiny') == offline_folder('splade-tiny')
        assert resolve_model(tmp_path) == str(tmp_path)
    (tmp_path / 'file.txt').write_text('x')
    with pytest.raises(FileNotFoundError, match='is a file'):
        resolve_model(tmp_path / 'file.txt')
