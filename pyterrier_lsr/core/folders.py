"""A model folder on disk: where a name is (a local folder, an offline short name's folder or a hub snapshot) and
the settings it records under ``lsr`` in ``config.json``, read and written the one way every kind uses."""
from pathlib import Path

from . import storage
from .model_files import ModelLoadError
from .names import resolve_model

CONFIG_FILE = 'config.json'
CONFIG_KEY = 'lsr'

__all__ = ['local_folder', 'model_settings', 'kind_settings', 'update_settings', 'CONFIG_FILE', 'CONFIG_KEY']


def local_folder(name_or_path: str | Path) -> Path:
    """A local folder for a model: the folder itself, an offline short name's folder, or a hub snapshot (the one
    resolver, :func:`pyterrier_lsr.core.names.resolve_model`)."""
    return Path(resolve_model(name_or_path))


def model_settings(folder: str | Path) -> dict:
    """The ``lsr`` settings saved in ``folder/config.json`` (``{}`` for a folder written by another project)."""
    config = Path(folder) / CONFIG_FILE
    if not config.is_file():
        return {}
    settings = storage.read_json(config, 'the model configuration').get(CONFIG_KEY) or {}
    if not isinstance(settings, dict):
        raise ValueError(f'{config}: "{CONFIG_KEY}" must be an object, got {settings!r}')
    return settings


def kind_settings(folder: str | Path, kind: str, required: tuple[str, ...], what: str) -> dict:
    """``folder``'s ``lsr`` settings, which must declare ``kind`` (as its own kind, or as the kind of an asymmetric
    model's sides, whose documents' model the folder is) and hold the ``required`` settings its writer records: a
    ``kind`` edited by hand (a SPLADE folder declared ``sae-splade``) is refused here, naming the file, instead of
    failing deep in the loader on a missing key.  ``what``: the kind's name in errors (``'an SAE-SPLADE'``)."""
    settings, config = model_settings(folder), Path(folder) / CONFIG_FILE
    declared = settings.get('sides') if settings.get('kind') == 'asymmetric' else settings.get('kind')
    if declared != kind:
        raise ModelLoadError(f'{folder} is not {what} folder ({config} declares {CONFIG_KEY}.kind '
                             f'{settings.get("kind")!r}): load it with load_model, which reads the kind')
    missing = [k for k in required if k not in settings]
    if missing:
        raise ModelLoadError(f'{config}: {CONFIG_KEY}.kind says {kind!r} but {CONFIG_KEY} lacks {missing}, which '
                             f'every {kind} folder records: the folder holds another kind of model; set '
                             f'{CONFIG_KEY}.kind to the kind that wrote it, or save the model again')
    return settings


def update_settings(folder: str | Path, **settings):
    """Sets ``settings`` in the ``lsr`` block of ``folder/config.json`` (the rest of the file kept; created when the
    folder has none), atomically: the one way any model folder's settings are written."""
    config_file = Path(folder) / CONFIG_FILE
    config = storage.read_json(config_file, 'the model configuration') if config_file.is_file() else {}
    config[CONFIG_KEY] = dict(config.get(CONFIG_KEY) or {}, **settings)
    storage.write_json(config_file, config, indent=2)
