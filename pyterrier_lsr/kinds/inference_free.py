"""Inference-free (doc-only) SPLADE: a SPLADE document encoder with a static query side.

A model folder is an ordinary HF masked-LM folder plus ``idf.json`` — the layout OpenSearch's doc-only sparse models
publish — or a sentence-transformers sparse model whose query route is a ``SparseStaticEmbedding`` (its document route
a masked-LM transformer folder), read without importing sentence-transformers.
"""
import json
from collections.abc import Sequence
from pathlib import Path

from ..core.model_files import load_tokenizer
from ..models.splade import SpladeModel
from ..stages.query import WEIGHTS_FILE, StaticQueryEncoder, static_module_folder
from .splade import TorchSparseModel, check_tokenizer

__all__ = ['InferenceFreeSplade']


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

        model = load_model("my-doc-only-model")        # an HF folder + idf.json, e.g. from train_inference_free
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
        """HF model folder + tokenizer + ``idf.json``."""
        self._check_model()
        self.model.save_pretrained(str(folder))
        self.query_side.save_pretrained(str(folder))

    @classmethod
    def example(cls) -> 'InferenceFreeSplade':
        """SPLADE-tiny's documents and a binary query side over its vocabulary."""
        from .splade import Splade
        splade = Splade.example()
        return cls(splade.model, splade.tokenizer, StaticQueryEncoder.binary(splade.tokenizer), device='cpu',
                   batch_size=2)

    @classmethod
    def load_folder(cls, folder: Path, **kwargs) -> 'InferenceFreeSplade':
        """An OpenSearch-style folder (HF model + ``idf.json``) or a sentence-transformers doc-only layout; ``kwargs``
        go to :class:`~pyterrier_lsr.kinds.splade.TorchSparseModel`."""
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
