"""Failed writes as ``OSError``, whichever library wrote: the docs promise that a full disk (or any failed system call
while writing) is an ``OSError``, but native writers raise their own types (safetensors' ``SafetensorError`` and
tokenizers' ``Exception`` carry "(os error 28)" in their message; ``torch.save`` reports "unexpected pos" and drops
the system error).  Used by :mod:`.storage` around every write it makes or hosts."""
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# How native writers (safetensors, tokenizers: Rust) report a failed system call: "... (os error 28)".
_OS_ERROR = re.compile(r'\(os error (\d+)\)')

__all__ = ['write_errors', 'stream_writer']


@contextmanager
def write_errors(where) -> Iterator[None]:
    """A failed write inside the block is an ``OSError`` naming ``where``: a native writer's error whose message
    carries the system error is raised as the ``OSError`` it stands for; other errors pass unchanged."""
    try:
        yield
    except OSError:
        raise
    except Exception as ex:
        found = _OS_ERROR.search(str(ex))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, f'{os.strerror(code)} while writing into {where} ({type(ex).__name__})') from ex


class _RecordingWriter:
    """A binary file for writers that swallow the ``OSError`` of a failed write into their own error: every write goes
    to the file at once (unbuffered), and its error is kept."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        view = memoryview(data).cast('B')
        try:
            done = 0
            while done < len(view):
                done += os.write(self.file.fileno(), view[done:])
        except OSError as ex:
            self.error = ex
            raise
        return len(view)

    def flush(self) -> None:
        pass


def stream_writer(dump: Callable[[object], None]) -> Callable[[Path], None]:
    """``write(path)`` for :func:`~.storage.write_file` that calls ``dump(file)`` (e.g. ``torch.save``) and raises the
    ``OSError`` of a failed write, whatever ``dump`` made of it."""
    def write(path: Path) -> None:
        with open(path, 'wb', buffering=0) as f:
            recorder = _RecordingWriter(f)
            try:
                dump(recorder)
            except OSError:
                raise
            except Exception as ex:
                if recorder.error is not None:
                    raise recorder.error from ex
                raise
    return write
