"""The checkout builds a wheel PyTerrier can publish: it carries the licence, the project's links and the pages of
PyTerrier's documentation (``pt_docs/`` with its ``conf.py``), and it installs and imports in a fresh virtualenv, from
outside the checkout, where ``importlib.resources`` finds those pages as PyTerrier's documentation build reads them.

Offline and without build isolation: the build uses this environment's setuptools, and the fresh virtualenv sees this
environment's packages (the dependencies) through a path file, so nothing is downloaded.
"""
import email
import os
import re
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(p.name for p in (ROOT / 'pyterrier_lsr' / 'pt_docs').iterdir() if p.suffix in ('.md', '.rst'))
PROJECT = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']


def run(*command, cwd):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # the checkout must not come in by the path
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f'{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}'
    return done.stdout


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout's package files (an in-tree build would leave build/ behind, and a
    stale build/ could slip deleted files into the wheel)."""
    source = tmp_path_factory.mktemp('source')
    for name in ('pyproject.toml', 'setup.py', 'README.md', 'LICENSE'):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / 'pyterrier_lsr', source / 'pyterrier_lsr',
                    ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    out = tmp_path_factory.mktemp('wheel')
    run(sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '--no-index', '-q', '-w', out,
        source, cwd=source)
    (built,) = out.glob('pyterrier_lsr-*.whl')
    return built


def test_the_wheel_carries_the_licence_the_links_and_the_pages(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n.split('/')[0] for n in names if n.endswith('.dist-info/METADATA'))
        meta = email.message_from_string(z.read(f'{info}/METADATA').decode())
        licence = z.read(next(n for n in names if n.startswith(info) and n.endswith('/LICENSE'))).decode()
        pages = {n.rpartition('/')[2] for n in names if n.startswith('pyterrier_lsr/pt_docs/')}
        conf = z.read('pyterrier_lsr/pt_docs/conf.py').decode()
    assert meta['Name'] == 'pyterrier-lsr' and meta['Version'] == PROJECT['version']
    assert meta['License'] == 'Apache-2.0' and meta.get_all('License-File') == ['LICENSE']
    assert licence == (ROOT / 'LICENSE').read_text()
    assert 'Apache License\n                           Version 2.0, January 2004' in licence
    assert 'END OF TERMS AND CONDITIONS' in licence and 'APPENDIX: How to apply the Apache License' in licence
    urls = dict(u.split(', ', 1) for u in meta.get_all('Project-URL'))
    assert urls == PROJECT['urls'] and set(urls) == {'Homepage', 'Repository', 'Documentation', 'Issues'}
    assert pages == {*PAGES, 'conf.py'} and {'index.rst', 'api.rst'} <= pages
    # the configuration PyTerrier's build needs for these pages: Markdown through MyST, autodoc for api.rst
    assert all(ext in conf for ext in ("'myst_parser'", "'sphinx.ext.autodoc'", "'sphinx.ext.napoleon'"))
    # the pages are package data, not modules: no pt_docs package, no other top-level package
    assert not any(n.startswith('pyterrier_lsr/pt_docs/__init__') for n in names)
    assert {n.split('/')[0] for n in names} == {'pyterrier_lsr', info}


def test_every_link_to_the_repository_is_the_one_of_pyproject():
    """One address for the repository everywhere (it is a placeholder until the repository is public: replacing it in
    pyproject.toml must replace it in the pages too)."""
    repository = PROJECT['urls']['Repository']
    assert all(url.startswith(repository) for url in PROJECT['urls'].values())
    pages = [ROOT / 'README.md', *(ROOT / 'docs').glob('*.md'), *(ROOT / 'pyterrier_lsr' / 'pt_docs').glob('*.*')]
    github = r'https?://github\.com/[^/\s"]+/pyterrier-lsr\b'
    links = {(p.name, u) for p in pages for u in re.findall(github, p.read_text())}
    assert links and all(u == repository for _, u in links), links


def test_setup_py_reads_the_project_from_pyproject():
    """Old pips run ``setup.py develop`` for ``pip install -e .``: the minimal setup.py describes the same project."""
    assert (ROOT / 'setup.py').read_text() == 'from setuptools import setup\n\nsetup()\n'
    out = run(sys.executable, 'setup.py', '-q', '--name', '--version', cwd=ROOT)
    assert out.split() == ['pyterrier-lsr', PROJECT['version']]


def test_the_wheel_installs_and_imports_in_a_fresh_virtualenv_with_its_pages(wheel, tmp_path):
    env = tmp_path / 'venv'
    venv.create(env, system_site_packages=True, with_pip=False)
    python = env / 'bin' / 'python'
    # the dependencies: this environment's site-packages, after the new environment's own (where the wheel goes); a
    # path file adds the folders only, so an editable install of the checkout found there does not come along
    (own,) = [p for p in run(python, '-c', 'import site; print("\\n".join(site.getsitepackages()))',
                             cwd=tmp_path).split() if p.startswith(str(env))]
    outer = [p for p in [*site.getsitepackages(), site.getusersitepackages()] if Path(p).is_dir()]
    Path(own, 'outer-environment.pth').write_text(''.join(f'{p}\n' for p in outer))
    run(sys.executable, '-m', 'pip', '--python', python, 'install', '--no-deps', '--no-index', '-q', wheel,
        cwd=tmp_path)
    probe = ('import importlib.metadata, importlib.resources, pyterrier_lsr\n'
             'docs = importlib.resources.files("pyterrier_lsr") / "pt_docs"\n'
             'print(pyterrier_lsr.__file__)\n'
             'print(importlib.metadata.version("pyterrier-lsr"))\n'
             'print(sorted(p.name for p in docs.iterdir() if p.is_file()))\n'
             'print("LsrIndex" in dir(pyterrier_lsr), (docs / "index.rst").read_text().splitlines()[0])\n')
    where, version, pages, check = run(python, '-c', probe, cwd=tmp_path).splitlines()[-4:]
    assert Path(where).is_relative_to(own) and not Path(where).is_relative_to(ROOT)
    assert version == PROJECT['version']
    assert pages == str(sorted([*PAGES, 'conf.py']))
    assert check == 'True ' + (ROOT / 'pyterrier_lsr' / 'pt_docs' / 'index.rst').read_text().splitlines()[0]
