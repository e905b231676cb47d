"""One loader for every model kind: the kind is read from the folder's saved settings, never guessed from its files.

Each model folder declares itself in ``config.json`` under ``lsr`` (``{"kind": "splade", ...}``), written by the
model's ``save_pretrained``; :func:`load_model` looks the kind up in :data:`MODEL_KINDS` and calls that class's
``from_pretrained``, for local folders and hub names alike (offline short names such as ``'splade-tiny'`` resolve
first).  Folders published by other projects carry no ``lsr`` settings and are read by their documented layout: an
OpenSearch doc-only model (``idf.json``) or a sentence-transformers sparse model with a ``SparseStaticEmbedding``
query module is ``inference-free``; any other masked-LM folder is ``splade``.
"""
import importlib
import os
from pathlib import Path

from ..core import storage
from ..core.offline import resolve_model, unavailable

CONFIG_FILE = 'config.json'
CONFIG_KEY = 'lsr'
MODEL_KINDS = {
    'splade': 'pyterrier_lsr.kinds.splade:Splade',
    'inference-free': 'pyterrier_lsr.kinds.inference_free:InferenceFreeSplade',
    'asymmetric': 'pyterrier_lsr.kinds.asymmetric:AsymmetricSplade',
    'sae-splade': 'pyterrier_lsr.kinds.sae_splade:SaeSplade',
    'latent-terms': 'pyterrier_lsr.kinds.latent_terms:LatentTerms',
    'ssr': 'pyterrier_lsr.kinds.ssr:SSR',
}

__all__ = ['load_model', 'model_class', 'model_kind', 'model_settings', 'update_settings', 'local_folder',
           'MODEL_KINDS']


def local_folder(name_or_path: str | Path) -> Path:
    """A local folder for a model: the folder itself, an offline short name's folder, or a hub snapshot."""
    name = resolve_model(str(name_or_path))
    if os.path.isdir(name):
        return Path(name)
    if Path(name).exists():
        raise FileNotFoundError(unavailable(name, f'{name} is a file, not a model folder'))
    if name.startswith(('.', '/', '~')):
        raise FileNotFoundError(unavailable(name, 'a path is never looked up on the Hugging Face hub'))
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
    try:
        return Path(snapshot_download(name))
    except (LocalEntryNotFoundError, HfHubHTTPError, HFValidationError, OSError) as ex:
        reason = str(ex).strip().splitlines()[0] if str(ex).strip() else type(ex).__name__
        raise FileNotFoundError(unavailable(name, f'the Hugging Face hub could not provide it ({reason:.200})')) \
            from None


def model_settings(folder: str | Path) -> dict:
    """The ``lsr`` settings saved in ``folder/config.json`` (``{}`` for a folder written by another project)."""
    config = Path(folder) / CONFIG_FILE
    if not config.is_file():
        return {}
    settings = storage.read_json(config, 'the model configuration').get(CONFIG_KEY) or {}
    if not isinstance(settings, dict):
        raise ValueError(f'{config}: "{CONFIG_KEY}" must be an object, got {settings!r}')
    return settings


def update_settings(folder: str | Path, **settings):
    """Sets ``settings`` in the ``lsr`` block of ``folder/config.json`` (the rest of the file kept; created when the
    folder has none), atomically: the one way any model folder's settings are written."""
    config_file = Path(folder) / CONFIG_FILE
    config = storage.read_json(config_file, 'the model configuration') if config_file.is_file() else {}
    config[CONFIG_KEY] = dict(config.get(CONFIG_KEY) or {}, **settings)
    storage.write_json(config_file, config, indent=2)


def _files(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file()]


def model_kind(name_or_path: str | Path) -> str:
    folder = local_folder(name_or_path)
    kind = model_settings(folder).get('kind')
    if kind is None:
        files = _files(folder)
        foreign_doc_only = 'idf.json' in files or any('SparseStaticEmbedding' in f for f in files)
        kind = 'inference-free' if foreign_doc_only else 'splade'
    if not isinstance(kind, str) or kind not in MODEL_KINDS:
        raise ValueError(f'{folder / CONFIG_FILE}: unknown model kind {kind!r} under {CONFIG_KEY!r}; known kinds: '
                         f'{sorted(MODEL_KINDS)}')
    return kind


def model_class(kind: str) -> type:
    """The class that loads folders of ``kind`` (a key of :data:`MODEL_KINDS`)."""
    module, cls = MODEL_KINDS[kind].split(':')
    return getattr(importlib.import_module(module), cls)


def load_model(name_or_path: str | Path, **kwargs):
    """Any model of the project from its folder, offline short name or hub name (resolved once, here, for every
    kind); ``kwargs`` (device, batch_size, precision...) go to the model class."""
    folder = local_folder(name_or_path)
    return model_class(model_kind(folder)).from_pretrained(folder, name=str(name_or_path), **kwargs)
