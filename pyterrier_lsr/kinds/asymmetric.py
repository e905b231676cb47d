"""Asymmetric models: documents and queries through two models of one kind and one vocabulary.

Made by ``domain_adapt(..., DomainConfig(side='query'))``, which adapts the query encoder alone: documents keep the
encoder an index was built with, so an existing index of the starting model serves the adapted queries as it is. A
folder of SPLADE sides is a sentence-transformers ``Router`` of two encoders (see
:mod:`~pyterrier_lsr.kinds.st_format`; ``lsr.kind`` is ``asymmetric`` in the root's ``config.json``); one of other
sides is the document model's folder as its own kind writes it (the sides' kind in ``lsr.sides``) with the query
model's folder in its ``query/`` subfolder.
"""
from collections.abc import Sequence
from pathlib import Path

from ..core.folders import CONFIG_FILE, CONFIG_KEY, model_settings
from ..core.model_files import ModelLoadError
from . import st_format
from .base import SparseModel
from .loading import MODEL_KINDS, load_model, model_class
from .splade import Splade, TorchSparseModel, read_encoder, runtime_with_length, write_encoder

__all__ = ['AsymmetricSplade']

QUERY_FOLDER = 'query'
# SPLADE sides' modules, as sentence-transformers names them
DOCUMENT = 'document_0_Transformer'
QUERY = 'query_0_Transformer'


class AsymmetricSplade(SparseModel):
    """Documents through ``model``, queries through ``query_model``: two torch modules of one kind (``sides``: the
    :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel` kind both belong to, :class:`Splade` or
    :class:`~pyterrier_lsr.SaeSplade`, which saves and loads each of them) sharing one tokenizer and one vocabulary.

    An index built with it holds exactly what ``model`` alone would index, so an index of the document model serves it
    as it is: ``index.retriever(query_encoder=asymmetric.query_encoder())``.

    Args:
        model: the document side's torch module.
        tokenizer: the tokenizer both sides share.
        query_model: the query side's torch module, of the same kind and vocabulary size.
        sides: the kind of both sides, :class:`Splade` (default) or :class:`~pyterrier_lsr.SaeSplade`.
        query_max_length: the queries' truncation in tokens (default: ``max_length``, the documents').
        kwargs: the runtime options of :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel` and ``name``.

    Raises:
        ValueError: ``sides`` not a torch model kind, or two sides of different vocabulary sizes.
        ModelLoadError: from ``from_pretrained``, for a folder without its ``query/`` model or with sides of two
            kinds.

    Example::

        adapted, log = domain_adapt(Splade.from_pretrained("splade-tiny"), corpus, "runs/adapted", DomainConfig())
        adapted.save_pretrained("adapted")             # sentence_transformers.SparseEncoder("adapted") reads it too
        index.retriever(query_encoder=adapted.query_encoder())   # an index built by the starting model
    """
    kind = 'asymmetric'

    def __init__(self, model, tokenizer, query_model, sides: type = Splade, query_max_length: int | None = None,
                 **kwargs):
        if not (isinstance(sides, type) and issubclass(sides, TorchSparseModel)) or sides is AsymmetricSplade:
            raise ValueError(f'sides must be the model kind both models belong to (Splade, SaeSplade), got {sides!r}')
        if query_model.vocab_size != model.vocab_size:
            raise ValueError(f'the query model scores {query_model.vocab_size} terms, the document model '
                             f'{model.vocab_size}: both sides must share one vocabulary')
        name = kwargs.pop('name', None)
        self.sides = sides
        self.docs = sides(model, tokenizer, **kwargs)
        self.query_splade = sides(query_model, tokenizer, **dict(self.docs.runtime(),
                                                                 max_length=query_max_length or self.docs.max_length))
        self.name = name
        self.scoring = self.docs.scoring
        self.terms_namespace = self.docs.terms_namespace
        self.display = f'{self.docs.display}, own queries'

    # the document side's module, tokenizer and runtime options are the model's (training and indexing read them)
    model = property(lambda self: self.docs.model)
    tokenizer = property(lambda self: self.docs.tokenizer)
    terms = property(lambda self: self.docs.terms)
    device = property(lambda self: self.docs.device)
    max_length = property(lambda self: self.docs.max_length)
    query_max_length = property(lambda self: self.query_splade.max_length)
    batch_size = property(lambda self: self.docs.batch_size)
    precision = property(lambda self: self.docs.precision)

    def runtime(self) -> dict:
        return self.docs.runtime()

    def encode_docs(self, texts: Sequence, batch_size: int | None = None,
                    verbose: bool = False) -> list[dict[str, float]]:
        return self.docs.encode_docs(texts, batch_size, verbose)

    def encode_queries(self, texts: Sequence, batch_size: int | None = None,
                       verbose: bool = False) -> list[dict[str, float]]:
        return self.query_splade.encode_queries(texts, batch_size, verbose)

    def settings(self) -> dict:
        return dict(super().settings(), sides=self.sides.kind)

    def export_onnx(self, folder: str | Path, precision: str = 'fp32', opset: int | None = None,
                    overwrite: bool = True) -> Path:
        """The document model as one ONNX graph (see :meth:`Splade.export_onnx`): what an index of this model holds;
        the query model stays in torch."""
        from ..models.onnx_export import DEFAULT_OPSET, export_onnx
        from .base import MODEL_ARTIFACT
        module = getattr(self.docs.model, 'float_module', self.docs.model)  # int8: its fp32 weights
        return export_onnx(module, self.tokenizer, folder, self.max_length, precision,
                           DEFAULT_OPSET if opset is None else opset, source=self.name, kind=self.kind,
                           artifact=MODEL_ARTIFACT, overwrite=overwrite)

    def write_folder(self, folder: Path):
        """SPLADE sides: a sentence-transformers ``Router`` folder of two encoders (each model's weights, tokenizer
        and config in ``document_0_Transformer/`` and ``query_0_Transformer/``, each with its SpladePooling and
        truncation), which ``SparseEncoder(folder)`` encodes alike.  Other sides: the document model's folder as
        ``sides`` writes it, the query model's in ``query/``."""
        if self.sides is not Splade:
            self.docs.save_into(folder)
            self.query_splade.save_into(Path(folder) / QUERY_FOLDER)
            return
        document = write_encoder(folder, self.docs.model, self.tokenizer, self.docs.max_length, DOCUMENT,
                                 'document_1_SpladePooling')
        query = write_encoder(folder, self.query_splade.model, self.tokenizer, self.query_splade.max_length, QUERY,
                              'query_1_SpladePooling')
        st_format.write_router(folder, query, document)

    @classmethod
    def example(cls) -> 'AsymmetricSplade':
        """SPLADE-tiny on both sides (two copies, so they can drift apart)."""
        import copy
        splade = Splade.example()
        return cls(splade.model, splade.tokenizer, copy.deepcopy(splade.model), device='cpu', batch_size=2)

    @classmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'AsymmetricSplade':
        """Loads a folder written by :meth:`save_pretrained` or a sentence-transformers ``Router`` of two fill-mask
        Transformer + SpladePooling encoders (their poolings and truncations read: ``query_max_length`` is the query
        route's); ``kwargs``: runtime options."""
        kind = model_settings(folder).get('sides')
        kind = 'splade' if kind is None else kind  # folders written before `sides` hold SPLADE models
        if not isinstance(kind, str) or kind not in MODEL_KINDS or kind == cls.kind:
            raise ModelLoadError(f'{folder / CONFIG_FILE}: {CONFIG_KEY}.sides must name the kind of both models, one '
                                 f'of {sorted(set(MODEL_KINDS) - {cls.kind})}, got {kind!r:.60}')
        layout = st_format.read_layout(folder) if kind == Splade.kind else None
        if layout is not None and isinstance(layout.query, st_format.Encoder):
            docs, tokenizer, max_length = read_encoder(folder, DOCUMENT)
            queries, _, query_length = read_encoder(folder, QUERY, 'query')
            kwargs = runtime_with_length(kwargs, max_length)
            if kwargs.get('query_max_length') is None and query_length is not None:
                kwargs['query_max_length'] = query_length
            return cls(docs, tokenizer, queries, Splade, **kwargs)
        if not (folder / QUERY_FOLDER / 'config.json').is_file():
            raise ModelLoadError(f'{folder} has no {QUERY_FOLDER}/ model folder nor a sentence-transformers Router of '
                                 'two encoders: not an asymmetric model')
        sides = model_class(kind)
        docs = sides.load_folder(folder)
        queries = load_model(folder / QUERY_FOLDER)
        if type(queries) is not sides:
            raise ModelLoadError(f'{folder}: the documents\' model is a {kind} model, the queries\' a '
                                 f'{queries.kind} model')
        return cls(docs.model, docs.tokenizer, queries.model, sides, **kwargs)
