"""The one place that writes, replaces and removes files and folders: atomic writes and the artifact guard.

Every folder pyterrier-lsr builds (an index, a multi-vector store, a model folder, a checkpoint, a cache, a
distributed output) is an *artifact*: it carries a marker file (:data:`MARKER`) naming its type, written inside the
folder before the folder appears under its final name.  The rules every writer follows through this module:

* **validate first**: callers check their inputs before calling :func:`build_folder` (it refuses the target folder
  before any work, too);
* **build beside**: a folder is filled under a hidden temporary sibling name (same file system, so the final rename is
  atomic); a failure removes the temporary folder and leaves the old artifact as it was;
* **swap atomically**: the old folder is renamed aside, the new one into place, the old one removed;
* **replace only our own**: an existing folder is replaced (or removed) only when its marker names the same artifact
  type; an empty folder counts as free; any other folder is refused, whatever files it holds.

Files are written to a temporary sibling, flushed and ``fsync``-ed, then renamed over the target, and the directory
entry is synced, so a crash leaves either the old file or the new one, never half of one.
"""
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .checks import check_bool
from .oserrors import stream_writer, write_errors

MARKER = '.lsr-artifact.json'
# Cache folders that several writers share (the course kit gives every system one cache_dir): a domain adaptation's
# (BM25 index, examples, teacher scores) and the embeddings of Latent Terms, SAE-SPLADE and the dense baseline.  Each
# writer names its files by their inputs, so a cache that one of them marked is the others' to write into too.
DOMAIN_CACHE, EMBEDDINGS_CACHE = 'domain_adaptation.cache', 'embeddings.cache'
SHARED_CACHES = (DOMAIN_CACHE, EMBEDDINGS_CACHE)

PathLike = str | Path

__all__ = ['MARKER', 'DOMAIN_CACHE', 'EMBEDDINGS_CACHE', 'SHARED_CACHES', 'artifact_type', 'is_artifact',
           'write_file', 'write_stream', 'write_bytes', 'write_text', 'write_json', 'write_array', 'read_json',
           'build_folder', 'replace_folder', 'remove_artifact', 'mark', 'marker_stamp', 'read_marker', 'move_file',
           'temporary_sibling',
           'remove_temporary', 'link_tree', 'file_digest', 'model_digest', 'check_replaceable', 'CHEAP_DIGEST_BYTES',
           'record_files', 'check_files', 'check_claimable', 'claim_folder']


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not open directories; the rename itself is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_sibling(path: PathLike, purpose: str = 'tmp') -> Path:
    """A fresh hidden name next to ``path`` (same folder, so a rename onto ``path`` is atomic)."""
    path = Path(path)
    return path.with_name(f'.{path.name}.{purpose}-{uuid.uuid4().hex[:8]}')


def write_stream(path: PathLike, dump: Callable[[object], None]) -> Path:
    """:func:`write_file` for writers of a file object (``dump(file)``, e.g. ``torch.save``): a write that fails is
    the ``OSError`` of the system call, whatever the writer makes of it (:func:`.oserrors.stream_writer`)."""
    return write_file(path, stream_writer(dump))


def write_file(path: PathLike, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` fills a temporary sibling of ``path``, which is then synced and renamed onto ``path``; on
    failure the temporary file is removed and ``path`` is untouched (a failed write is an ``OSError``, see
    :func:`write_errors`).  Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        with write_errors(path):
            write(tmp)
        with open(tmp, 'rb+') as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return path


def write_bytes(path: PathLike, data: bytes) -> Path:
    return write_file(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: PathLike, text: str) -> Path:
    return write_file(path, lambda tmp: tmp.write_text(text, encoding='utf8'))


def write_json(path: PathLike, obj, indent: int | None = 1) -> Path:
    return write_text(path, json.dumps(obj, indent=indent))


def write_array(path: PathLike, array) -> Path:
    """``array`` in ``.npy`` format (no pickled objects), atomically.  ``np.save`` on a path would append ``.npy`` to
    the temporary name, so it writes to the open file."""
    import numpy as np

    def write(tmp):
        with open(tmp, 'wb') as f:
            np.save(f, np.asarray(array), allow_pickle=False)
    return write_file(path, write)


def read_json(path: PathLike, what: str | None = None, expect: type = dict):
    """``path``'s JSON, or a ``ValueError`` naming the file (missing, not JSON, or not of type ``expect``)."""
    path = Path(path)
    what = what or str(path)
    try:
        value = json.loads(path.read_text(encoding='utf8'))
    except FileNotFoundError:
        raise FileNotFoundError(f'{what}: missing ({path})') from None
    except (ValueError, UnicodeDecodeError) as ex:
        raise ValueError(f'{what}: {path} is not valid JSON ({ex})') from None
    if expect is not None and not isinstance(value, expect):
        raise ValueError(f'{what}: {path} must hold a JSON {expect.__name__}, got {type(value).__name__}')
    return value


def move_file(source: PathLike, target: PathLike) -> Path:
    """Renames a file we wrote (e.g. a completed ``.partial`` cache file) onto ``target`` atomically."""
    target = Path(target)
    os.replace(source, target)
    _fsync_dir(target.parent)
    return target


# -- artifacts ---------------------------------------------------------------------------------------------------
def marker_stamp(folder: PathLike) -> tuple | None:
    """What changes whenever ``folder``'s marker is rewritten (a rebuild writes a new file: a new inode; an edit changes
    its times), or None without one: a stat, so an open artifact re-reads its marker only when it changed."""
    try:
        stat = os.stat(Path(folder) / MARKER)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def read_marker(path: PathLike) -> dict | None:
    """The marker of ``path`` (``{'artifact': type, ...}`` plus what its writer recorded), or ``None`` when ``path``
    carries no readable marker of its own (a symbolic link, a FIFO or a device named like one is none)."""
    try:  # a marker that is a link (to a real artifact's marker, say) does not make its folder ours: never followed
        fd = os.open(Path(path) / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with open(fd, 'rb') as f:
            value = json.loads(f.read().decode('utf8')) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
    except (ValueError, UnicodeDecodeError, OSError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get('artifact'), str) else None


def artifact_type(path: PathLike) -> str | None:
    """The artifact type recorded in ``path``'s marker, or ``None`` when ``path`` is not one of ours."""
    marker = read_marker(path)
    return marker['artifact'] if marker else None


def is_artifact(path: PathLike, kind: str) -> bool:
    """Whether ``path`` is a folder marked as our artifact of type ``kind``."""
    return Path(path).is_dir() and artifact_type(path) == kind


def mark(folder: PathLike, kind: str, **info) -> None:
    """Marks ``folder`` (one we are building) as an artifact of type ``kind``; ``info`` (JSON values) is recorded
    with it, e.g. a build id or the digest of the artifact's own metadata file (see :func:`read_marker`)."""
    write_json(Path(folder) / MARKER, {**info, 'artifact': kind, 'writer': 'pyterrier-lsr'})


def check_replaceable(path: PathLike, kind: str, overwrite: bool, what: str | None = None) -> bool:
    """Whether ``path`` holds something to replace; raises unless it may be replaced (``overwrite`` must be a bool:
    a string such as ``'no'`` would otherwise count as yes).  Writers whose build starts after a long job (encoding a
    corpus) call it first, so that a target they may not replace is refused before any work."""
    check_bool('overwrite', overwrite)
    path, what = Path(path), what or kind
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_symlink() or not path.is_dir():
        raise FileExistsError(f'{path} exists and is not a folder; refusing to replace it')
    if not any(path.iterdir()):
        return True
    found = artifact_type(path)
    if found != kind:  # overwrite=True would not help: say so rather than suggest it
        found_text = f'a pyterrier-lsr {found}' if found else f'not a pyterrier-lsr {what}'
        raise FileExistsError(f'{path} is {found_text} (no {MARKER} naming {kind!r}), so it is not ours to replace, '
                              'with or without overwrite=True; refusing to replace it: choose another path or empty '
                              'the folder yourself')
    if not overwrite:
        raise FileExistsError(f'{path} already exists (a pyterrier-lsr {what}); pass overwrite=True to replace it')
    return True


def check_claimable(folder: PathLike, kind: str, what: str) -> bool:
    """Whether ``folder`` is already ours (marked as ``kind``, or as another of :data:`SHARED_CACHES` when ``kind`` is
    one); raises the error :func:`claim_folder` would, writing nothing, for callers that must refuse a folder long
    before they write into it (a report's output, after indexing)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f'{folder} exists and is not a folder; choose a new or empty folder')
    found = artifact_type(folder) if folder.is_dir() else None
    if found == kind or (kind in SHARED_CACHES and found in SHARED_CACHES):
        return True
    if folder.is_dir() and any(folder.iterdir()):
        raise FileExistsError(f'{folder} is not a pyterrier-lsr {what} (no {MARKER} naming {kind!r}); refusing to '
                              'write into it: choose a new or empty folder')
    return False


def claim_folder(folder: PathLike, kind: str, what: str) -> Path:
    """Makes ``folder`` ours to write a job's files into, and to resume in: a new or empty folder is marked as an
    artifact of type ``kind``; one so marked is accepted; any other is refused before any work, so none of its files
    is replaced (a user's ``metrics.csv``) or removed."""
    folder = Path(folder)
    if not check_claimable(folder, kind, what):
        folder.mkdir(parents=True, exist_ok=True)
        mark(folder, kind)
    return folder


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive, non-blocking lock for writing ``path``: a second writer fails at once.  The lock file lives
    next to ``path`` only while the write lasts."""
    lock_path = path.parent / f'.{path.name}.lock'
    while True:
        f = open(lock_path, 'a+')
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise RuntimeError(f'another process is writing {path}; wait for it to finish') from None
        try:  # the holder before us may have removed the file after we opened it: lock the file that is there
            same = os.fstat(f.fileno()).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    if os.fstat(f.fileno()).st_size:  # our lock files stay empty: this one is a user's file, never to be removed
        f.close()
        raise ValueError(f'{lock_path} is not a lock file of ours (it has content); move it away to write {path}')
    try:
        yield
    finally:
        try:
            lock_path.unlink()
        except FileNotFoundError:
            pass
        f.close()


def _swap(tmp: Path, path: Path, replace: bool) -> None:
    if replace:
        old = temporary_sibling(path, 'old')
        os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            os.rename(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            os.rename(tmp, path)
        except OSError as ex:  # someone created it meanwhile
            if ex.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(f'{path} appeared while it was being built; nothing was replaced') from None
            raise
    _fsync_dir(path.parent)


def _remove_stale_builds(path: Path) -> None:
    """Removes the build folders a killed writer left beside ``path`` (a 1M-document index leaves gigabytes): only
    the lock holder builds there, and we hold the lock.  (A left ``old`` folder is kept: a writer killed inside
    :func:`_swap` may leave the previous artifact there alone.)"""
    prefix = f'.{path.name}.building-'
    for stale in path.parent.iterdir():
        tag = stale.name[len(prefix):]
        if (stale.name.startswith(prefix) and len(tag) == 8 and all(c in '0123456789abcdef' for c in tag)
                and stale.is_dir() and not stale.is_symlink()):
            shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def build_folder(path: PathLike, kind: str, overwrite: bool = False, what: str | None = None) -> Iterator[Path]:
    """Yields an empty temporary sibling of ``path`` to fill; when the block succeeds the folder is marked as an
    artifact of type ``kind`` (unless the block marked it so itself, see :func:`mark`) and swapped into place
    atomically; when it fails it is removed and ``path`` is left as
    it was.  An existing non-empty ``path`` is replaced only with ``overwrite`` and only if it is our artifact of the
    same type (checked before the block runs, and again before the swap)."""
    path = Path(path).absolute()
    what = what or kind
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        check_replaceable(path, kind, overwrite, what)
        _remove_stale_builds(path)
        tmp = temporary_sibling(path, 'building')
        tmp.mkdir()
        try:
            with write_errors(path):  # models' save_pretrained write through native code
                yield tmp
            if artifact_type(tmp) != kind:  # the block may have marked it itself, with more information
                mark(tmp, kind)
            _swap(tmp, path, check_replaceable(path, kind, overwrite, what))
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def replace_folder(source: PathLike, path: PathLike, kind: str, overwrite: bool = True) -> Path:
    """Moves a folder we built (``source``, on the same file system) to ``path`` as an artifact of type ``kind``,
    replacing only our own artifact of that type there."""
    source, path = Path(source), Path(path).absolute()
    with _lock(path):
        replace = check_replaceable(path, kind, overwrite, kind)
        mark(source, kind)
        _swap(source, path, replace)
    return path


def remove_artifact(path: PathLike, kind: str) -> bool:
    """Removes ``path`` if it is our artifact of type ``kind`` (or an empty folder); returns whether it existed.
    Refuses any other folder."""
    path = Path(path)
    if not path.exists():
        return False
    check_replaceable(path, kind, True, kind)
    shutil.rmtree(path)
    return True


def remove_temporary(path: PathLike) -> None:
    """Removes a temporary file or folder this process made (:func:`temporary_sibling`, ``tempfile``), if present."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def link_tree(source: PathLike, target: PathLike, skip: Callable[[str], bool] = lambda name: False) -> None:
    """Fills ``target`` (a folder being built) with hard links to ``source``'s files (copies where the file system
    has no hard links), except the marker and the files whose relative name ``skip`` accepts.  Safe because no
    writer here modifies a file in place: every write replaces the file by a new one."""
    source, target = Path(source), Path(target)
    for path in sorted(source.rglob('*')):
        name = path.relative_to(source).as_posix()
        if not path.is_file() or path.is_symlink() or name == MARKER or skip(name):
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target / name)
        except OSError:
            shutil.copy2(path, target / name)


# -- digests -----------------------------------------------------------------------------------------------------
# Files up to this size are digested on every open (about a millisecond per MiB); larger ones only by verify() and,
# for the model folder, when the model is loaded.
CHEAP_DIGEST_BYTES = 1 << 22


def record_files(folder: Path, leave_out=()) -> dict[str, dict]:
    """``{relative name: {'bytes', 'sha256'}}`` for every file of ``folder`` but the marker and ``leave_out``."""
    out = {}
    for path in sorted(folder.rglob('*')):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != MARKER and name not in leave_out:
            out[name] = {'bytes': path.stat().st_size, 'sha256': file_digest(path)}
    return out


def check_files(folder: Path, files: dict[str, dict], what: str, full: bool = False, prefix: str = '',
                remedy: str = 'rebuild it') -> None:
    """Raises a ``ValueError`` saying that ``what`` (``'the index'``, ``'the k-means cell folder'``) is damaged, naming
    the damaged files (missing, another size, other bytes) among ``files`` whose name starts with ``prefix``, and the
    ``remedy``; digests are compared for every file with ``full``, else for small ones only."""
    damaged = []
    for name, record in files.items():
        if not name.startswith(prefix):
            continue
        path = folder / name
        if not path.is_file():
            damaged.append(f'{name} (missing)')
        elif path.stat().st_size != record['bytes']:
            damaged.append(f'{name} ({path.stat().st_size} bytes, {record["bytes"]} recorded)')
        elif (full or record['bytes'] <= CHEAP_DIGEST_BYTES) and file_digest(path) != record['sha256']:
            damaged.append(f'{name} (content differs from the recorded digest)')
    if damaged:
        more = f' and {len(damaged) - 5} more' if len(damaged) > 5 else ''
        raise ValueError(f'{what} at {folder} is damaged: {", ".join(damaged[:5])}{more}; {remedy}')


def file_digest(path: PathLike) -> str:
    """The sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


# tokenizers >= 0.13 save the truncation/padding last used (runtime state) into tokenizer.json: a model that
# encoded anything would otherwise fingerprint differently from the same model saved before.
_RUNTIME_TOKENIZER_KEYS = ('truncation', 'padding')


def model_digest(folder: PathLike) -> str:
    """The sha256 of a model folder's weights and configuration (every file's name and bytes, hidden files and the
    marker left out), ``tokenizer.json`` without its runtime truncation/padding state: equal for the same model saved
    twice, different when any weight or setting changes."""
    folder = Path(folder)
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob('*') if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if any(part.startswith('.') for part in Path(name).parts):
            continue
        h.update(name.encode('utf8') + b'\0')
        if path.name == 'tokenizer.json':
            try:
                config = json.loads(path.read_text(encoding='utf8'))
            except (ValueError, UnicodeDecodeError):
                config = None
            if isinstance(config, dict):
                stable = {k: v for k, v in config.items() if k not in _RUNTIME_TOKENIZER_KEYS}
                h.update(json.dumps(stable, sort_keys=True).encode('utf8'))
                h.update(b'\0')
                continue
        h.update(file_digest(path).encode() + b'\0')
    return h.hexdigest()
