"""The wrapper of every model kind computed by one torch module over a tokenizer, and SPLADE itself.

:class:`TorchSparseModel` holds what such kinds share (the module, its tokenizer, device, truncation, batching,
precision, term names) and encodes through the one batching engine (:func:`~pyterrier_lsr.core.encoding.encode_texts`);
it implements :class:`~pyterrier_lsr.kinds.base.SparseModel`'s encoders, and each kind (:class:`Splade`, SAE-SPLADE,
Latent
Terms, inference-free) adds its folder format and what is its own.
"""
from collections.abc import Sequence
from pathlib import Path

from ..core.checks import check_int, check_max_length, checked_batch_size
from ..core.encoding import INT8, encode_texts, resolve_device, resolve_precision, vocabulary_terms
from ..core.folders import local_folder, model_settings
from ..core.model_files import ModelLoadError, load_tokenizer
from ..core.onnx_runtime import OnnxSparseModule, check_backend, load_onnx
from ..models.int8 import Int8Module
from ..models.splade import SpladeModel
from . import st_format
from .base import SparseModel

__all__ = ['TorchSparseModel', 'Splade', 'check_tokenizer', 'read_encoder', 'write_encoder', 'runtime_with_length']


def check_tokenizer(tokenizer, vocab_size: int, where='the model') -> None:
    """Raises :class:`ModelLoadError` unless the tokenizer's ids fit a head over ``vocab_size`` terms and cover at
    least half of them. Heads may have a few unused rows (vocabularies padded to a multiple of 64 or 128), but a
    tokenizer with ids beyond the head cannot be encoded, and one far smaller (a folder whose tokenizer files are
    missing gives a 5-token tokenizer mapping every word to [UNK]) belongs to another model."""
    size = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    if size > vocab_size or size < vocab_size // 2:
        raise ModelLoadError(f'{where}: the tokenizer has {size} token ids but the MLM head scores {vocab_size} terms; '
                             'the tokenizer files are missing or belong to another model')


class TorchSparseModel(SparseModel):
    """A kind computed by one torch module mapping ``(input_ids, attention_mask)`` to batch x terms weights.

    Documents and queries go through the same module (a kind with its own query side overrides
    :meth:`encode_queries`).

    Args:
        model: the torch module (``None`` for a kind that gets it later, e.g. Latent Terms before its SAE); a
            module with a ``terms`` attribute (latent ids) names its own terms, else the tokenizer's tokens do.
        tokenizer: its HF tokenizer.
        device: ``'cpu'``, ``'cuda'``...; default: CUDA when available (the CPU for ``precision='int8'``).
        max_length: texts are truncated to this many tokens, special tokens included (default 256, SPLADE's
            training length, or the tokenizer's ``model_max_length`` when smaller; queries are far shorter); at most
            the tokenizer's ``model_max_length``, the model's positions.
        batch_size: texts per forward pass.
        precision: ``'fp32'``, ``'bf16'`` or ``'fp16'`` autocast, or ``'int8'`` (CPU only: an int8 copy of the module
            made here, see :mod:`pyterrier_lsr.models.int8`); default fp32 on CPU, bf16 (or fp16) on GPU. bf16 on a CPU
            with AVX512-BF16 or AMX is about 2x faster, int8 about 3x with VNNI and 1.5x on AVX2 alone, each with
            slightly different weights (docs/results.md).
        name: the model's name (a hub name or folder) in reprs and indexes.
    """

    def __init__(self, model, tokenizer, device=None, max_length: int | None = None, batch_size: int = 32,
                 precision: str | None = None, name: str | None = None):
        self.max_length = check_max_length('max_length', max_length, tokenizer, 256)
        self.batch_size = check_int('batch_size', batch_size, 1)
        self.device = resolve_device(device, precision)
        self.tokenizer = tokenizer
        self.precision = resolve_precision(precision, self.device, int8=True)
        self.name = name
        self.model = self.terms = None
        if model is None and self.precision == INT8:
            raise ValueError(f"precision='int8' quantizes the model's torch module at construction, and "
                             f'{type(self).__name__} builds its own: it has no int8 path')
        if model is not None:
            # a sibling built from an int8 model's module (AsymmetricSplade's sides, ...) shares or drops its copy
            quantized = model if isinstance(model, Int8Module) else None
            model = (model.float_module if quantized else model).to(self.device).eval()
            # Models with their own vocabulary (latent ids, ...) name their terms; SPLADE's terms are the tokenizer's.
            self.terms = getattr(model, 'terms', None) or vocabulary_terms(tokenizer, model.vocab_size)
            if self.precision == INT8:
                model = quantized or Int8Module(model)
            self.model = model

    def runtime(self) -> dict:
        """The runtime options (device, truncation, batching, precision), to build a sibling model alike."""
        return {'device': self.device, 'max_length': self.max_length, 'batch_size': self.batch_size,
                'precision': self.precision}

    def _check_model(self):
        if self.model is None:
            raise ValueError(f'{self!r} has no model yet')

    def encode_docs(self, texts: Sequence, batch_size: int | None = None, verbose: bool = False,
                    desc: str = 'encoding') -> list[dict[str, float]]:
        self._check_model()
        return encode_texts(self.model, self.tokenizer, texts, self.terms,
                            batch_size=checked_batch_size(batch_size, self.batch_size), max_length=self.max_length,
                            device=self.device, precision=self.precision, verbose=verbose, desc=desc)

    def encode_queries(self, texts: Sequence, batch_size: int | None = None,
                       verbose: bool = False) -> list[dict[str, float]]:
        return self.encode_docs(texts, batch_size, verbose, desc='queries')

    def export_onnx(self, folder: str | Path, precision: str = 'fp32', opset: int | None = None,
                    overwrite: bool = True) -> Path:
        """Writes the document encoder as one ONNX graph with its pooling inside, the tokenizer and
        ``onnx_config.json`` (see :func:`~pyterrier_lsr.models.onnx_export.export_onnx` and ``docs/onnx.md``);
        ``Splade.from_pretrained(folder)`` or :func:`~pyterrier_lsr.load_model` then encode through onnxruntime.

        Args:
            folder: the folder to write (replaces only a model folder of ours, with ``overwrite``).
            precision: ``'fp32'``, or ``'int8'`` (onnxruntime's dynamic quantization).
            opset: the ONNX opset (default 17).
            overwrite: replace an existing model folder of ours.

        Returns:
            ``folder``.

        Raises:
            TypeError: a kind whose module is no masked LM max-pooled over its vocabulary (SAE-SPLADE, Latent Terms).
            ValueError: an invalid argument, naming it.
            ImportError: the ``onnx`` extra is not installed.
        """
        from ..models.onnx_export import DEFAULT_OPSET, export_onnx
        from .base import MODEL_ARTIFACT
        self._check_model()
        module = getattr(self.model, 'float_module', self.model)  # an int8 model exports its fp32 weights
        return export_onnx(module, self.tokenizer, folder, self.max_length, precision,
                           DEFAULT_OPSET if opset is None else opset, source=self.name, kind=self.kind,
                           artifact=MODEL_ARTIFACT, overwrite=overwrite)


class Splade(TorchSparseModel):
    """A SPLADE model (a masked LM's head, max-pooled ``log(1 + relu)``) and its tokenizer.

    Like every :class:`~pyterrier_lsr.kinds.base.SparseModel` it hands out ``query_encoder()``, ``doc_encoder()`` and
    ``scorer()``, and as a transformer itself (like pyterrier_dr's bi-encoders) it re-ranks a frame with ``query``
    and ``text``, and otherwise adds ``query_toks`` from ``query`` or ``toks`` from ``text``.

    Args:
        model: a :class:`~pyterrier_lsr.models.splade.SpladeModel`; usually made by :meth:`from_pretrained` (any
            ``AutoModelForMaskedLM`` name or folder) or :meth:`from_encoder` (an encoder without MLM head).
        tokenizer, device, max_length, batch_size, precision, name: see :class:`TorchSparseModel`.

    Raises:
        ModelLoadError: from :meth:`from_pretrained`, for a folder without MLM head (unless ``new_head=True``),
            invalid ``lsr`` settings or a tokenizer that does not fit the head.
        ValueError: an invalid runtime option (``max_length`` above the tokenizer's, ``precision='int8'`` on GPU...),
            naming it.

    Example::

        splade = Splade.from_pretrained("naver/splade-v3")     # offline: "splade-tiny"
        splade.encode(["radio waves"])                        # [{'radio': 2.1, 'waves': 1.9, ...}]
        index = LsrIndex("./my.lsr", splade)
        index.index(corpus)                                   # an iterable of {'docno', 'text'}
        pt.Experiment([index.retriever()], topics, qrels, [nDCG @ 10])
    """
    kind = 'splade'

    @property
    def display(self) -> str:
        # a model moved to a new vocabulary records it in its settings, so the label survives saving and loading
        settings = getattr(self.model, 'settings', None) or {}
        return 'VT-SPLADE' if 'vocab_transfer' in settings else 'SPLADE'

    @classmethod
    def load_folder(cls, folder: Path, new_head: bool = False, backend: str | None = None, **kwargs) -> 'Splade':
        """Any HF ``AutoModelForMaskedLM`` folder as SPLADE, or a sentence-transformers ``SparseEncoder`` folder of
        a fill-mask Transformer and SpladePooling (its pooling, activation and ``max_seq_length`` read, see
        :mod:`~pyterrier_lsr.kinds.st_format`); refuses (:class:`ModelLoadError`) one without MLM head unless
        ``new_head=True``, invalid ``lsr`` settings, and a tokenizer that does not fit the head (see
        :func:`check_tokenizer`).  ``kwargs`` go to :class:`TorchSparseModel` (device, max_length, batch_size,
        precision).  Use :meth:`from_pretrained` for names (``Splade.from_pretrained('naver/splade-v3')``).
        ``backend``: ``'torch'``, or ``'onnx'`` for a folder written by :meth:`export_onnx` (encoded by onnxruntime on
        the CPU); default: the folder's (see :func:`~pyterrier_lsr.core.onnx_runtime.check_backend`)."""
        if check_backend(backend, folder) == 'onnx':
            tokenizer = load_tokenizer(folder)
            module, kwargs = load_onnx(folder, kwargs)
            check_tokenizer(tokenizer, module.vocab_size, folder)
            return cls(module, tokenizer, **kwargs)
        layout = st_format.read_layout(folder)
        if layout is not None and layout.query is not None and not model_settings(folder).get('kind'):
            raise ModelLoadError(f'{folder} is a sentence-transformers Router (queries and documents through two '
                                 'routes): load it with load_model, which reads it as the kind it is')
        model, tokenizer, max_length = read_encoder(folder, '', new_head=new_head)
        return cls(model, tokenizer, **runtime_with_length(kwargs, max_length))

    @classmethod
    def example(cls) -> 'Splade':
        """SPLADE-tiny (an offline checkpoint)."""
        return cls.from_pretrained('splade-tiny', device='cpu', batch_size=8)

    @classmethod
    def from_encoder(cls, name_or_path: str, **kwargs) -> 'Splade':
        """SPLADE on an encoder without MLM head (e.g. ``'all-MiniLM-L6-v2'``) with a deliberately initialised new
        head (:func:`~pyterrier_lsr.models.heads.splade_from_encoder`: decoder tied to the input embeddings, identity
        transform, zero bias), and its tokenizer; ``kwargs`` go to :class:`TorchSparseModel`.  Calibrate it with
        :func:`~pyterrier_lsr.models.heads.calibrate_activation` before training (such a head starts dense)."""
        from ..models.heads import splade_from_encoder
        folder = local_folder(name_or_path)
        tokenizer = load_tokenizer(folder)
        model = splade_from_encoder(str(folder), tokenizer.all_special_ids)
        check_tokenizer(tokenizer, model.vocab_size, name_or_path)
        return cls(model, tokenizer, name=str(name_or_path), **kwargs)

    def write_folder(self, folder: Path):
        """An ordinary HF folder (weights, tokenizer, config; our settings go under ``lsr``) that is also a
        sentence-transformers ``SparseEncoder`` folder encoding the same vectors (:func:`write_encoder`); a model on
        the ONNX backend writes its graph, configuration and tokenizer."""
        self._check_model()
        if isinstance(self.model, OnnxSparseModule):
            self.model.save_pretrained(folder)
            self.tokenizer.save_pretrained(str(folder))
            return
        st_format.write_modules(folder, write_encoder(folder, self.model, self.tokenizer, self.max_length, '',
                                                      '1_SpladePooling'))


def runtime_with_length(kwargs: dict, max_length: int | None) -> dict:
    """The runtime options, truncating at the folder's declared length unless ``max_length`` is given."""
    return kwargs if kwargs.get('max_length') is not None or max_length is None else dict(kwargs, max_length=max_length)


def read_encoder(folder: Path, own: str, route: str = 'document', new_head: bool = False):
    """The SPLADE module, tokenizer and declared truncation (``None``: none declared) of one side of a model folder:
    our own folder's model in ``folder / own`` (or at the root of a folder without sentence-transformers files), a
    sentence-transformers folder's ``route`` (``'document'`` or ``'query'``) as its modules say."""
    layout = st_format.read_layout(folder)
    encoder = None if layout is None else getattr(layout, route)
    if layout is None:
        path, settings = folder, None
    elif model_settings(folder).get('kind'):
        path, settings = folder / own, None
    else:
        path, settings = encoder.path, {'pooling': encoder.pooling, 'activation': encoder.activation}
    tokenizer = load_tokenizer(path)
    model = SpladeModel.from_pretrained(str(path), special_token_ids=tokenizer.all_special_ids, new_head=new_head,
                                        settings=settings)
    check_tokenizer(tokenizer, model.vocab_size, folder)
    return model, tokenizer, None if encoder is None else st_format.declared_length(encoder, tokenizer)


def write_encoder(folder: Path, model, tokenizer, max_length: int, own: str, pooling_folder: str) -> list:
    """Writes a SPLADE module and its tokenizer into ``folder / own`` and the sentence-transformers modules that
    encode the same vectors: the fill-mask Transformer (that same folder; with a ``head_scale`` other than 1, a copy
    whose head has the scale folded in, beside it) and SpladePooling in ``folder / pooling_folder``.  Returns the
    modules, ``(type, path)``."""
    module = getattr(model, 'float_module', model)  # an int8 model saves its float weights
    module.save_pretrained(str(folder / own) if own else str(folder))
    tokenizer.save_pretrained(str(folder / own))
    transformer = own
    if float(module.settings['head_scale']) != 1.0:
        transformer = f'{own}_folded' if own else '0_Transformer'
        st_format.folded_head(module).save_pretrained(str(folder / transformer))
        tokenizer.save_pretrained(str(folder / transformer))
    return st_format.encoder_modules(folder, transformer, pooling_folder, max_length, module.settings['pooling'],
                                     module.settings.get('activation', 'relu'))
