"""BM25 over a PISA text index of a corpus, built once into a folder and reopened afterwards.

The corpus is checked before PISA sees it (:func:`~..core.checks.check_documents`: PISA stores docnos one per line
and would serve a duplicate twice, ``None`` as ``"None"``, and shift every docno after one holding a line break), and
the folder is built like every other artifact (:func:`~..core.storage.build_folder`): beside its final name, swapped
into place when complete, marked as ours with the key of its corpus, never into a folder of user files.  A second
call with the same corpus reopens it; with another corpus it is an error (or a rebuild, with ``overwrite=True``).

Progress (documents fed to PISA, with an estimate) is shown with ``verbose=True`` (the default) and silenced with
``verbose=False``. PISA's own log lines and bars (C++ writes) are captured either way, and shown only if the build
fails (:mod:`..core.quiet`); the retriever it returns prints nothing.
"""
import copy
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyterrier as pt
from tqdm.auto import tqdm

from ..core import storage
from ..core.checks import check_bm25, check_bool, check_documents, check_not_text, check_query_frame, column_array
from ..core.collection import corpus_key
from ..core.encoding import as_text, as_texts
from ..core.quiet import quiet_native
from .engines.native import result_frame
from .engines.pisa import pisa_hits, pisa_settings
from .ranking import Hits, first_depth, fusable_cutoff, top_hits

BM25_KIND = 'bm25_index.pisa'
#: the settings :class:`BM25` takes (PISA's BM25 parameters, checked before PISA sees them)
BM25_SETTINGS = ('k1', 'b', 'num_results', 'threads', 'verbose', 'query_algorithm')

__all__ = ['BM25', 'BM25_KIND', 'bm25', 'bm25_index']


def bm25_settings(params: dict) -> dict:
    """``params`` (:data:`BM25_SETTINGS`) checked, with their defaults: the one check of every BM25 setting, done
    before an index is built or PISA sees a value (``k1="0.9"`` is a TypeError naming ``k1``)."""
    unknown = sorted(set(params) - set(BM25_SETTINGS))
    if unknown:
        raise TypeError(f'BM25 has no setting {", ".join(map(repr, unknown))}; its settings are '
                        f'{", ".join(BM25_SETTINGS)}')
    k1, b = check_bm25(params.get('k1', 0.9), params.get('b', 0.4))
    return dict(pisa_settings(params.get('num_results', 1000), params.get('threads', 1), params.get('verbose', False),
                              params.get('query_algorithm')), k1=k1, b=b)


class BM25(pt.Transformer):
    """BM25 retrieval from a PISA text index (``pyterrier_pisa``'s), named by its folder in experiment tables; made by
    :func:`bm25`.  ``params``: :data:`BM25_SETTINGS`, checked here before PISA sees them; results follow the tie
    rule of :mod:`.ranking` (score, then docno)."""

    def __init__(self, index, **params):
        self.index = index
        settings = bm25_settings(params)
        self.k1, self.b, self.num_results = settings.pop('k1'), settings.pop('b'), settings.pop('num_results')
        self.settings = settings
        self._retrievers = {}
        self.retriever = self._retriever(first_depth(self.num_results, index.num_docs()))

    def _retriever(self, depth: int) -> pt.Transformer:
        """PISA's BM25 retriever of the top ``depth`` (capped at the number of documents), made once per depth."""
        depth = min(depth, self.index.num_docs())
        if depth not in self._retrievers:
            with quiet_native():  # PISA prepares its BM25 files on first use, loudly
                self._retrievers[depth] = self.index.bm25(k1=self.k1, b=self.b, num_results=depth, **self.settings)
        return self._retrievers[depth]

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_not_text(inp, 'BM25')
        check_query_frame(inp, ['query'])
        given = column_array(inp, 'query').tolist()
        texts = [pisa_text(q) for q in as_texts(given, 'column "query"')]
        if texts != given:  # only then a copy, with the texts PISA can read
            inp = inp.assign(query=texts)
        if not len(inp):
            return self.retriever(inp)

        def search(rows, depth):
            retriever = self._retriever(depth)
            if retriever.verbose:  # its progress bar: pyterrier-pisa's own transform, read back as arrays
                asked = inp if rows is None else inp.iloc[rows]
                return Hits.of_frame(retriever(asked.assign(qid=[str(i) for i in range(len(asked))])))
            return pisa_hits(retriever, texts if rows is None else [texts[row] for row in rows])
        hits, ranks = top_hits(search, self.num_results, self.index.num_docs())
        return result_frame(inp, hits, ranks)

    def fuse_rank_cutoff(self, k: int) -> 'BM25 | None':
        """``bm25 % k``: PISA asked for the top ``k`` (PyTerrier's rank cutoff protocol); ``k <= 0`` is PyTerrier's
        ``RankCutoff`` (no rows), as for any transformer."""
        if not fusable_cutoff(k, self.num_results):
            return None
        fused = copy.copy(self)
        fused.num_results = int(k)
        return fused

    def __repr__(self):
        return 'BM25'


def pisa_text(text: str) -> str:
    """``text`` as PISA can read it (a C string of UTF-8): a lone surrogate as U+FFFD, as every encoder takes it
    (:func:`~..core.encoding.as_text`; PISA's feeding thread died on it and dropped the document), NUL as a space (it
    ends a C string; a query holding one failed inside PISA)."""
    return as_text(text).replace('\x00', ' ')


def pisa_terms(text: str) -> list[str]:
    """The terms PISA's BM25 indexer takes from ``text`` (its own tokenizer: runs of ASCII letters and digits)."""
    import pyterrier_pisa
    return pyterrier_pisa.tokenize(pisa_text(text))


# PISA's text indexer, as pyterrier_pisa runs it (PisaIndexer._index), in a process of its own that loads the native
# module alone (pyterrier_pisa's package would import PyTerrier: seconds per build).
_CHILD = ('import importlib.util, sys\n'
          'spec = importlib.util.spec_from_file_location("pyterrier_pisa._pisathon", sys.argv[1])\n'
          'pisa = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(pisa)\n'
          'pisa.index(sys.argv[2], sys.argv[3], "porter2", 100000, 1)\n'
          'print(pisa.num_docs(sys.argv[3]))\n')  # read here: a truncated file may crash the reader too
_COLLECTION = '.collection.txt'


def _pisa_text_index(folder: Path, docs: list[tuple[str, str]], desc: str, verbose: bool) -> None:
    """PISA's porter2 text index of ``docs`` in ``folder`` (pyterrier_pisa's layout and ``pt_meta.json``), built in a
    child process: PISA does not check its writes and aborts its process when one failed (a full disk), which must
    end this call with an error, not end the caller's process.  The collection is written first as PISA reads it
    (``docno text`` a line)."""
    collection = folder / _COLLECTION
    with open(collection, 'w', encoding='utf8') as f:
        for docno, text in tqdm(docs, unit='doc', desc=desc, disable=not verbose):
            f.write(f'{docno} {pisa_text(text).replace(chr(10), " ").replace(chr(13), " ")}\n')
    from pyterrier_pisa import _pisathon
    # PISA's log lines and bars are captured whatever verbose says, and shown only if the build fails
    done = subprocess.run([sys.executable, '-c', _CHILD, _pisathon.__file__, str(collection), str(folder)], text=True,
                          errors='replace', capture_output=True)
    collection.unlink()
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-20_000:])
        said = ' / '.join(line for line in (done.stderr or '').splitlines()[-3:] if line.strip())[-400:]
        _failed(folder, f'stopped (exit status {done.returncode}{"; it said: " + said if said else ""})')
    indexed = int(done.stdout.split()[-1])
    if indexed != len(docs):  # past its first files, a failed write leaves documents out, silently
        _failed(folder, f'indexed {indexed} documents out of {len(docs)}')
    storage.write_json(folder / 'pt_meta.json', {'type': 'sparse_index', 'format': 'pisa',
                                                 'package_hint': 'pyterrier-pisa', 'stemmer': 'porter2'})


def _failed(folder: Path, what: str):
    """The error of a BM25 build that PISA did not complete: an ``OSError`` when the disk is (nearly) full, its usual
    cause, else a ``RuntimeError`` (a failed write it does not check, e.g. past a file size limit)."""
    if shutil.disk_usage(folder).free < 64 * 2 ** 20:
        raise OSError(errno.ENOSPC, f'{os.strerror(errno.ENOSPC)}: PISA {what} while writing the BM25 index into '
                      f'{folder}')
    raise RuntimeError(f'PISA {what} while building the BM25 index in {folder}: a write failed (PISA checks none)')


def bm25_index(path, corpus: Iterable[dict], verbose: bool = True, overwrite: bool = False):
    """A ``pyterrier_pisa.PisaIndex`` of ``corpus``'s ``text`` (``docno, text`` dicts) at ``path``: reopened when
    ``path`` holds our BM25 index of the same corpus, else built (``overwrite=True`` replaces our BM25 index of
    another corpus; any other folder is refused)."""
    import pyterrier_pisa
    check_bool('verbose', verbose)
    check_bool('overwrite', overwrite)
    path = Path(path)
    docs = check_documents(corpus, where=f'the corpus of {path}')
    key = corpus_key(dict(docs))
    if storage.is_artifact(path, BM25_KIND):
        recorded = (storage.read_marker(path) or {}).get('corpus')
        if recorded == key:
            return pyterrier_pisa.PisaIndex(str(path), text_field='text')
        if not overwrite:
            raise ValueError(f'{path} holds a BM25 index of another corpus (corpus key {recorded}, this corpus of '
                             f'{len(docs)} documents has {key}); choose another path, or pass overwrite=True to '
                             'rebuild it')
    # PISA splits docnos at whitespace (they would come back cut) and aborts the process on a corpus without a term
    spaced = next((docno for docno, _ in docs if any(c.isspace() for c in docno)), None)
    if spaced is not None:
        raise ValueError(f'docno {spaced!r} holds whitespace, which a BM25 (PISA) index cannot keep: use docnos '
                         'without spaces or tabs')
    if not any(pisa_terms(text) for _, text in docs):
        raise ValueError(f'none of the {len(docs)} documents of {path} has a word PISA indexes: its BM25 tokenizer '
                         'keeps runs of ASCII letters and digits only (text in other scripts, e.g. Chinese or Greek, '
                         'gives none), so nothing could be retrieved (and PISA would abort the process); for such text '
                         'use a learned sparse index, whose model has its own tokenizer')
    with storage.build_folder(path, BM25_KIND, overwrite, what='BM25 index') as tmp:
        _pisa_text_index(tmp, docs, f'BM25 indexing {path.name}', verbose)
        storage.mark(tmp, BM25_KIND, corpus=key, num_docs=len(docs))
    return pyterrier_pisa.PisaIndex(str(path), text_field='text')


def bm25(path, corpus: Iterable[dict], verbose: bool = True, overwrite: bool = False, **params) -> BM25:
    """:class:`BM25` over a PISA index of ``corpus``'s text at ``path`` (:func:`bm25_index`: built once, reopened for
    the same corpus).

    Args:
        path: the index folder (new, or our BM25 index).
        corpus: ``{'docno', 'text'}`` dicts, docnos unique strings (checked before PISA sees them).
        verbose: a progress bar while indexing; ``False``: silent. PISA's own output is captured either way (shown
            only if the build fails), and retrieval prints nothing.
        overwrite: replace our BM25 index of another corpus (never another folder).
        params: PISA's BM25 settings (:data:`BM25_SETTINGS`: ``k1``, ``b``, ``num_results``, ``threads``,
            ``query_algorithm``), checked before PISA sees them.

    Returns:
        A :class:`BM25` retriever.

    Raises:
        ValueError, TypeError: a document PISA cannot store (naming it), an empty corpus, a corpus without a term
            PISA's tokenizer keeps, a folder that is not ours, or a BM25 setting of the wrong type or range.

    Example::

        table = pt.Experiment([bm25("vaswani.pisa", corpus)], topics, qrels, [nDCG @ 10])
    """
    bm25_settings(params)  # before any work
    return BM25(bm25_index(path, corpus, verbose, overwrite), **params)  # retrieval prints nothing
