"""Latent Terms' SAE budget: a floor of updates on top of the epochs, so a small corpus gets enough SAE steps."""
import numpy as np
import pytest
import torch

from pyterrier_lsr.models.sae import SAEConfig, train_sae
from pyterrier_lsr.systems import latent_terms_index
from pyterrier_lsr.train import sae as sae_recipes
from pyterrier_lsr.train.sae import LATENT_TERMS


def vectors(n, d=8, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype('float32')


@pytest.mark.parametrize('n, batch_size, epochs, min_updates, steps, seen', [
    (100, 32, 2, 0, 8, 200),      # epochs alone: 2 passes of 4 batches (32, 32, 32, 4)
    (100, 32, 2, 5, 8, 200),      # a floor below the epochs' steps changes nothing
    (100, 32, 2, 11, 11, 296),    # above them: reshuffled passes, the last cut short (2 passes + 3 x 32)
    (1000, 1024, 3, 40, 40, 40_000),
])
def test_training_steps_are_the_epochs_or_the_floor(n, batch_size, epochs, min_updates, steps, seen):
    config = SAEConfig(d_in=8, n_latents=16, k=2, batch_size=batch_size, epochs=epochs, min_updates=min_updates)
    _, log = train_sae(vectors(n), config, log_every=1, verbose=False)
    assert [e['step'] for e in log] == list(range(1, steps + 1)) and log[-1]['vectors'] == seen


def test_a_floor_extends_training_without_changing_its_start():
    """The first steps of a run with a floor are the run without one (the floor only adds passes after them), and a
    floor below the epochs' steps trains the very same model: a corpus large enough for the epochs is unaffected."""
    data = vectors(100)
    settings = dict(d_in=8, n_latents=16, k=2, batch_size=32, epochs=1)
    short, short_log = train_sae(data, SAEConfig(**settings), log_every=1, verbose=False)
    _, long_log = train_sae(data, SAEConfig(**settings, min_updates=9), log_every=1, verbose=False)
    assert len(short_log) == 4 and len(long_log) == 9
    assert [e['mse'] for e in long_log[:4]] == [e['mse'] for e in short_log]
    below, _ = train_sae(data, SAEConfig(**settings, min_updates=3), verbose=False)
    for name, tensor in short.state_dict().items():
        assert torch.equal(tensor, below.state_dict()[name]), name


def test_floor_is_checked():
    with pytest.raises(ValueError, match='SAEConfig.min_updates'):
        SAEConfig(d_in=8, min_updates=-1)


def test_one_call_build_on_a_small_corpus_runs_the_recipe_s_floor_of_updates(tmp_path, monkeypatch):
    """About 50 short documents are a few hundred token vectors, one batch: three epochs would be three updates."""
    floor = LATENT_TERMS['sae']['min_updates']
    runs = []

    def recorded(train, *args, **kwargs):
        model, log = train_sae(train, *args, **kwargs)
        runs.append((len(train), log))
        return model, log
    monkeypatch.setattr(sae_recipes, 'train_sae', recorded)
    words = 'reactor electron density wave noise circuit liquid amplifier measurement crystal'.split()
    corpus = [{'docno': f'd{i}', 'text': f'{words[i % 10]} {words[(3 * i) % 10]} {words[(7 * i + 1) % 10]} {i}'}
              for i in range(50)]
    index = latent_terms_index(tmp_path / 'small.lsr', corpus, sae={'n_latents': 64})
    assert index.num_docs() == 50
    (n_vectors, log), = runs
    assert n_vectors < 1024 and LATENT_TERMS['sae']['epochs'] < floor  # one batch a pass: the floor decides
    assert log[-1]['step'] == floor and log[-1]['vectors'] == floor * n_vectors
