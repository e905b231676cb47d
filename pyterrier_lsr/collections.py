"""Test collections by one name: an ``irds:`` dataset id or a folder of plain files.

A folder holds ``docs.jsonl`` (``{"docno", "text"}`` per line), ``topics.tsv`` (``qid<TAB>query``) and
``qrels.txt`` (TREC qrels); ``irds:<id>`` is read through PyTerrier's ir_datasets bridge.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pandas as pd


@dataclass
class Collection:
    name: str
    corpus: List[dict]
    topics: pd.DataFrame
    qrels: pd.DataFrame


def load_collection(spec: str) -> Collection:
    """The corpus (a list of ``{docno, text}`` dicts, in collection order), topics and qrels of ``spec``."""
    spec = str(spec)
    if spec.startswith('irds:'):
        import pyterrier as pt
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
