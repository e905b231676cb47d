"""The transformers an :class:`~pyterrier_lsr.LsrIndex` hands out: the checked ``query_toks`` boundary in front of an
engine, a query encoder and that boundary as one retriever under a short, ``save_dir``-safe name, the index's default
retriever (``index`` and ``index % k`` as transformers), and the re-ranker over the stored vectors."""
import pandas as pd
import pyterrier as pt

from ..core.checks import check_query_frame, check_result_frame, check_vector, column_array
from ..stages.encoders import SparseTextEncoder
from ..stages.pruning import Prune
from . import tuning
from .engines.native import result_frame
from .quantization import quantize
from .ranking import first_depth, fusable_cutoff, tie_ordered, top_hits

__all__ = ['QueryToksRetriever', 'QueryRetriever', 'DefaultRetriever', 'StoredScorer', 'system_label']


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
        self.num_docs = index.num_docs()  # of the build `build_id` names: a call checks that it is still the one there

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_query_frame(inp, ['query_toks'])
        return self.search_toks(inp, list(inp['query_toks']))

    def search_toks(self, inp: pd.DataFrame, toks: list) -> pd.DataFrame:
        """:meth:`transform` of a checked query frame ``inp`` whose ``query_toks`` are given as ``toks`` (one per row,
        not yet checked); ``inp`` itself need not hold them."""
        if self.index.build_id() != self.build_id:  # the engine holds the files of the build it was opened on
            raise RuntimeError(f'{self.index.path} was rebuilt after this retriever was made; make a new one '
                               '(index.retriever() or index.toks_retriever())')
        if not len(inp):
            return pd.DataFrame(columns=[c for c in inp.columns if c != 'query_toks'] + ['docno', 'score', 'rank'])
        try:  # the qids are read (a column of the frame) only to name a bad query
            toks = [dict(check_vector(q, 'a query')) for q in toks]
        except (TypeError, ValueError):
            toks = [dict(check_vector(q, f'query {qid!r}')) for qid, q in zip(inp['qid'], toks)]
            raise

        def search(rows, depth):
            # The checked queries go to the engine as they are: the frame is never copied to hold them.
            return self._engine(depth).hits(toks if rows is None else [toks[row] for row in rows])
        hits, ranks = top_hits(search, self.num_results, self.num_docs)
        return result_frame(inp, hits, ranks)

    def _engine(self, depth: int) -> pt.Transformer:
        """The engine's retriever of the top ``depth``, made once per depth (:func:`~.ranking.top_hits` asks a little
        deeper than ``num_results``, and deeper at ties) on this retriever's build."""
        engines = self.__dict__.setdefault(
            '_engines', {first_depth(self.num_results, self.num_docs): self.engine_retriever})
        if depth not in engines:
            deeper = self.index.toks_retriever(depth, self.engine, **self.params)
            if deeper.build_id != self.build_id:
                raise RuntimeError(f'{self.index.path} was rebuilt after this retriever was made; make a new one '
                                   '(index.retriever() or index.toks_retriever())')
            engines[depth] = deeper.engine_retriever
        return engines[depth]

    def fuse_rank_cutoff(self, k: int) -> 'QueryToksRetriever | None':
        """``retriever % k``: the engine asked for the top ``k`` (PyTerrier's rank cutoff protocol), on the build this
        retriever was made for (a rebuild since is refused when it runs, as here); ``k <= 0`` is PyTerrier's
        ``RankCutoff`` (no rows), as for any transformer."""
        if not fusable_cutoff(k, self.num_results):
            return None
        fused = self.index.toks_retriever(k, self.engine, **self.params)
        fused.build_id = self.build_id
        return fused

    def subtransformers(self) -> dict:
        return {'engine': self.engine_retriever}

    def _key(self):
        return (str(self.index.path.absolute()), self.engine, self.build_id, self.num_results,
                tuple(sorted((k, repr(v)) for k, v in self.params.items())))

    def __eq__(self, other):
        return type(other) is type(self) and other._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f'{self.engine.upper()}({self.index.path.name})'


def _direct_query_side(encoder) -> tuple | None:
    """``(text encoder, [Prune, ...])`` when ``encoder`` is a text encoder to ``query_toks`` (the model's, a static
    table), alone or followed by pruning of ``query_toks``, with their own transforms; else ``None``."""
    stages = list(encoder._transformers) if type(encoder) is pt.Compose else [encoder]
    first, rest = stages[0], stages[1:]
    if not (isinstance(first, SparseTextEncoder) and type(first).transform is SparseTextEncoder.transform
            and first.out_field == 'query_toks'):
        return None
    if not all(type(stage) is Prune and stage.fields in (None, ['query_toks']) for stage in rest):
        return None
    return first, rest


def system_label(query_encoder, index, engine: str) -> str:
    """A short, stable table name: the model's label (``SPLADE (splade-tiny)``), or the query side's over the index
    (``IDF queries on splade.lsr``), with the engine when it is not PISA (``SPLADE (splade-tiny), BMP``)."""
    model = getattr(query_encoder, 'model', None)
    if getattr(model, 'label', None):
        label = model.label
    else:
        label = f'{getattr(query_encoder, "label", type(query_encoder).__name__)} on {index.path.name}'
    return label if engine == 'pisa' else f'{label}, {engine.upper()}'


class QueryRetriever(pt.Transformer):
    """Retrieval from ``query`` text: a query encoder, then an index's :class:`QueryToksRetriever`, as one transformer
    named by :func:`system_label` (a default ``pt.Experiment`` name that ``save_dir`` accepts: no ``>>``, no path).
    It stays one stage, with its name, inside a longer pipeline; ``% k`` asks the engine for ``k``."""

    def __init__(self, label: str, query_encoder: pt.Transformer, toks_retriever: QueryToksRetriever):
        self.label = label
        self.query_encoder = query_encoder
        self.toks_retriever = toks_retriever

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        direct = _direct_query_side(self.query_encoder)
        if direct is None or not isinstance(self.toks_retriever, QueryToksRetriever) or (
                direct[1] and 'toks' in inp.columns):  # Prune's default would prune that column too
            return self.toks_retriever(self.query_encoder(inp))
        # The texts are encoded (and pruned) and searched without the frames the encoder and Prune would build in
        # between: copying a frame cost more than a static table's encoding and about as much as a small index's
        # search (measured one query a call); the results are the same.
        encoder, prunes = direct
        check_query_frame(inp, [encoder.text_field])
        texts = column_array(inp, encoder.text_field).tolist()
        toks = encoder.encode(texts) if texts else []
        for prune in prunes:
            toks = [prune._prune(vector, 'query_toks', row) for row, vector in enumerate(toks)]
        return self.toks_retriever.search_toks(inp, toks)

    def fuse_rank_cutoff(self, k: int) -> 'QueryRetriever | None':
        fused = self.toks_retriever.fuse_rank_cutoff(k)
        return None if fused is None else QueryRetriever(self.label, self.query_encoder, fused)

    def subtransformers(self) -> dict:
        return {'query_encoder': self.query_encoder, 'toks_retriever': self.toks_retriever}

    def __eq__(self, other):
        return type(other) is type(self) and (other.query_encoder, other.toks_retriever) == \
            (self.query_encoder, self.toks_retriever)

    def __hash__(self):
        return hash((self.query_encoder, self.toks_retriever))

    def __repr__(self):
        return self.label


class DefaultRetriever(pt.Transformer):
    """An index as a transformer (``index(frame)``, ``index % k``): the toks retriever for frames that carry
    ``query_toks`` (e.g. after a query encoder), else the index's own :meth:`~pyterrier_lsr.LsrIndex.retriever`."""

    def __init__(self, index, num_results: int = 1000):
        self.index = index
        self.num_results = num_results

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        toks = 'query_toks' in inp.columns
        # Made once per build and recorded tuning, not per call: making one (the model's query encoder, the
        # encoder's identity for the tuning record, the engine) cost 8 ms a call (one query, SPLADE-tiny, 10,000
        # documents: 25 ms against a made retriever's 17).
        stamp = tuning.stamp(self.index)
        made = self.__dict__.setdefault('_made', {}).get(toks)
        if made is None or made[0] != stamp:
            make = self.index.toks_retriever if toks else self.index.retriever
            made = self._made[toks] = (stamp, make(self.num_results))
        return made[1](inp)

    def fuse_rank_cutoff(self, k: int) -> 'DefaultRetriever | None':
        return DefaultRetriever(self.index, k) if fusable_cutoff(k, self.num_results) else None

    def __eq__(self, other):
        return type(other) is type(self) and (str(other.index.path.absolute()), other.num_results) == \
            (str(self.index.path.absolute()), self.num_results)

    def __hash__(self):
        return hash((str(self.index.path.absolute()), self.num_results))

    def __repr__(self):
        return f'{self.index!r}' + (f' % {self.num_results}' if self.num_results != 1000 else '')


class StoredScorer(pt.Transformer):
    """Re-ranks ``qid, query_toks, docno`` candidates with the documents' stored vectors, in the retrievers' units
    (``sum_t int(q_t * scale) * int(d_t * scale)``, as PISA scores them); a docno the index does not hold is an error
    naming it.  Ranked by the one tie rule (:mod:`.ranking`), so the ranking does not depend on the input's order."""

    def __init__(self, index):
        self.index = index
        self.build_id = index.build_id()
        self.store = index.vectors()

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        check_result_frame(inp, ['query_toks'])
        if self.index.build_id() != self.build_id:
            raise RuntimeError(f'{self.index.path} was rebuilt after this scorer was made; make a new one '
                               '(index.scorer())')
        out = inp.drop(columns=[c for c in ('score', 'rank') if c in inp.columns])
        if not len(inp):
            return out.assign(score=pd.Series(dtype=float), rank=pd.Series(dtype='int64'))
        scale = self.index.scale
        docs = self.store.lookup(list(dict.fromkeys(inp['docno'])))
        docs = {docno: quantize(vector, scale) for docno, vector in docs.items()}
        queries = {}
        scores = []
        for qid, toks, docno in zip(inp['qid'], inp['query_toks'], inp['docno']):
            if qid not in queries:
                queries[qid] = quantize(check_vector(toks, f'query {qid!r}'), scale)
            query, doc = queries[qid], docs[docno]
            scores.append(float(sum(w * doc.get(t, 0) for t, w in query.items())))
        return tie_ordered(out.assign(score=scores).reset_index(drop=True), len(out))

    def __eq__(self, other):
        return type(other) is type(self) and str(other.index.path.absolute()) == str(self.index.path.absolute())

    def __hash__(self):
        return hash(str(self.index.path.absolute()))

    def __repr__(self):
        return f'{self.index!r}.scorer()'
