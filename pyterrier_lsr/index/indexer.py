"""``SpladeIndexer``: the indexer of a new :class:`~pyterrier_lsr.LsrIndex`, under the name PyTerrier users look for
(as ``PisaIndex(...).indexer()`` or pyterrier_dr's indexers)."""
from .artifact import LsrIndex

__all__ = ['SpladeIndexer']


def SpladeIndexer(path, model=None, **settings) -> LsrIndex:  # noqa: N802  (the indexer's user-facing name)
    """The indexer of a new :class:`LsrIndex` at ``path``: ``LsrIndex(path).indexer(model, **settings)``.

    Args:
        path: the index folder to create.
        model: a model of the project, recorded in the index; it encodes the documents' text unless they carry
            ``toks`` already (``(splade.doc_encoder() >> SpladeIndexer(path, splade)).index(corpus)``).  Without one,
            documents must carry ``toks`` and the index records no model.
        settings: scale, engines, overwrite, save_model, scoring, text_field, shard_size, verbose (see
            :class:`LsrIndex`).

    Returns:
        An :class:`LsrIndex` whose ``index(corpus)`` builds the folder and returns the index.

    Raises:
        ValueError: invalid settings, named (checked before anything is written).

    Example::

        index = (splade.doc_encoder() >> SpladeIndexer("vaswani.lsr", splade)).index(corpus)
        index.retriever().search("radio waves")
    """
    return LsrIndex(path).indexer(model, **settings)
