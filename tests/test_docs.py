"""The README's install and test commands are what CI runs and all a fresh machine needs; every ```python block of
docs/*.md runs as written (with tests/test_readme.py's offline replacements and small corpora)."""
import ast
import importlib.metadata as metadata
import json
import re
import runpy
import sys

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_readme import (
    EXCLUDED,
    HUB_NAMES,
    README,
    ROOT,
    SMALL,
    executed,
    python_blocks,
    run_block,
    small_vaswani,  # noqa: F401 (the fixture)
)

DOCS = sorted((ROOT / 'docs').glob('*.md'))
# the pages for PyTerrier's documentation site, shipped in the package (its build reads them from the installed one)
PT_DOCS_FOLDER = ROOT / 'pyterrier_lsr' / 'pt_docs'
PT_DOCS = sorted([*PT_DOCS_FOLDER.glob('*.md'), *PT_DOCS_FOLDER.glob('*.rst')])
PAGES = [README, *DOCS, *PT_DOCS]
DOC_BLOCKS = [(path, i, block) for path in DOCS + PT_DOCS for i, block in enumerate(executed(path))]


def bash_lines(text: str) -> list:
    return [line for block in re.findall(r'^```bash\n(.*?)^```', text, flags=re.S | re.M)
            for line in block.splitlines()]


def readme_test_command() -> str:
    (command,) = [line for line in bash_lines(README.read_text()) if ' -m pytest ' in line and line.endswith(' tests')]
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


def project_requirements() -> tuple:
    """pyproject.toml's core requirements and its extras, an extra naming others of this package expanded."""
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    extras = project['optional-dependencies']

    def expand(reqs):
        out = []
        for r in reqs:
            req = Requirement(r)
            out += expand([x for e in req.extras for x in extras[e]]) if req.name == project['name'] else [r]
        return out
    return project['dependencies'], {name: expand(reqs) for name, reqs in extras.items()}


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
    install, extras = project_requirements()
    wanted = requirement_closure(install + extras['test'] + extras['demo'])
    sources = [*ROOT.glob('pyterrier_lsr/**/*.py'), *ROOT.glob('tests/*.py'), *ROOT.glob('examples/*.py')]
    local = {'pyterrier_lsr', *(p.stem for p in sources)}  # and the tests' and examples' own modules
    third_party = imported_modules(sources) - set(sys.stdlib_module_names) - local
    providers = metadata.packages_distributions()
    unprovided = {m: providers.get(m) for m in third_party
                  if not {canonicalize_name(d) for d in providers.get(m, [])} & wanted}
    assert not unprovided, f'imported but not installed by pyproject.toml: {unprovided}'
    pins = {}
    for line in (ROOT / 'constraints.txt').read_text().splitlines():
        if line.strip() and not line.startswith('#'):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = str(req.specifier)
    assert not wanted - {'pyterrier-lsr'} - set(pins), 'installed by pyproject.toml but not pinned in constraints.txt'
    assert all(spec.startswith('==') for spec in pins.values())
    assert f'torch{pins["torch"]} ' in readme_test_command()
    assert '-c constraints.txt' in readme_test_command()


def test_every_page_runs_an_example_and_every_replacement_is_needed():
    # assignment.md's example is examples/assignment.py, run below; choosing.md and results.md hold figures only
    assert [p.name for p in DOCS if not executed(p)] == ['assignment.md', 'choosing.md', 'results.md']
    blocks = [b for p in PAGES for b in python_blocks(p)]
    assert all(any(b.startswith(first) for b in blocks) for first in EXCLUDED)
    text = '\n'.join(blocks)
    assert all(f'"{name}"' in text for name in HUB_NAMES) and all(re.search(p, text) for p, _ in SMALL)


def test_every_relative_link_of_the_pages_resolves():
    broken = [(page.name, target) for page in PAGES + sorted((ROOT / 'benchmarks').rglob('*.md'))
              for target in re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', page.read_text())
              if not (page.parent / target).exists()]
    assert not broken


def test_the_pyterrier_pages_run_examples_and_list_every_page():
    assert {p.name for p in PT_DOCS if executed(p)} == {'index.rst', 'methods.md', 'indexing.md', 'training.md'}
    index = (PT_DOCS_FOLDER / 'index.rst').read_text()
    toctree = re.search(r'^\.\. toctree::\n(?:    :\w+:.*\n)*\n((?:    \S.*\n)+)', index, flags=re.M)
    assert {line.strip() for line in toctree.group(1).splitlines()} == {p.stem for p in PT_DOCS} - {'index'}


@pytest.mark.parametrize('path, block', [(p, b) for p, _, b in DOC_BLOCKS],
                         ids=[f'{p.parent.name}-{p.stem}-{i}' for p, i, _ in DOC_BLOCKS])
def test_docs_block_runs(path, block, small_vaswani, tmp_path, monkeypatch):  # noqa: F811
    run_block(block, f'{path.parent.name}/{path.name}', small_vaswani, tmp_path, monkeypatch)


def test_the_assignment_runs_from_plain_files_and_a_second_run_only_evaluates(small_vaswani, tmp_path, capfd,  # noqa: F811
                                                                             monkeypatch):
    folder = tmp_path / 'collection'
    folder.mkdir()
    (folder / 'docs.jsonl').write_text(''.join(json.dumps(d) + '\n' for d in small_vaswani.corpus))
    (folder / 'topics.tsv').write_text(''.join(f'{r.qid}\t{" ".join(r.query.split())}\n'
                                               for r in small_vaswani.topics.itertuples()))
    (folder / 'qrels.txt').write_text(''.join(f'{r.qid} 0 {r.docno} {r.label}\n'
                                              for r in small_vaswani.qrels.itertuples()))
    work = tmp_path / 'work'
    argv = ['assignment.py', str(folder), '--workdir', str(work), '--steps', '2', '--latents', '256']
    monkeypatch.setattr(sys, 'argv', argv)
    script = str(ROOT / 'examples' / 'assignment.py')
    runpy.run_path(script, run_name='__main__')
    first = capfd.readouterr()
    built = {p: p.stat().st_mtime_ns for p in work.rglob('*') if p.is_file() and p.name != 'plot.png'}
    monkeypatch.setattr(sys, 'argv', argv + ['--quiet'])
    runpy.run_path(script, run_name='__main__')
    again = capfd.readouterr()
    # the table alone on stdout, on both runs, and the same figures both times
    for out in (first, again):
        lines = out.out.splitlines()
        assert set(lines[0].split()) == {'name', 'nDCG@10', 'AP', 'R@100', 'mrt'} and len(lines) == 6
        assert [line.rsplit(maxsplit=4)[0].strip() for line in lines[1:]] == [
            'BM25', 'SPLADE', 'SPLADE + IDF queries', 'Latent Terms', 'VT-SPLADE']
    # progress on stderr by default: a line per stage and the builders' bars, never PISA's native log lines
    stages = [s.strip() for s in re.findall(r'^\[ *\d+ s\] (\w[\w -]*)', first.err, flags=re.M)]
    assert stages == ['loading the libraries and the collection', 'SPLADE', 'VT-SPLADE', 'BM25', 'Latent Terms',
                      'VT-SPLADE', 'evaluating the 5 systems on 3 topics', 'done'], stages
    assert all(bar in first.err for bar in ('indexing splade.lsr', 'training', 'BM25 indexing', 'training SAE',
                                            'dense teacher: embedding the corpus', 'indexing vt-splade.lsr'))
    assert '[info]' not in first.err and 'Storing terms' not in first.err
    assert again.err == ''  # --quiet: nothing but the table
    assert [line.split()[-4:-1] for line in first.out.splitlines()] == \
        [line.split()[-4:-1] for line in again.out.splitlines()]
    # the second run trained, encoded and wrote nothing: every file is the first run's
    assert {p: p.stat().st_mtime_ns for p in work.rglob('*') if p.is_file() and p.name != 'plot.png'} == built
    assert (work / 'plot.png').stat().st_size > 0


def test_the_assignment_checks_its_extras_before_any_work(tmp_path, capfd, monkeypatch):
    """Without the report extra (the plot, drawn last) the script fails at once, naming the extra, before it reads
    the collection or builds anything."""
    from pyterrier_lsr.core.extras import MissingExtra
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # as if it were not installed
    work = tmp_path / 'work'
    monkeypatch.setattr(sys, 'argv', ['assignment.py', str(tmp_path / 'no-collection'), '--workdir', str(work)])
    with pytest.raises(MissingExtra, match=re.escape('pip install "pyterrier-lsr[report]"')) as failure:
        runpy.run_path(str(ROOT / 'examples' / 'assignment.py'), run_name='__main__')
    assert 'the plot needs matplotlib' in str(failure.value)
    assert not work.exists() and capfd.readouterr() == ('', '')


def test_no_machine_paths_in_the_package_examples_or_benchmarks():
    """Paths are arguments, relative defaults or IR_DATASETS_HOME: nothing, recorded results and commands included,
    points into one machine's folders."""
    files = [p for folder in ('pyterrier_lsr', 'examples', 'benchmarks', 'docs')
             for ext in ('py', 'yaml', 'ipynb', 'md', 'rst', 'json')
             for p in (ROOT / folder).rglob(f'*.{ext}')] + [README]
    assert len(files) > 100
    machine = r'\S*(?:\.\./shared|/work/|/home/|/root/)\S*'
    found = [(p.name, m) for p in files for m in re.findall(machine, p.read_text())]
    assert not found


def test_every_module_the_pages_name_exists():
    """A page that names ``pyterrier_lsr.x.y`` names a module, or a member of one, that imports: pages written before
    a module moved must not send a reader to it."""
    import importlib
    import re
    named = {m.rstrip('.') for path in PAGES for m in re.findall(r'pyterrier_lsr(?:\.\w+)+', path.read_text())}
    assert len(named) > 10
    for name in sorted(named):
        module, attribute = name, None
        while True:
            try:
                found = importlib.import_module(module)
                break
            except ModuleNotFoundError:
                module, _, attribute = module.rpartition('.')
                assert module, f'{name}: no such module'
        rest = name[len(module) + 1:].split('.') if name != module else []
        for part in rest:
            assert hasattr(found, part), f'{name}: {module} has no {part}'
            found = getattr(found, part)


# -- one figure per fact ----------------------------------------------------------------------------------------------
RESULTS = ROOT / 'docs' / 'results.md'
# pages that are their own record (results.md points to them for every figure of theirs)
OWN_RECORD = {'scale.md'}
# facts the pages state in several places: each quote (page, pattern capturing the figure) gives results.md's figure
FACTS = {
    'Latent Terms on CISI, nDCG@10 (the settings latent_terms_index uses)': ('0.478', [
        ('README.md', r'On CISI Latent Terms gives (0\.\d{3})'),
        ('docs/choosing.md', r'on CISI Latent Terms leads \((0\.\d{3})'),
        ('docs/assignment.md', r'\| Latent Terms \(MiniLM, 16,384 latents\) \| (0\.\d{3}) \|'),
        ('docs/results.md', r'path/to/cisi`, same session: Latent Terms (0\.\d{3})'),
    ]),
    'SAE-SPLADE with idf queries on Vaswani, nDCG@10': ('0.424', [
        ('README.md', r'\| SAE-SPLADE on SPLADE-tiny\'s encoder, idf queries [^|]*\| (0\.\d{3}) \|'),
        ('docs/choosing.md', r'\| SAE-SPLADE, idf queries [^|]*\| (0\.\d{3}) '),
        ('docs/results.md', r'one thread: Vaswani (0\.\d{3}) \(idf queries\)'),
    ]),
    "MiniLM token embeddings of Vaswani's 11,429 documents, one thread": ('150 s', [
        ('README.md', r"MiniLM's token embeddings took (\d+ s)"),
        ('docs/latent-terms.md', r"MiniLM's token embeddings took (\d+ s) for Vaswani's 11,429 documents"),
        ('docs/results.md', r"(\d+ s) for Vaswani's 11,429 documents on one"),
    ]),
    'MiniLM token embeddings per 1,000 Vaswani documents': ('13 s', [
        ('docs/running.md', r'\| MiniLM token embeddings [^|]*\| about (\d+ s) '),
        ('docs/results.md', r'MiniLM token embeddings about (\d+ s)'),
    ]),
}


def prose(path) -> str:
    """A page without its code blocks (a printed table there is output, not a quoted figure)."""
    return re.sub(r'^```.*?^```', '', path.read_text(), flags=re.S | re.M)


def test_each_fact_the_pages_repeat_has_one_figure_that_of_results_md():
    for fact, (figure, quotes) in FACTS.items():
        for page, pattern in quotes:
            found = re.findall(pattern, (ROOT / page).read_text())
            assert found and set(found) == {figure}, f'{page} quotes {fact} as {found}, results.md as {figure}'


def test_every_three_decimal_figure_of_the_pages_is_in_results_md():
    """nDCG@10, AP and recall figures quoted anywhere in the README and the pages come from results.md, with the
    same value: a figure that is not there is stale or unrecorded."""
    recorded = set(re.findall(r'(?<![\d.])0\.\d{3}(?!\d)', RESULTS.read_text()))
    pages = [p for p in PAGES if p != RESULTS and p.name not in OWN_RECORD]
    unrecorded = {(p.name, f) for p in pages for f in re.findall(r'(?<![\d.])0\.\d{3}(?!\d)', prose(p))} - \
        {(p.name, f) for p in pages for f in recorded}
    assert not unrecorded, f'figures quoted but not in docs/results.md: {sorted(unrecorded)}'


def test_a_script_s_quoted_length_is_its_length():
    quoted = [(page.name, script, int(n)) for page in PAGES
              for script, n in re.findall(r'`((?:examples|benchmarks)/[\w./]+\.py)` \((\d+) lines\)', page.read_text())]
    wrong = [(page, script, n, len((ROOT / script).read_text().splitlines())) for page, script, n in quoted
             if len((ROOT / script).read_text().splitlines()) != n]
    assert not wrong, wrong


def test_results_md_reads_as_results_not_as_a_run_log():
    """Each figure with its command, date and machine; not how it was obtained (history is git's)."""
    for page in (RESULTS, ROOT / 'docs' / 'assignment.md', ROOT / 'benchmarks' / 'README.md'):
        text = page.read_text()
        for phrase in ('git show', 'fixed since', 'stopped at', 'those of commit', 'in history', 'claims/'):
            assert phrase not in text, f'{page.name}: {phrase!r}'
