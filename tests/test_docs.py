"""The README's install and test commands are what CI runs and all a fresh machine needs; every ```python block of
docs/*.md runs as written (with tests/test_readme.py's offline replacements and small corpora)."""
import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'


def bash_lines(text: str) -> list:
    return [line for block in re.findall(r'^```bash\n(.*?)^```', text, flags=re.S | re.M)
            for line in block.splitlines()]


def readme_test_command() -> str:
    (command,) = [line for line in bash_lines(README.read_text()) if line.endswith('python -m pytest tests')]
    return command


def test_ci_runs_exactly_the_readme_test_command_in_a_fresh_virtualenv():
    script = (ROOT / '.ci' / 'run').read_text()
    (command,) = re.findall(r"^TEST_COMMAND='(.*)'$", script, flags=re.M)
    assert command == readme_test_command()
    lines = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith('#')]
    venv = next(i for i, line in enumerate(lines) if re.match(r'python3 -m venv "\$work/venv"$', line))
    activate = lines.index('. "$work/venv/bin/activate"')
    # the venv is made, then entered, before anything is installed; the command's status is the script's
    assert venv < activate and lines[-1] == 'eval "$TEST_COMMAND"' and 'set -euo pipefail' in lines
    assert 'mktemp -d' in script and '$(dirname "$0")/..' in script


def setup_requirements() -> tuple:
    tree = ast.parse((ROOT / 'setup.py').read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, 'id', None) == 'setup')
    found = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ('install_requires', 'extras_require')}
    return found['install_requires'], found['extras_require']


def requirement_closure(requirements) -> set:
    """The distributions ``requirements`` install, transitively, as this environment resolved them."""
    seen, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        for spec in metadata.requires(req.name) or ():
            dep = Requirement(spec)
            if dep.marker is None or any(dep.marker.evaluate({'extra': e}) for e in {'', *req.extras}):
                todo.append(dep)
    return {name for name, _ in seen}


def imported_modules(paths) -> set:
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split('.')[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split('.')[0])
    return names


def test_setup_and_constraints_are_all_the_tests_need():
    """Every module the package, the tests and the examples import comes from a distribution that ``pip install -e
    ".[test]"`` installs, and every such distribution is pinned in constraints.txt (so a new pytest, say, cannot
    break a fresh checkout); torch's pin is the version the README installs first."""
    install, extras = setup_requirements()
    wanted = requirement_closure(install + extras['test'] + extras['demo'])
    sources = [*ROOT.glob('pyterrier_lsr/**/*.py'), *ROOT.glob('tests/*.py'), *ROOT.glob('examples/*.py')]
    local = {'pyterrier_lsr', *(p.stem for p in sources)}  # and the tests' and examples' own modules
    third_party = imported_modules(sources) - set(sys.stdlib_module_names) - local
    providers = metadata.packages_distributions()
    unprovided = {m: providers.get(m) for m in third_party
                  if not {canonicalize_name(d) for d in providers.get(m, [])} & wanted}
    assert not unprovided, f'imported but not installed by setup.py: {unprovided}'
    pins = {}
    for line in (ROOT / 'constraints.txt').read_text().splitlines():
        if line.strip() and not line.startswith('#'):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = str(req.specifier)
    assert not wanted - {'pyterrier-lsr'} - set(pins), 'installed by setup.py but not pinned in constraints.txt'
    assert all(spec.startswith('==') for spec in pins.values())
    assert f'torch{pins["torch"]} ' in readme_test_command()
    assert '-c constraints.txt' in readme_test_command()
