"""Test collections by one name: an ``irds:`` dataset id or a folder of plain files.

A folder holds ``docs.jsonl`` (``{"docno", "text"}`` per line), ``topics.tsv`` (``qid<TAB>query``) and
``qrels.txt`` (TREC qrels); ``irds:<id>`` is read through PyTerrier's ir_datasets bridge.
"""
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass
class Collection:
    """A test collection in memory, as :func:`load_collection` returns it.

    Args:
        name: the dataset id or the folder's name.
        corpus: the documents, ``{'docno', 'text'}`` dicts in collection order (what indexers and builders take).
        topics: ``qid, query`` (PyTerrier's topics frame).
        qrels: ``qid, docno, label`` (PyTerrier's qrels frame).

    Example::

        vaswani = load_collection("irds:vaswani")
        small = vaswani.subset(docs=1000, topics=30)      # relevant documents first, for a quick run
        pt.Experiment([retriever], small.topics, small.qrels, [nDCG @ 10])
    """
    name: str
    corpus: list[dict]
    topics: pd.DataFrame
    qrels: pd.DataFrame

    def subset(self, docs: int | None = None, topics: int | None = None) -> 'Collection':
        """A smaller collection for quick runs: the first ``topics`` topics, and a corpus of ``docs`` documents
        made of the documents judged relevant to those topics first (so every query has something to find, up to
        ``docs`` of them), then the collection's first other documents; the corpus keeps collection order and the
        qrels keep only the chosen topics and documents.  ``None`` keeps all of either."""
        if docs is not None and docs < 1 or topics is not None and topics < 1:
            raise ValueError(f'docs and topics must be >= 1 (or None), got {docs} and {topics}')
        chosen = self.topics if topics is None else self.topics.head(topics)
        qrels = self.qrels[self.qrels['qid'].isin(set(chosen['qid']))]
        corpus = self.corpus
        if docs is not None and docs < len(corpus):
            relevant = list(dict.fromkeys(qrels.loc[qrels['label'] > 0, 'docno']))[:docs]
            keep = set(relevant)
            others = (d['docno'] for d in corpus if d['docno'] not in keep)
            keep.update(itertools.islice(others, docs - len(keep)))
            corpus = [d for d in corpus if d['docno'] in keep]
            qrels = qrels[qrels['docno'].isin(keep)]
        name = f'{self.name}[{len(corpus)} docs, {len(chosen)} topics]'
        return Collection(name, corpus, chosen.reset_index(drop=True), qrels.reset_index(drop=True))


def irds_dataset(dataset_id: str):
    """``ir_datasets.load(dataset_id)``, or a one-line ``ValueError`` when ir_datasets has no such id (ir_datasets
    itself raises a bare ``KeyError``)."""
    import ir_datasets
    if dataset_id not in ir_datasets.registry:
        raise ValueError(f'irds:{dataset_id} is not an ir_datasets id (see https://ir-datasets.com for the ids)')
    return ir_datasets.load(dataset_id)


def load_collection(spec: str) -> Collection:
    """The corpus (a list of ``{docno, text}`` dicts, in collection order), topics and qrels of ``spec``.

    Args:
        spec: ``"irds:<id>"`` (an ir_datasets id, read through PyTerrier; offline with ``IR_DATASETS_HOME`` set to a
            prepared cache) or a folder holding ``docs.jsonl``, ``topics.tsv`` and ``qrels.txt``.

    Returns:
        A :class:`Collection`.

    Raises:
        ValueError: an ``irds:`` id that ir_datasets does not know.
        FileNotFoundError: a folder without the three files (naming the missing ones).

    Example::

        from pyterrier_lsr import load_collection
        cisi = load_collection("path/to/cisi")
        index.index(cisi.corpus)
    """
    spec = str(spec)
    if spec.startswith('irds:'):
        import pyterrier as pt
        irds_dataset(spec[len('irds:'):])
        dataset = pt.get_dataset(spec)
        corpus = [{'docno': d['docno'], 'text': d['text']} for d in dataset.get_corpus_iter(verbose=False)]
        return Collection(spec[len('irds:'):], corpus, dataset.get_topics(), dataset.get_qrels())
    folder = Path(spec)
    missing = [f for f in ('docs.jsonl', 'topics.tsv', 'qrels.txt') if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f'{spec} is neither an irds: id nor a collection folder (missing {missing})')
    import pyterrier as pt
    with open(folder / 'docs.jsonl', encoding='utf8') as f:
        corpus = [{'docno': str(d['docno']), 'text': d['text']} for d in map(json.loads, f)]
    topics = pd.read_csv(folder / 'topics.tsv', sep='\t', names=['qid', 'query'], dtype=str, quoting=3)
    return Collection(folder.name, corpus, topics, pt.io.read_qrels(str(folder / 'qrels.txt')))
