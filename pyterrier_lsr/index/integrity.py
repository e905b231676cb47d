"""What an index records about itself at build time, and the checks that notice a damaged, edited or stale folder.

At build time every file of the index is recorded in ``lsr.json`` (``files``: its size and sha256), and the digest of
``lsr.json`` itself, with a fresh build id, goes into the folder's marker (written last, see
:mod:`pyterrier_lsr.core.storage`).  Full digests of every file cost one read of the index at build time, next to the
encoding of the corpus, which dominates it by orders of magnitude.

* On open (cheap, every ``LsrIndex`` use that reads metadata): ``lsr.json``'s digest against the marker, its fields,
  every file's size, and the digests of files up to :data:`~pyterrier_lsr.core.storage.CHEAP_DIGEST_BYTES` (metadata
  such as ``df.json``, ``vectors/vectors.json``, engines' term tables and settings, the model's configuration): a
  truncated shard or an edited table is an error naming the file before any engine reads it.  The recording and the
  checks themselves (:func:`~pyterrier_lsr.core.storage.record_files`, :func:`~pyterrier_lsr.core.storage.check_files`)
  live in
  the storage layer, shared with the MaxSim store and the SSR index.
* When the stored model is loaded: the digests of every file of the model folder (weights edited in place).
* :meth:`LsrIndex.verify <pyterrier_lsr.LsrIndex.verify>`: every digest.

These checks catch accidents (a copy cut short, a file edited by hand, a folder rebuilt under a running process),
not an adversary who rewrites the records too.
"""
import math
from pathlib import Path, PurePosixPath

from ..core.checks import MAX_SCALE, check_float, check_int

__all__ = ['check_meta', 'check_scoring', 'safe_relative']


def safe_relative(name) -> bool:
    """Whether ``name`` is a relative path that stays inside its folder (no ``..``, not absolute)."""
    if not isinstance(name, str) or not name:
        return False
    path = PurePosixPath(name)
    return not path.is_absolute() and '..' not in path.parts and '\\' not in name


def check_scoring(scoring) -> dict:
    """``{'kind': 'dot'}`` or ``{'kind': 'bm25', 'k1': >= 0, 'b': in [0, 1]}``, else a ``ValueError``."""
    kind = scoring.get('kind') if isinstance(scoring, dict) else None
    if kind == 'dot' and set(scoring) == {'kind'}:
        return scoring
    if kind == 'bm25' and set(scoring) == {'kind', 'k1', 'b'}:
        try:
            check_float('k1', scoring['k1'], 0)
            check_float('b', scoring['b'], 0, 1)
            return scoring
        except (TypeError, ValueError):
            pass
    raise ValueError(f"scoring must be {{'kind': 'dot'}} or {{'kind': 'bm25', 'k1': >= 0, 'b': in [0, 1]}}, "
                     f'got {scoring!r:.100}')


def check_meta(meta: dict, file: Path, engines) -> dict:
    """``meta`` (an ``lsr.json``) if its fields have the types and ranges the index relies on, else one
    ``ValueError`` naming ``file`` and the field."""
    try:
        check_float('scale', meta.get('scale'), 0, MAX_SCALE, exclusive_minimum=True)
        check_int('num_docs', meta.get('num_docs'), 1)
        check_scoring(meta.get('scoring'))
        _check_engines(meta.get('engines'), engines)
        _check_records(meta.get('files'))
        _check_model(meta.get('model'))
    except (TypeError, ValueError) as ex:
        raise ValueError(f'{file}: {ex}') from None
    return meta


def _check_engines(built, engines) -> None:
    if not isinstance(built, dict) or not all(isinstance(v, dict) for v in built.values()):
        raise ValueError(f'engines must map engine names to their settings, got {built!r:.80}')
    unknown = sorted(set(built) - set(engines))
    if unknown:
        raise ValueError(f'engines {unknown} are unknown (known: {sorted(engines)})')
    for name, settings in built.items():
        for key, value in settings.items():  # NaN or inf factors would score everything alike
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f'engines.{name}.{key} must be finite, got {value}')


def _check_records(files) -> None:
    if not isinstance(files, dict):
        raise ValueError(f'files must map file names to their sizes and digests, got {type(files).__name__}')
    for name, record in files.items():
        if not safe_relative(name) or not isinstance(record, dict) or \
                not isinstance(record.get('sha256'), str) or isinstance(record.get('bytes'), bool) or \
                not isinstance(record.get('bytes'), int):
            raise ValueError(f'files: the entry {name!r:.60} must be a relative name with its bytes and sha256')


def _check_model(model: dict | None) -> None:
    if model is None:
        return
    if not isinstance(model, dict) or not safe_relative(model.get('path')):
        raise ValueError(f'model must be null or record a "path" inside the index (relative, no ".."), '
                         f'got {model!r:.80}')
    for key in ('kind', 'name'):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise ValueError(f'model.{key} must be a string, got {model[key]!r:.60}')
    if model.get('precision') not in (None, 'int8'):
        raise ValueError(f'model.precision must be absent or "int8", got {model["precision"]!r:.60}')
