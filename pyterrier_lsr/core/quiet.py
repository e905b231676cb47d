"""Silences libraries that talk while they work: PISA's C++ log lines and progress bars (:func:`quiet_native`), and
transformers' own reports and bars ("Loading weights", "Writing model shards"; :func:`quiet_transformers`, around every
``from_pretrained`` and ``save_pretrained`` of the package: its own progress, shown with ``verbose=True``, is the
only one a user sees).

Python-level redirection does not reach C++ writes, so the file descriptors themselves are redirected to a temporary
file for the duration, and ``sys.stdout``/``sys.stderr`` with them; if the block fails, what was captured is written
to stderr, so nothing useful is lost.  The redirection is process-wide: output of other threads during the block is
captured too.

With ``progress=True`` only the native writes are captured: Python's own (our progress bars, made inside the block,
warnings, prints) still reach the terminal. That is the documented rule for builds with ``verbose=True``: progress,
not the libraries' log lines.
"""
import contextlib
import io
import os
import sys
import tempfile


def _to_terminal(stream, fd: int, saved: int):
    """A text stream writing where ``stream`` wrote before descriptor ``fd`` was redirected: ``stream`` itself when
    it does not write through ``fd`` (pytest's or a notebook's capture), else a new stream on the saved descriptor."""
    try:
        if stream.fileno() != fd:
            return stream, None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return stream, None
    own = open(os.dup(saved), 'w', buffering=1, encoding=getattr(stream, 'encoding', None) or 'utf-8',
               errors='replace')
    return own, own


@contextlib.contextmanager
def quiet_transformers():
    """Hides transformers' load report and its progress bars (loading and writing weights) for the block, then
    restores the settings found: the callers check the loading info themselves (and refuse or deliberately initialise
    what is missing), so the report only alarms users about expected keys."""
    from transformers.utils import logging
    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


@contextlib.contextmanager
def quiet_native(verbose: bool = False, progress: bool = False):
    """Captures what is written to stdout and stderr during the block, native writes included.

    Args:
        verbose: capture nothing (the libraries' own output is wanted).
        progress: capture the native writes only; Python's writes (progress bars made inside the block) are shown.
    """
    if verbose:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    python_side = io.StringIO()
    opened = []
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        failed = True
        try:
            if progress:
                (out, own_out), (err, own_err) = (_to_terminal(sys.stdout, 1, saved[0]),
                                                  _to_terminal(sys.stderr, 2, saved[1]))
                opened = [f for f in (own_out, own_err) if f is not None]
            else:
                out = err = python_side
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                yield
            failed = False
        finally:
            for f in opened:
                f.close()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors='replace')[-20_000:] + python_side.getvalue()[-20_000:])
