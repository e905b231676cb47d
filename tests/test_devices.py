"""One device rule for every encoder and trainer: ``device`` when given, else CUDA when present (the CPU for int8),
and mixed precision by default on CUDA only. CUDA's presence is faked here (``torch.cuda.is_available``), so these run
on any machine without running a CUDA kernel: each checks what was resolved, or where a model was first moved."""
import numpy as np
import pytest
import torch

from pyterrier_lsr.core.encoding import resolve_device, resolve_precision
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.kinds.ssr import train_ssr_sae
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder, train_sae


@pytest.fixture(params=[False, True], ids=['no cuda', 'cuda'])
def cuda(request, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: request.param)
    return request.param


@pytest.mark.parametrize('bf16', [True, False])
def test_defaults_are_cuda_and_mixed_precision_where_cuda_is_present(cuda, bf16, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: bf16)
    device = resolve_device()
    assert device == torch.device('cuda' if cuda else 'cpu')
    assert resolve_precision(None, device) == ('fp32' if not cuda else 'bf16' if bf16 else 'fp16')
    # an explicit device or precision always wins
    assert resolve_device('cpu') == torch.device('cpu') and resolve_precision(None, torch.device('cpu')) == 'fp32'
    assert resolve_precision('fp32', device) == 'fp32'


def test_int8_defaults_to_the_cpu_even_where_cuda_is_present(cuda):
    # an index built in int8 reloads its model with precision='int8' and no device: that must not pick CUDA
    assert resolve_device(None, 'int8') == torch.device('cpu')
    assert resolve_device(None, 'fp32') == torch.device('cuda' if cuda else 'cpu')
    with pytest.raises(ValueError, match="runs on CPU only"):
        resolve_precision('int8', resolve_device('cuda'), int8=True)


def test_an_int8_model_built_with_no_device_encodes_on_the_cpu_where_cuda_is_present(cuda):
    from pyterrier_lsr import Splade
    model = Splade.from_pretrained(resolve_model('splade-tiny'), precision='int8', batch_size=8)
    assert model.device == torch.device('cpu') and model.precision == 'int8'
    assert model.encode_queries(['radio waves'])[0]


class Moved(Exception):
    pass


@pytest.fixture
def moves(monkeypatch):
    """Stops a trainer where it first moves its SAE, with the device it asked for (no CUDA kernel runs)."""
    def to(self, *args, **kwargs):
        raise Moved(torch.device(args[0] if args else kwargs['device']))
    monkeypatch.setattr(SparseAutoencoder, 'to', to)


@pytest.mark.parametrize('device', [None, 'cpu'])
def test_sae_trainers_and_loading_follow_the_device_rule(cuda, moves, device, tmp_path):
    expected = torch.device(device or ('cuda' if cuda else 'cpu'))
    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    with pytest.raises(Moved) as moved:
        train_sae(x, SAEConfig(d_in=8, n_latents=16, k=2), device=device, verbose=False)
    assert moved.value.args[0] == expected
    with pytest.raises(Moved) as moved:
        train_ssr_sae(x, {'n_latents': 16, 'k': 2}, device=device, verbose=False)
    assert moved.value.args[0] == expected
    SparseAutoencoder(SAEConfig(d_in=8, n_latents=16, k=2)).save_pretrained(tmp_path / 'sae')
    with pytest.raises(Moved) as moved:
        SparseAutoencoder.from_pretrained(tmp_path / 'sae', device=device)
    assert moved.value.args[0] == expected

