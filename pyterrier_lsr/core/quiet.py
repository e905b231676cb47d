"""Silences libraries that talk while they work (PISA's C++ log lines and progress bars, transformers' save/load bars).

Python-level redirection does not reach C++ writes, so the file descriptors themselves are redirected to a temporary
file for the duration, and ``sys.stdout``/``sys.stderr`` with them; if the block fails, what was captured is written
to stderr, so nothing useful is lost.  The redirection is process-wide: output of other threads during the block is
captured too.
"""
import contextlib
import io
import os
import sys
import tempfile


@contextlib.contextmanager
def quiet_native(verbose: bool = False):
    if verbose:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    python_side = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            with contextlib.redirect_stdout(python_side), contextlib.redirect_stderr(python_side):
                yield
            failed = False
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors='replace')[-20_000:] + python_side.getvalue()[-20_000:])
