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
from ..core.model_files import ModelLoadError
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

__all__ = ['load_model', 'model_class', 'model_kind', 'model_settings', 'kind_settings', 'update_settings',
           'local_folder', 'MODEL_KINDS']


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
    kind): its kind (``lsr.kind`` in ``config.json``, or the folder's layout) picks the class.

    Args:
        name_or_path: a folder written by ``save_pretrained``, an offline short name (``"splade-tiny"``) or a hub
            name (SPLADE, doc-only and sentence-transformers sparse models).
        kwargs: runtime options for the model class (``device``, ``batch_size``, ``precision``, ``max_length``).

    Returns:
        A :class:`~pyterrier_lsr.SparseModel`: :class:`~pyterrier_lsr.Splade`, :class:`~pyterrier_lsr.SaeSplade`,
        :class:`~pyterrier_lsr.LatentTerms`, :class:`~pyterrier_lsr.AsymmetricSplade`, ...

    Raises:
        FileNotFoundError: a name that resolves to no folder.
        ValueError: a folder of an unknown kind, or whose settings are invalid (naming the file); its subclass
            ``ModelLoadError`` for weights that do not load.

    Example::

        model = load_model("my-sae-splade", precision="bf16")
        LsrIndex("./my.lsr", model).index(corpus)
    """
    folder = local_folder(name_or_path)
    return model_class(model_kind(folder)).from_pretrained(folder, name=str(name_or_path), **kwargs)
