"""Model names as users mean them: the one resolver from a name or path to a local model folder.

* A path (an existing folder, or a name starting with ``.``, ``/`` or ``~``) is that folder; it is never looked up
  on the hub.
* An offline short name (``'splade-tiny'``, ``'all-MiniLM-L6-v2'``, ``'all-mpnet-base-v2'``, see
  :mod:`pyterrier_lsr.core.offline`) is the pip-packaged checkpoint, for demos and tests.
* Any other name (``'naver/splade-v3'``, ``'sentence-transformers/all-MiniLM-L6-v2'``) goes to the Hugging Face hub
  through ``huggingface_hub`` as ``AutoModel.from_pretrained`` would: its cache, ``HF_HUB_OFFLINE``, the network.
  Only when both the hub and its cache fail does a hub name with a pip-packaged copy (:data:`HUB_FALLBACKS`) load
  that copy, with one warning line naming what was loaded instead.

Everything that loads a model by name resolves it here, before any torch module is built (``models/`` only ever
sees folders).
"""
import os
import warnings
from pathlib import Path

from .offline import installed, offline_folder, offline_name, unavailable

# hub names whose model is also pip-packaged (same architecture and tokenizer): the copy stands in only when the hub
# and its cache both fail
HUB_FALLBACKS = {'sentence-transformers/all-MiniLM-L6-v2': 'all-MiniLM-L6-v2',
                 'sentence-transformers/all-mpnet-base-v2': 'all-mpnet-base-v2'}
# files of other frameworks (and exported graphs) that no loader here reads: a snapshot skips them, as
# ``from_pretrained`` would never fetch them
SKIPPED_FILES = ['*.h5', '*.msgpack', '*.ot', '*.onnx', '*.tflite', 'onnx/*', 'openvino/*', 'coreml/*',
                 'tf_model*', 'flax_model*', 'rust_model*']

__all__ = ['resolve_model', 'HUB_FALLBACKS']


def _first_line(ex: BaseException) -> str:
    text = str(ex).strip().splitlines()
    return text[0][:200] if text else type(ex).__name__


def resolve_model(name_or_path: str | Path) -> str:
    """The local folder of a model folder, an offline short name or a hub name (see the module's text).

    Args:
        name_or_path: a folder, an offline short name or a Hugging Face hub name (``org/name``).

    Returns:
        The folder holding the model's files.

    Raises:
        FileNotFoundError: a path that is not a folder, or a hub name neither the hub nor its cache (nor a pip copy)
            provides; the message says what to pass instead.
        ImportError: an offline short name whose package is not installed (naming the package).
    """
    name = str(name_or_path)
    if os.path.isdir(name):
        return name
    if Path(name).exists():
        raise FileNotFoundError(unavailable(name, f'{name} is a file, not a model folder'))
    if offline_name(name):
        return offline_folder(name)
    if name.startswith(('.', '/', '~')) or not name.strip():
        raise FileNotFoundError(unavailable(name, 'a path is never looked up on the Hugging Face hub'))
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
    try:
        return snapshot_download(name, ignore_patterns=SKIPPED_FILES)
    except (LocalEntryNotFoundError, HfHubHTTPError, HFValidationError, OSError, ValueError) as ex:
        reason = _first_line(ex)
    fallback = HUB_FALLBACKS.get(name)
    if fallback and installed(fallback):
        warnings.warn(f'{name}: neither the Hugging Face hub nor its cache provides it ({reason:.120}); loaded the '
                      f'pip-packaged copy {fallback!r} instead', UserWarning, stacklevel=2)
        return offline_folder(fallback)
    raise FileNotFoundError(unavailable(name, f'the Hugging Face hub could not provide it ({reason})')) from None
