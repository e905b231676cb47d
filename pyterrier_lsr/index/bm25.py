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
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pyterrier as pt
from tqdm.auto import tqdm

from ..core import storage
from ..core.checks import check_bool, check_documents, check_not_text
from ..core.collection import corpus_key
from ..core.quiet import quiet_native

BM25_KIND = 'bm25_index.pisa'

__all__ = ['BM25', 'BM25_KIND', 'bm25', 'bm25_index']


class BM25(pt.Transformer):
    """BM25 retrieval from a PISA text index (``pyterrier_pisa``'s, ``params`` go to its ``bm25()``), named by its
    folder in experiment tables; made by :func:`bm25`."""

    def __init__(self, index, **params):
        self.index = index
        with quiet_native():  # PISA prepares its BM25 files on first use, loudly
            self.retriever = index.bm25(**params)

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_not_text(inp, 'BM25')
        return self.retriever(inp)

    def __repr__(self):
        return 'BM25'


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
    if not any(any(c.isalnum() for c in text) for _, text in docs):
        raise ValueError(f'none of the {len(docs)} documents of {path} has a word (letters or digits); nothing could '
                         'be retrieved (and PISA would abort the process)')
    with storage.build_folder(path, BM25_KIND, overwrite, what='BM25 index') as tmp:
        with quiet_native(progress=verbose):  # our bar is made inside, so it reaches the terminal; PISA's log does not
            feed = tqdm(({'docno': docno, 'text': text} for docno, text in docs), total=len(docs), unit='doc',
                        desc=f'BM25 indexing {path.name}', disable=not verbose)
            pyterrier_pisa.PisaIndex(str(tmp), text_field='text').index(feed)
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
        params: PISA's BM25 settings (``k1``, ``b``, ``num_results``, ``threads``...).

    Returns:
        A :class:`BM25` retriever.

    Raises:
        ValueError, TypeError: a document PISA cannot store (naming it), an empty corpus, or a folder that is not ours.

    Example::

        table = pt.Experiment([bm25("vaswani.pisa", corpus)], topics, qrels, [nDCG @ 10])
    """
    return BM25(bm25_index(path, corpus, verbose, overwrite), **params)
