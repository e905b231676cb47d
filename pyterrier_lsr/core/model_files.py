"""Reading model files: every error names the file or folder and what to do.

The libraries' own errors say neither: a truncated ``model.safetensors`` raises ``SafetensorError: invalid header
length``, weights of another shape than ``config.json`` describes "look at the above report", an empty folder
"Couldn't instantiate the backend tokenizer".  Every model file the package reads goes through
:func:`load_hf_model`, :func:`load_tokenizer`, :func:`read_tensors` or :func:`load_weights`, which raise
:class:`ModelLoadError` instead.
"""
import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from .quiet import quiet_transformers

REMEDY = 'save the model again, or copy or download it anew'
# a parameter of one numbered layer (bert.encoder.layer.3.*, model.layers.3.*)
# A model folder holds one of these: HF's configuration, a sentence-transformers module list (its modules in
# subfolders), an ONNX export's settings.
MODEL_FILES = ('config.json', 'modules.json', 'onnx_config.json')
_LAYER = re.compile(r'\.layers?\.\d+\.')

__all__ = ['ModelLoadError', 'check_model_folder', 'load_hf_model', 'load_tokenizer', 'read_tensors', 'load_weights']


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
        damaged = _damaged_weights(path)
        if damaged is not None:
            raise ModelLoadError(f'{what} at {path} does not load (its weights file {damaged[0]} is damaged, cut short '
                                 f'or emptied: {damaged[1]}); {REMEDY}') from ex
        raise ModelLoadError(f'{what} at {path} does not load ({_first_line(ex)}): its files are damaged, missing or '
                             f'of another model; {REMEDY}') from ex


def _damaged_weights(folder) -> tuple[Path, str] | None:
    """The first ``*.safetensors`` file of ``folder`` whose header does not read (truncated, emptied, overwritten)
    and why, or ``None``: the file to name when a folder does not load."""
    from safetensors import safe_open
    path = Path(str(folder))
    if not path.is_dir():
        return None
    for file in sorted(path.glob('*.safetensors')):
        try:
            with safe_open(str(file), 'pt'):
                pass
        except Exception as ex:  # noqa: BLE001 - any failure to read the header is the damage to report
            return file, _first_line(ex)
    return None


def _check_not_empty(folder) -> None:
    path = Path(str(folder))
    if path.is_dir() and not any(path.iterdir()):
        raise ModelLoadError(f'{path} is empty: not a model folder (write one with save_pretrained, or name a model)')


def check_model_folder(folder) -> None:
    """``folder`` (when it is a local folder) holds a model: it is not empty and has a ``config.json`` (or a
    sentence-transformers ``modules.json``).  Anything
    else is a :class:`ModelLoadError` saying "not a model folder" (an index or store folder of this package named as
    such), rather than the first model file the loader then misses."""
    from .storage import artifact_type
    _check_not_empty(folder)
    path = Path(str(folder))
    if not path.is_dir() or any((path / name).is_file() for name in MODEL_FILES):
        return
    kind = artifact_type(path)
    if kind == 'model':  # a model folder this package wrote: its loader knows its files
        return
    what = f'a pyterrier-lsr {kind!r} folder, not a model' if kind else 'it has no config.json, nor modules.json'
    copy = path / 'model'
    hint = f'; its model is the copy in {copy}' if (copy / 'config.json').is_file() else ''
    raise ModelLoadError(f'{path} is not a model folder ({what}){hint}: name a folder written by save_pretrained, '
                         'or a model name')


def load_hf_model(auto_class, name_or_path, what: str = 'the model', **kwargs):
    """``auto_class.from_pretrained(name_or_path, **kwargs)`` (an HF ``AutoModel*``) and its loading info (missing
    and unexpected keys, for the caller to judge), quietly.  Weights of another shape than ``config.json`` gives are
    named with both shapes; damaged or missing files name the folder, and the weights file when it is the damaged
    one."""
    check_model_folder(name_or_path)
    with _reading(name_or_path, what), quiet_transformers():
        model, info = auto_class.from_pretrained(str(name_or_path), output_loading_info=True,
                                                 ignore_mismatched_sizes=True, **kwargs)
    mismatched = info.get('mismatched_keys') or ()
    if mismatched:
        key, saved, expected = min(mismatched, key=lambda m: m[0])  # a set of (name, saved, expected shapes)
        raise ModelLoadError(f'{what} at {name_or_path}: {len(mismatched)} weights have another shape than its '
                             f'config.json describes (e.g. {key}: {tuple(saved)} saved, {tuple(expected)} expected); '
                             f'config.json and the weights belong to different models: {REMEDY}')
    # Whole layers the configuration has no place for (or that the weights lack) load silently otherwise: dropped, or
    # initialised at random, and the vectors change without an error.
    for status, role in (('unexpected_keys', 'the weights hold layers its config.json has no place for'),
                         ('missing_keys', 'its config.json describes layers the weights do not hold')):
        layered = sorted(k for k in info.get(status) or () if _LAYER.search(k))
        if layered:
            layers = getattr(getattr(model, 'config', None), 'num_hidden_layers', '?')
            raise ModelLoadError(f'{what} at {name_or_path}: {role} ({len(layered)} tensors, e.g. {layered[0]}; '
                                 f'config.json says num_hidden_layers {layers}): config.json and the weights belong '
                                 f'to different models: {REMEDY}')
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
