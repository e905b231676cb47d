"""One loader for every model kind: the kind is read from the folder's saved settings, never guessed from its files.

Each model folder declares itself in ``config.json`` under ``lsr`` (``{"kind": "splade", ...}``), written by the
model's ``save_pretrained``; :func:`load_model` looks the kind up in :data:`MODEL_KINDS` and calls that class's
``from_pretrained``, for local folders and hub names alike (offline short names such as ``'splade-tiny'`` resolve
first).  Folders published by other projects carry no ``lsr`` settings and are read by their documented layout: an
OpenSearch doc-only model (``idf.json``) or a sentence-transformers sparse model with a ``SparseStaticEmbedding``
query module is ``inference-free``, one whose ``Router`` has two masked-LM encoders ``asymmetric``; any other
masked-LM folder is ``splade`` (see :mod:`~pyterrier_lsr.kinds.st_format`).
"""
import importlib
from pathlib import Path

from ..core.folders import CONFIG_FILE, CONFIG_KEY, local_folder, model_settings
from ..core.model_files import check_model_folder
from .st_format import Encoder, read_layout

MODEL_KINDS = {
    'splade': 'pyterrier_lsr.kinds.splade:Splade',
    'inference-free': 'pyterrier_lsr.kinds.inference_free:InferenceFreeSplade',
    'asymmetric': 'pyterrier_lsr.kinds.asymmetric:AsymmetricSplade',
    'sae-splade': 'pyterrier_lsr.kinds.sae_splade:SaeSplade',
    'latent-terms': 'pyterrier_lsr.kinds.latent_terms:LatentTerms',
    'ssr': 'pyterrier_lsr.kinds.ssr:SSR',
}

__all__ = ['load_model', 'model_class', 'model_kind', 'MODEL_KINDS']


def _files(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file()]


def model_kind(name_or_path: str | Path) -> str:
    folder = local_folder(name_or_path)
    kind = model_settings(folder).get('kind')
    if kind is None:
        layout = read_layout(folder)
        files = _files(folder)
        foreign_doc_only = 'idf.json' in files or any('SparseStaticEmbedding' in f for f in files)
        if layout is not None and isinstance(layout.query, Encoder):
            kind = 'asymmetric'
        else:
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
    check_model_folder(folder)  # an index folder given by mistake: "not a model folder", not a missing tokenizer
    return model_class(model_kind(folder)).from_pretrained(folder, name=str(name_or_path), **kwargs)
