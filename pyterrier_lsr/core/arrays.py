"""Large ``.npy`` arrays written without holding them in memory: rows appended chunk by chunk
(:class:`ArrayWriter`, for a corpus's token rows) and a file filled in place (:func:`array_file`, for embedding
caches), both failing with an ``OSError`` on a full disk rather than a signal.  Small arrays go through
:func:`~pyterrier_lsr.core.storage.write_array`."""
import errno
import os
import shutil
from pathlib import Path

from .storage import PathLike, remove_temporary

__all__ = ['ArrayWriter', 'array_file']


class ArrayWriter:
    """A ``.npy`` array written chunk by chunk of rows (a corpus's token rows need not fit in memory) into a folder
    being built (:func:`build_folder` makes the folder appear atomically): rows go to a scratch file beside ``path``,
    and :meth:`close` writes the header, the number of rows now known, and the rows after it."""

    def __init__(self, path: PathLike, dtype, row_shape: tuple = ()):
        import numpy as np
        self.np, self.path, self.dtype, self.row_shape, self.rows = np, Path(path), np.dtype(dtype), tuple(row_shape), 0
        self._scratch = self.path.with_name(f'.{self.path.name}.rows')
        self._file = open(self._scratch, 'wb')

    def add(self, rows) -> None:
        rows = self.np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f'{self.path.name}: rows of shape {rows.shape[1:]}, expected {self.row_shape}')
        self._file.write(rows.tobytes())
        self.rows += len(rows)

    def close(self) -> Path:
        self._file.close()
        header = {'descr': self.np.lib.format.dtype_to_descr(self.dtype), 'fortran_order': False,
                  'shape': (self.rows, *self.row_shape)}
        with open(self.path, 'wb') as out, open(self._scratch, 'rb') as rows:
            self.np.lib.format.write_array_header_2_0(out, header)
            shutil.copyfileobj(rows, out, 1 << 22)
            out.flush()
            os.fsync(out.fileno())
        self._scratch.unlink()
        return self.path


def array_file(path: PathLike, shape: tuple[int, ...], dtype='float32', resume: bool = False):
    """A memmap over a new ``.npy`` file at ``path`` to fill in place (``resume``: over the one there), its blocks
    allocated first: writing back pages of a sparse file (as ``np.lib.format.open_memmap`` makes) on a full disk is a
    SIGBUS that kills the process; allocated up front, it is an ``OSError`` here and a new file is removed."""
    import numpy as np

    path, dtype, fmt = Path(path), np.dtype(dtype), np.lib.format
    try:
        with open(path, 'rb+' if resume else 'wb') as f:
            if not resume:
                fmt.write_array_header_1_0(f, {'descr': fmt.dtype_to_descr(dtype), 'fortran_order': False,
                                               'shape': tuple(shape)})
            size = os.fstat(f.fileno()).st_size if resume else f.tell() + int(np.prod(shape)) * dtype.itemsize
            try:
                os.posix_fallocate(f.fileno(), 0, size)
            except OSError as ex:  # a file system without fallocate: a new file's rows are written as zeros
                if ex.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                while not resume and f.tell() < size:
                    f.write(bytes(min(1 << 20, size - f.tell())))
        return np.load(path, mmap_mode='r+')
    except OSError as ex:
        if not resume:
            remove_temporary(path)
        if ex.errno != errno.ENOSPC:
            raise
        raise OSError(ex.errno, f'{ex.strerror}: writing {path}; free some space or choose another folder') from None
