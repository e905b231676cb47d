"""The package's layers point one way (models -> wrappers -> index -> train -> applications) and import in no circle
(function-level imports included).

Every module must belong to a layer below; a new module fails this test until it is placed.
"""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / 'pyterrier_lsr'

# Lowest first. A module may import its own layer and lower ones only.
LAYERS = [
    ('core', ['core', 'models']),
    ('kinds', ['kinds']),
    ('index', ['index']),
    ('train', ['train']),
    ('applications', ['report', 'cli', 'systems', 'scaleout', '__init__']),
]
PURE_TORCH_FORBIDDEN = ('pyterrier', 'pyterrier_alpha', 'pyterrier_pisa', 'pandas', 'ir_datasets')


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix('')
    parts = rel.parts[:-1] if rel.name == '__init__' and len(rel.parts) > 1 else rel.parts
    return '.'.join(parts)


def layer_of(module: str) -> int:
    top = module.split('.')[0]
    for level, (_, members) in enumerate(LAYERS):
        if top in members:
            return level
    raise AssertionError(f'pyterrier_lsr.{module} belongs to no layer: add it to LAYERS in {__file__}')


def imports(path: Path, top_level_only: bool):
    """(imported module inside the package, or None) and the external top-level package, per import statement."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module_name(path).split('.') if path.name == '__init__.py' else module_name(path).split('.')[:-1]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                yield (name.split('.', 1)[1] if name.startswith('pyterrier_lsr.') else None), name.split('.')[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                target = '.'.join([p for p in base if p] + ([node.module] if node.module else []))
                if not node.module:  # "from . import x": each name is a submodule or a member of the package
                    for alias in node.names:
                        name = '.'.join([p for p in base if p] + [alias.name])
                        is_module = (PACKAGE / name.replace('.', '/')).is_dir() or \
                            (PACKAGE / (name.replace('.', '/') + '.py')).is_file()
                        yield (name if is_module else '.'.join(p for p in base if p) or '__init__'), None
                    continue
                yield target, None
            elif node.module and node.module.startswith('pyterrier_lsr'):
                yield node.module.partition('.')[2] or '__init__', None
            elif node.module:
                yield None, node.module.split('.')[0]


MODULES = sorted(PACKAGE.rglob('*.py'))


@pytest.mark.parametrize('path', MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_upward_import(path):
    source = module_name(path) if path.name != '__init__.py' or path.parent != PACKAGE else '__init__'
    for target, _ in imports(path, top_level_only=False):
        if target is None or not target:
            continue
        if source == '__init__':
            continue
        assert layer_of(target) <= layer_of(source), \
            f'pyterrier_lsr.{source} imports pyterrier_lsr.{target} from a higher layer'


@pytest.mark.parametrize('path', [p for p in MODULES if p.relative_to(PACKAGE).parts[0] == 'models'],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_models_are_pure_torch(path):
    for _, external in imports(path, top_level_only=False):
        assert external not in PURE_TORCH_FORBIDDEN, f'{path.name} imports {external}: models/ is pure torch'


def test_no_import_cycle():
    graph = {}
    for path in MODULES:
        source = module_name(path) if path.parent != PACKAGE or path.name != '__init__.py' else '__init__'
        graph[source] = {t for t, _ in imports(path, top_level_only=False) if t}
    known = set(graph)

    def resolve(target):  # "x.y" may name a module or a member of module "x"
        while target and target not in known:
            target = target.rpartition('.')[0]
        return target or None

    edges = {s: {r for t in targets if (r := resolve(t)) and r != s} for s, targets in graph.items()}
    # A package imports its own submodules to re-export them: not a circle back to the package.
    edges = {s: {t for t in ts if not (s == '__init__' or t.startswith(s + '.'))} for s, ts in edges.items()}
    state, stack = {}, []

    def visit(node):
        state[node] = 'open'
        stack.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 'open':
                raise AssertionError('import cycle: ' + ' -> '.join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 'done'

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_each_folder_holds_one_layer():
    """A folder's modules all belong to one layer (the package root holds the applications that re-export)."""
    for folder in {p.parent for p in MODULES}:
        layers = {layer_of(module_name(p) if p.parent != PACKAGE or p.name != '__init__.py' else '__init__')
                  for p in folder.glob('*.py')}
        assert len(layers) == 1, f'{folder.relative_to(PACKAGE.parent)} holds modules of layers {sorted(layers)}'


@pytest.mark.parametrize('path', MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 450, f'{path.relative_to(PACKAGE)} has {lines} lines: split it by concept (at most 450)'
