"""The retrievers an :class:`~pyterrier_lsr.LsrIndex` hands out: the checked ``query_toks`` boundary in front of an
engine, and a query encoder composed with it under a short, ``save_dir``-safe name."""
import pandas as pd
import pyterrier as pt

from ..core.checks import check_query_frame, check_vector

__all__ = ['QueryToksRetriever', 'Retriever', 'system_label']


class QueryToksRetriever(pt.Transformer):
    """Validates ``query_toks`` (naming the query and value of any bad weight), runs an engine, and returns
    ``qid, docno, score, rank`` plus the input's other columns (not ``query_toks``)."""

    def __init__(self, engine_retriever: pt.Transformer, index, engine: str, build_id: str, num_results: int,
                 params: dict):
        self.engine_retriever = engine_retriever
        self.index = index
        self.engine = engine
        self.build_id = build_id
        self.num_results = num_results
        self.params = params

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_query_frame(inp, ['query_toks'])
        if self.index.build_id() != self.build_id:  # the engine holds the files of the build it was opened on
            raise RuntimeError(f'{self.index.path} was rebuilt after this retriever was made; make a new one '
                               '(index.retriever() or index.toks_retriever())')
        if not len(inp):
            return pd.DataFrame(columns=[c for c in inp.columns if c != 'query_toks'] + ['docno', 'score', 'rank'])
        toks = [dict(check_vector(q, f'query {qid!r}')) for qid, q in zip(inp['qid'], inp['query_toks'])]
        # The checked queries go to the engine as they are: the frame is never copied to hold them.
        return self.engine_retriever.results(inp, toks)

    def fuse_rank_cutoff(self, k: int) -> 'QueryToksRetriever | None':
        """``retriever % k``: the engine asked for the top ``k`` (PyTerrier's rank cutoff protocol), on the build this
        retriever was made for (a rebuild since is refused when it runs, as here)."""
        if k >= self.num_results:
            return None
        fused = self.index.toks_retriever(k, self.engine, **self.params)
        fused.build_id = self.build_id
        return fused

    def subtransformers(self) -> dict:
        return {'engine': self.engine_retriever}

    def __repr__(self):
        return f'{self.engine.upper()}({self.index.path.name})'


def system_label(query_encoder, index, engine: str) -> str:
    """A short, stable table name: the model's label (``SPLADE (splade-tiny)``), or the query side's over the index
    (``IDF queries on splade.lsr``), with the engine when it is not PISA (``SPLADE (splade-tiny), BMP``)."""
    model = getattr(query_encoder, 'model', None)
    if getattr(model, 'label', None):
        label = model.label
    else:
        label = f'{getattr(query_encoder, "label", type(query_encoder).__name__)} on {index.path.name}'
    return label if engine == 'pisa' else f'{label}, {engine.upper()}'


class Retriever(pt.Compose):
    """A query encoder composed with an index's retriever, named by :func:`system_label`: a default
    ``pt.Experiment`` name that ``save_dir`` accepts (no ``>>``, no path)."""

    def __init__(self, label: str, *transformers: pt.Transformer):
        super().__init__(*transformers)
        self.label = label

    def __repr__(self):
        return self.label
