"""The core I/O and validation layer: atomic writes, the artifact guard, the shared checks."""
import json

import numpy as np
import pandas as pd
import pytest

from pyterrier_lsr.core import checks, storage


def test_write_json_is_atomic_and_leaves_no_temporary(tmp_path):
    target = tmp_path / 'a.json'
    storage.write_json(target, {'x': 1})
    assert json.loads(target.read_text()) == {'x': 1}

    def fail(tmp):
        tmp.write_text('half')
        raise OSError('disk full')
    with pytest.raises(OSError, match='disk full'):
        storage.write_file(target, fail)
    assert json.loads(target.read_text()) == {'x': 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a.json']


def test_read_json_names_the_file(tmp_path):
    (tmp_path / 'bad.json').write_text('{')
    with pytest.raises(ValueError, match='bad.json'):
        storage.read_json(tmp_path / 'bad.json')
    (tmp_path / 'list.json').write_text('[]')
    with pytest.raises(ValueError, match='JSON dict'):
        storage.read_json(tmp_path / 'list.json')


def test_build_folder_replaces_only_our_artifact_of_the_same_type(tmp_path):
    target = tmp_path / 'out'
    with storage.build_folder(target, 'demo') as tmp:
        (tmp / 'data').write_text('1')
    assert storage.is_artifact(target, 'demo') and (target / 'data').read_text() == '1'
    with pytest.raises(FileExistsError, match='overwrite'):
        with storage.build_folder(target, 'demo'):
            pass
    with storage.build_folder(target, 'demo', overwrite=True) as tmp:
        (tmp / 'data').write_text('2')
    assert (target / 'data').read_text() == '2'
    # another artifact type, and a user folder that merely holds our file names, are refused before any work
    with pytest.raises(FileExistsError, match='demo'):
        with storage.build_folder(target, 'other', overwrite=True):
            raise AssertionError('the block must not run')
    user = tmp_path / 'user'
    user.mkdir()
    (user / 'lsr.json').write_text('{}')
    (user / storage.MARKER).write_text('not json')
    with pytest.raises(FileExistsError, match='refusing'):
        with storage.build_folder(user, 'demo', overwrite=True):
            raise AssertionError('the block must not run')
    assert (user / 'lsr.json').exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['out', 'user']  # no lock file, no temporary left


def test_a_failed_build_keeps_the_old_artifact(tmp_path):
    target = tmp_path / 'out'
    with storage.build_folder(target, 'demo') as tmp:
        (tmp / 'data').write_text('old')
    with pytest.raises(RuntimeError):
        with storage.build_folder(target, 'demo', overwrite=True) as tmp:
            (tmp / 'data').write_text('new')
            raise RuntimeError('interrupted')
    assert (target / 'data').read_text() == 'old'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['out']


def test_a_build_removes_what_a_killed_build_left(tmp_path):
    # A writer killed mid-build (SIGKILL, a session ending) leaves its hidden build folder; the next build of the same
    # path holds the lock, so every such folder is stale and goes.  Other names' folders stay.
    stale = tmp_path / '.a.lsr.building-0123abcd'
    (stale / 'vectors').mkdir(parents=True)
    (stale / 'vectors' / 'part-00000.parquet').write_bytes(b'x' * 100)
    others = [tmp_path / '.a.lsr2.building-0123abcd', tmp_path / '.a.lsr.old-0123abcd', tmp_path / 'a.lsr.building-x']
    for other in others:
        other.mkdir()
    with storage.build_folder(tmp_path / 'a.lsr', 'index') as tmp:
        (tmp / 'f').write_text('new')
    assert not stale.exists() and all(other.is_dir() for other in others)
    assert (tmp_path / 'a.lsr' / 'f').read_text() == 'new'


def test_remove_artifact_refuses_user_folders(tmp_path):
    user = tmp_path / 'user'
    user.mkdir()
    (user / 'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError):
        storage.remove_artifact(user, 'demo')
    assert (user / 'notes.txt').exists()
    with storage.build_folder(tmp_path / 'ours', 'demo') as tmp:
        (tmp / 'x').write_text('')
    assert storage.remove_artifact(tmp_path / 'ours', 'demo') and not (tmp_path / 'ours').exists()


def test_parameter_checks_name_the_argument():
    assert checks.check_int('k', np.int64(3), 1) == 3
    for bad in [True, 2.0, '3']:
        with pytest.raises(TypeError, match='k must be an integer'):
            checks.check_int('k', bad, 1)
    with pytest.raises(ValueError, match=r'threads must be >= 1 and <= 64, got -1'):
        checks.check_int('threads', -1, 1, 64)
    assert checks.check_float('b', 1, 0, 1) == 1.0
    for bad in [float('nan'), float('inf'), -0.1]:
        with pytest.raises(ValueError, match='b must be a finite number'):
            checks.check_float('b', bad, 0, 1)
    with pytest.raises(ValueError, match='> 0'):
        checks.check_float('temperature', 0, 0, exclusive_minimum=True)
    with pytest.raises(ValueError, match="mode must be one of 'single', 'multi'"):
        checks.check_choice('mode', ['single'], ('single', 'multi'))


@pytest.mark.parametrize('docno', [None, float('nan'), pd.NA, pd.NaT, b'd1', 1, ['d1'], '', ' d1', 'd\n1', 'd\x001'])
def test_docnos_are_non_empty_strings(docno):
    with pytest.raises((TypeError, ValueError)):
        checks.check_docno(docno)


def test_duplicate_docnos_are_refused_naming_the_first():
    assert checks.check_docnos(['a', np.str_('b')]) == ['a', 'b']
    with pytest.raises(ValueError, match="'b' occurs twice"):
        checks.check_docnos(['a', 'b', 'c', 'b', 'a'])


def test_terms_with_nul_are_refused():
    with pytest.raises(checks.WeightError, match='NUL'):
        checks.check_weights({'a\x00b': 1.0})


def test_a_term_is_refused_exactly_when_it_is_empty_or_holds_whitespace_or_nul():
    # Every code point up to U+3100 (the last whitespace one is U+3000), alone and inside a term: the rule is
    # str.isspace()'s, whatever the implementation.
    assert not any(chr(c).isspace() for c in range(0x3100, 0x110000, 97))
    for code in range(0x3100):
        c = chr(code)
        bad = c.isspace() or c == '\x00'
        for term in (c, f'a{c}b'):
            try:
                checks.check_term(term)
            except checks.WeightError:
                assert bad, repr(term)
            else:
                assert not bad, repr(term)
    for term in ('', ' a', 'a ', None, 1):
        with pytest.raises(checks.WeightError):
            checks.check_term(term)


def test_a_block_may_mark_its_folder_with_more_information(tmp_path):
    with storage.build_folder(tmp_path / 'a', 'thing') as tmp:
        storage.mark(tmp, 'thing', build='b1')
    assert storage.read_marker(tmp_path / 'a') == {'artifact': 'thing', 'writer': 'pyterrier-lsr', 'build': 'b1'}
    with storage.build_folder(tmp_path / 'b', 'thing'):
        pass
    assert storage.read_marker(tmp_path / 'b') == {'artifact': 'thing', 'writer': 'pyterrier-lsr'}
    (tmp_path / 'c').mkdir()
    (tmp_path / 'c' / storage.MARKER).write_text('["not", "a", "marker"]')
    assert storage.read_marker(tmp_path / 'c') is None and storage.artifact_type(tmp_path / 'c') is None


def test_link_tree_links_every_file_but_the_marker_and_the_skipped(tmp_path):
    with storage.build_folder(tmp_path / 'src', 'thing') as tmp:
        (tmp / 'sub').mkdir()
        (tmp / 'sub' / 'x.bin').write_bytes(b'x')
        (tmp / 'keep.json').write_text('{}')
        (tmp / 'old').mkdir()
        (tmp / 'old' / 'y.bin').write_bytes(b'y')
    with storage.build_folder(tmp_path / 'dst', 'thing') as tmp:
        storage.link_tree(tmp_path / 'src', tmp, skip=lambda name: name.startswith('old/'))
    found = sorted(p.relative_to(tmp_path / 'dst').as_posix() for p in (tmp_path / 'dst').rglob('*') if p.is_file())
    assert found == [storage.MARKER, 'keep.json', 'sub/x.bin']
    assert (tmp_path / 'dst' / 'sub' / 'x.bin').stat().st_ino == (tmp_path / 'src' / 'sub' / 'x.bin').stat().st_ino
