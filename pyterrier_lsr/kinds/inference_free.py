"""Inference-free (doc-only) SPLADE: a SPLADE document encoder with a static query side.

A model folder is a sentence-transformers sparse model (``Router``: a ``SparseStaticEmbedding`` query route, a
fill-mask Transformer + SpladePooling document route, see :mod:`~pyterrier_lsr.kinds.st_format`) with our settings in
the root's ``config.json``; ``SparseEncoder(folder)`` encodes the same vectors.  Also read: such folders written by
sentence-transformers, and the layout OpenSearch's doc-only sparse models publish (an HF masked-LM folder plus
``idf.json``).
"""
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from ..core.model_files import ModelLoadError, load_tokenizer
from ..models.splade import SpladeModel
from ..stages.query import WEIGHTS_FILE, StaticQueryEncoder, static_module_folder
from . import st_format
from .splade import TorchSparseModel, check_tokenizer, read_encoder, runtime_with_length, write_encoder

__all__ = ['InferenceFreeSplade']

# the modules' folders, as sentence-transformers names them
DOCUMENT = 'document_0_Transformer'
QUERY = 'query_0_SparseStaticEmbedding'


class InferenceFreeSplade(TorchSparseModel):
    """SPLADE documents (``model``) and a :class:`StaticQueryEncoder` query side (``query_side``): no transformer runs
    at query time.

    Args:
        model: the document side, a :class:`~pyterrier_lsr.models.splade.SpladeModel`.
        tokenizer: the document model's tokenizer (the query side tokenizes with the same vocabulary).
        query_side: the static query table, e.g. an :class:`IDFQueryEncoder`.
        kwargs: the runtime options of :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel`.

    Raises:
        FileNotFoundError: from ``from_pretrained``/:func:`~pyterrier_lsr.load_model`, for a folder without its query
            table (``idf.json`` or a sentence-transformers ``SparseStaticEmbedding``).

    Example::

        model = load_model("my-doc-only-model")        # e.g. from train_inference_free; SparseEncoder reads it too
        index = LsrIndex("./doc-only.lsr", model)
        index.index(corpus)
        index.retriever().search("radio waves")        # queries: a table look-up, no transformer
    """
    kind = 'inference-free'
    display = 'inference-free SPLADE'

    def __init__(self, model: SpladeModel, tokenizer, query_side: StaticQueryEncoder, **kwargs):
        super().__init__(model, tokenizer, **kwargs)
        self.query_side = query_side

    def encode_queries(self, texts: Sequence, batch_size: int | None = None,
                       verbose: bool = False) -> list[dict[str, float]]:
        return self.query_side.encode(texts)

    def write_folder(self, folder: Path):
        """A sentence-transformers ``Router`` folder: the document model (weights, tokenizer, config) in
        ``document_0_Transformer/`` with its SpladePooling, the query table as a ``SparseStaticEmbedding`` (truncating
        queries as the query side does)."""
        self._check_model()
        document = write_encoder(folder, self.model, self.tokenizer, self.max_length, DOCUMENT,
                                 'document_1_SpladePooling')
        side = self.query_side
        weight = torch.zeros(self.model.vocab_size, dtype=torch.float64)
        vocabulary = side.tokenizer.get_vocab()
        for token, value in side.weights.items():
            if vocabulary.get(token, self.model.vocab_size) < self.model.vocab_size:
                weight[vocabulary[token]] = value
        query = st_format.static_module(folder / QUERY, side.tokenizer, weight, side.max_length)
        st_format.write_router(folder, [query], document)

    @classmethod
    def example(cls) -> 'InferenceFreeSplade':
        """SPLADE-tiny's documents and a binary query side over its vocabulary."""
        from .splade import Splade
        splade = Splade.example()
        return cls(splade.model, splade.tokenizer, StaticQueryEncoder.binary(splade.tokenizer), device='cpu',
                   batch_size=2)

    @classmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'InferenceFreeSplade':
        """A folder written by :meth:`save_pretrained` or by sentence-transformers (a ``Router`` of a
        ``SparseStaticEmbedding`` and a fill-mask Transformer + SpladePooling: its pooling and truncations read), or an
        OpenSearch-style folder (HF model + ``idf.json``); ``kwargs`` go to
        :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel`."""
        layout = st_format.read_layout(folder)
        if layout is not None:
            if not isinstance(layout.query, st_format.Static):
                raise ModelLoadError(f'{folder}: its sentence-transformers query route is not a SparseStaticEmbedding '
                                     '(not an inference-free model): load it with load_model')
            model, tokenizer, max_length = read_encoder(folder, DOCUMENT)
            query = StaticQueryEncoder.from_pretrained(str(layout.query.path))
            return cls(model, tokenizer, query, **runtime_with_length(kwargs, max_length))
        doc_folder = folder
        if not (folder / WEIGHTS_FILE).exists():
            found = [p.parent for p in sorted(folder.rglob('config.json'))
                     if p.parent != folder and 'model_type' in json.loads(p.read_text())]
            if not found or static_module_folder(folder) is None:
                raise FileNotFoundError(f'{folder} has neither {WEIGHTS_FILE} nor a sentence-transformers '
                                        'SparseStaticEmbedding query module')
            doc_folder = found[0]
        tokenizer = load_tokenizer(doc_folder)
        model = SpladeModel.from_pretrained(str(doc_folder), special_token_ids=tokenizer.all_special_ids)
        check_tokenizer(tokenizer, model.vocab_size, folder)
        return cls(model, tokenizer, StaticQueryEncoder.from_pretrained(str(folder)), **kwargs)
