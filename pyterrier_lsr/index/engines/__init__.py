"""Retrieval engines an :class:`~pyterrier_lsr.LsrIndex` can be searched with, all built from its stored vectors.

An engine is an object with

* ``name`` (the key below), ``subfolder`` (where in the index folder its files live; ``''`` for the index root),
  ``extra`` (the pip extra that installs it) and ``scorings`` (the index scorings it supports, e.g. ``{'dot'}``);
* ``build(index, folder, **params) -> dict``: writes its files into ``folder`` (a temporary folder, moved into place
  when complete) from ``index.vectors()`` and ``index.scale``; returns the settings to record in ``lsr.json``;
* ``retriever(index, folder, num_results, **params) -> pt.Transformer``: maps ``qid, query_toks`` frames (floats in
  model units) to ``qid, docno, score, rank`` results (with the input's other columns but ``query_toks``); its
  ``results(frame, toks)`` does the same with the frame's ``query_toks`` given already checked, as ``toks``, and
  ``hits(toks)`` returns those results as arrays (:class:`~pyterrier_lsr.index.ranking.Hits`), which the index's
  retrievers rank under the tie rule before they build their one result frame.

Engines are looked up by name, so optional ones import only when used.
"""
import importlib

ENGINES = {
    'pisa': 'pyterrier_lsr.index.engines.pisa:PisaEngine',
    'bmp': 'pyterrier_lsr.index.engines.bmp:BmpEngine',
    'seismic': 'pyterrier_lsr.index.engines.seismic:SeismicEngine',
}

__all__ = ['ENGINES', 'get_engine', 'check_engines']


def get_engine(name: str):
    if name not in ENGINES:
        raise ValueError(f'unknown engine {name!r}; choose one of {sorted(ENGINES)}')
    module, cls = ENGINES[name].split(':')
    return getattr(importlib.import_module(module), cls)()


def check_engines(engines) -> tuple[str, ...]:
    """``engines`` (one name, or a list or tuple of names) as a tuple of known engine names, each once: an engine
    named twice would be built twice into one folder (PISA's second build, at the index root, removed the stored
    vectors); anything else is a ``TypeError`` naming what is allowed."""
    names = (engines,) if isinstance(engines, str) else engines
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f'engines must be an engine name or a list of them ({", ".join(sorted(ENGINES))}), got '
                        f'{type(engines).__name__} {engines!r:.60}')
    for name in names:
        get_engine(name)
    return tuple(dict.fromkeys(names))
