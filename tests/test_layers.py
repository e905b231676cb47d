"""What import-linter (the contracts in pyproject.toml, run by `lint-imports` in CI) cannot say: every module of the
package is placed in a layer (an unplaced module would be unconstrained), and modules stay small."""
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / 'pyterrier_lsr'
MODULES = sorted(PACKAGE.rglob('*.py'))


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / 'pyproject.toml').read_text())['tool']['importlinter']['contracts']


def test_every_top_level_module_is_in_a_layer():
    layers, = [c['layers'] for c in contracts() if c['type'] == 'layers']
    placed = {name.strip().removeprefix('pyterrier_lsr.') for layer in layers for name in layer.split(':')}
    tops = {p.stem for p in PACKAGE.glob('*.py') if p.name != '__init__.py'} | \
        {p.name for p in PACKAGE.iterdir() if (p / '__init__.py').is_file()}
    assert tops - {'pt_docs'} == placed, f'place every module in a layer of pyproject.toml: {sorted(tops ^ placed)}'


def test_the_ci_runs_the_contracts():
    assert 'lint-imports' in (ROOT / '.ci' / 'run').read_text()


@pytest.mark.parametrize('path', MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 450, f'{path.relative_to(PACKAGE)} has {lines} lines: split it by concept (at most 450)'
