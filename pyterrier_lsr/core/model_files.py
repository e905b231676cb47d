"""Reading model files: every error names the file or folder and what to do.

The libraries' own errors say neither: a truncated ``model.safetensors`` raises ``SafetensorError: invalid header
length``, weights of another shape than ``config.json`` describes "look at the above report", an empty folder
"Couldn't instantiate the backend tokenizer".  Every model file the package reads goes through
:func:`load_hf_model`, :func:`load_tokenizer`, :func:`read_tensors` or :func:`load_weights`, which raise
:class:`ModelLoadError` instead.
"""
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from .quiet import quiet_transformers

REMEDY = 'save the model again, or copy or download it anew'

__all__ = ['ModelLoadError', 'load_hf_model', 'load_tokenizer', 'read_tensors', 'load_weights']


class ModelLoadError(ValueError):
    """A model folder or file that does not load, or would load silently wrong (damaged weights, weights of another
    shape, a missing head or tokenizer, invalid settings); the message names it and what to do."""


def _first_line(ex: BaseException) -> str:
    text = str(ex).strip().splitlines()
    return f'{type(ex).__name__}: {text[0][:200] if text else ""}'


@contextlib.contextmanager
def _reading(path, what: str) -> Iterator[None]:
    """The errors of reading damaged, missing or foreign files inside the block, as :class:`ModelLoadError`."""
    from safetensors import SafetensorError
    try:
        yield
    except ModelLoadError:
        raise
    except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as ex:
        raise ModelLoadError(f'{what} at {path} does not load ({_first_line(ex)}): its files are damaged, missing or '
                             f'of another model; {REMEDY}') from ex


def _check_not_empty(folder) -> None:
    path = Path(str(folder))
    if path.is_dir() and not any(path.iterdir()):
        raise ModelLoadError(f'{path} is empty: not a model folder (write one with save_pretrained, or name a model)')


def load_hf_model(auto_class, name_or_path, what: str = 'the model', **kwargs):
    """``auto_class.from_pretrained(name_or_path, **kwargs)`` (an HF ``AutoModel*``) and its loading info (missing
    and unexpected keys, for the caller to judge), quietly.  Weights of another shape than ``config.json`` gives are
    named with both shapes; damaged or missing files name the folder."""
    _check_not_empty(name_or_path)
    with _reading(name_or_path, what), quiet_transformers():
        model, info = auto_class.from_pretrained(str(name_or_path), output_loading_info=True,
                                                 ignore_mismatched_sizes=True, **kwargs)
    mismatched = info.get('mismatched_keys') or ()
    if mismatched:
        key, saved, expected = min(mismatched, key=lambda m: m[0])  # a set of (name, saved, expected shapes)
        raise ModelLoadError(f'{what} at {name_or_path}: {len(mismatched)} weights have another shape than its '
                             f'config.json describes (e.g. {key}: {tuple(saved)} saved, {tuple(expected)} expected); '
                             f'config.json and the weights belong to different models: {REMEDY}')
    return model, info


def load_tokenizer(name_or_path):
    """``AutoTokenizer.from_pretrained(name_or_path)``; a folder without (readable) tokenizer files is named."""
    from transformers import AutoTokenizer
    _check_not_empty(name_or_path)
    with _reading(name_or_path, 'the tokenizer'):
        return AutoTokenizer.from_pretrained(str(name_or_path))


def read_tensors(path, keys: Sequence[str] = ()) -> dict:
    """The tensors of the safetensors file ``path`` (on the CPU), which must hold ``keys``; a damaged, missing or
    foreign file is named."""
    from safetensors.torch import load_file
    path = Path(path)
    with _reading(path, 'the weights file'):
        tensors = load_file(str(path))
    missing = [k for k in keys if k not in tensors]
    if missing:
        raise ModelLoadError(f'the weights file {path} lacks {missing} (it holds {sorted(tensors)[:5]}): it belongs to '
                             f'another model; {REMEDY}')
    return tensors


def load_weights(module, path) -> None:
    """Loads the safetensors file ``path`` into ``module``, refusing (before copying anything) tensors missing, extra
    or of another shape than the module built from its configuration file has."""
    tensors, expected = read_tensors(path), module.state_dict()
    wrong = sorted(k for k in tensors.keys() | expected.keys()
                   if k not in tensors or k not in expected or tensors[k].shape != expected[k].shape)
    if wrong:
        key = wrong[0]
        found = tuple(tensors[key].shape) if key in tensors else 'missing'
        wanted = tuple(expected[key].shape) if key in expected else 'none'
        raise ModelLoadError(f'the weights file {path} does not fit its configuration ({len(wrong)} tensors differ, '
                             f'e.g. {key}: {found} saved, {wanted} expected); the two files belong to different '
                             f'models: {REMEDY}')
    module.load_state_dict(tensors)
