"""Training data: every source yields :class:`Example` (a query, its positive, hard negatives, optional teacher scores).

Sources: a DataFrame, an ir_datasets docpairs id (streamed), and self-supervised pairs from any corpus (pseudo-queries
sampled from documents, BM25 hard negatives mined over a PISA index). :func:`add_teacher_scores` attaches the scores of
any PyTerrier scorer for distillation.
"""

import math
import random
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyterrier as pt
from tqdm.auto import tqdm

from ..core.checks import is_missing
from ..core.collection import json_records
from ..core.encoding import as_text, is_blank


@dataclass
class Example:
    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)
    teacher: list[float] | None = None  # scores of [positive] + negatives

    def __post_init__(self):
        for name, text in [('query', self.query), ('positive', self.positive)] + [
            ('negative', n) for n in self.negatives
        ]:
            if is_blank(text):
                raise ValueError(f'training example has an empty or missing {name} text: {self!r}')
        # texts as the encoders read them (lone surrogates replaced, see as_text): the training loop tokenizes directly
        self.query, self.positive = as_text(self.query), as_text(self.positive)
        self.negatives = [as_text(n) for n in self.negatives]
        if self.teacher is not None and len(self.teacher) != 1 + len(self.negatives):
            raise ValueError(f'teacher has {len(self.teacher)} scores for {1 + len(self.negatives)} candidates')


def from_dataframe(df: pd.DataFrame, rows: Sequence[str] | None = None) -> list[Example]:
    """Rows of ``query, positive`` and ``negative`` (one text) or ``negatives`` (a list), and optionally
    ``teacher`` (a list of scores for positive + negatives).  An invalid row is named by ``rows[i]`` (default
    ``row <i>``)."""
    missing = [c for c in ('query', 'positive') if c not in df.columns]
    if not {'negative', 'negatives'} & set(df.columns):
        missing.append('negative (or negatives)')
    if missing:
        raise KeyError(f'training DataFrame lacks columns {missing}; has {list(df.columns)}')
    if not len(df):
        raise ValueError('training DataFrame is empty')
    out = []
    for i, row in enumerate(df.to_dict('records')):
        negatives = row['negatives'] if 'negatives' in row else [row['negative']]
        teacher = None if is_missing(row.get('teacher')) else row['teacher']  # rows without one beside rows with
        try:
            if not isinstance(negatives, (list, tuple)) or not isinstance(teacher, (list, tuple, type(None))):
                raise TypeError(f'"negatives" and "teacher" must be lists, got {negatives!r:.60} and {teacher!r:.60}')
            out.append(Example(row['query'], row['positive'], list(negatives), None if teacher is None else
                               list(teacher)))
        except (TypeError, ValueError) as ex:
            raise type(ex)(f'{rows[i] if rows is not None else f"row {i}"}: {ex}') from None
    return out


def from_json_file(path, limit: int | None = None) -> list[Example]:
    """Examples from a ``.jsonl`` file (one JSON object per line, the columns of :func:`from_dataframe`) or a
    ``.json`` file (a DataFrame as pandas writes it), the first ``limit`` only; errors name the file and line."""
    path = Path(path)
    if path.suffix != '.jsonl':
        try:
            frame = pd.read_json(path)
        except (ValueError, UnicodeDecodeError) as ex:
            raise ValueError(f'{path} is not a JSON DataFrame ({" ".join(str(ex).split())[:200]})') from None
        return from_dataframe(frame if limit is None else frame.head(limit))
    records, lines = [], []
    for where, record in json_records(path, 'an example\'s fields'):
        if limit is not None and len(records) == limit:
            break
        records.append(record)
        lines.append(where)
    if not records:
        raise ValueError(f'{path} holds no examples')
    try:
        return from_dataframe(pd.DataFrame(records), lines)
    except KeyError as ex:
        raise ValueError(f'{path}: {ex.args[0]}') from None


def from_irds_docpairs(dataset_id: str, limit: int | None = None) -> Iterator[Example]:
    """Streams ``(query, positive, negative)`` from an ir_datasets docpairs collection, e.g.
    ``msmarco-passage/train/triples-small``."""
    from ..core.collection import irds_dataset

    dataset = irds_dataset(dataset_id)
    if not dataset.has_docpairs():
        raise ValueError(f'{dataset_id} has no docpairs')
    queries = {q.query_id: q.text for q in dataset.queries_iter()}
    docs = dataset.docs_store()
    for i, pair in enumerate(dataset.docpairs_iter()):
        if limit is not None and i >= limit:
            return
        yield Example(queries[pair.query_id], docs.get(pair.doc_id_a).text, [docs.get(pair.doc_id_b).text])


_SENTENCE = re.compile(r'(?<=[.!?;])\s+|\n+')


def pseudo_query(text: str, rng: random.Random, min_words: int = 3, max_words: int = 12) -> str:
    """A random sentence of ``text``, cut to a random window of at most ``max_words`` words."""
    sentences = [s.split() for s in _SENTENCE.split(text) if len(s.split()) >= min_words] or [text.split()]
    words = rng.choice(sentences)
    size = rng.randint(min(min_words, len(words)), min(max_words, len(words)))
    start = rng.randint(0, len(words) - size)
    return ' '.join(words[start : start + size])


def self_supervised(
    corpus: Iterable[dict],
    num_negatives: int = 1,
    depth: int = 30,
    seed: int = 0,
    per_doc: int = 1,
    min_words: int = 3,
    max_words: int = 12,
    bm25_index=None,
    verbose: bool = True,
) -> list[Example]:
    """Self-supervised examples from a corpus of ``docno, text`` dicts: no queries needed.

    Each document yields ``per_doc`` pseudo-queries (a sentence, cut to a word window); the document is the positive;
    negatives are sampled from the BM25 top-``depth`` of the pseudo-query (over ``bm25_index``, a PISA index of the
    corpus, built in a temporary folder when omitted), never the positive nor a document with its exact text.
    """
    from ..index.bm25 import BM25
    from ..index.bm25 import bm25_index as build_bm25_index

    rng = random.Random(seed)
    docs = {d['docno']: d['text'] for d in corpus if not is_blank(d.get('text'))}
    if len(docs) < 2:
        raise ValueError('self-supervised training needs a corpus of at least 2 non-empty documents')
    with tempfile.TemporaryDirectory() as tmp:
        if bm25_index is None:
            bm25_index = build_bm25_index(f'{tmp}/bm25', ({'docno': k, 'text': v} for k, v in docs.items()), verbose)
        queries = pd.DataFrame(
            [
                {'qid': f'{docno}/{i}', 'query': pseudo_query(text, rng, min_words, max_words), 'pos': docno}
                for docno, text in docs.items()
                for i in range(per_doc)
            ]
        )
        bm25 = BM25(bm25_index, num_results=depth + 1, verbose=verbose)
        ranked = bm25(queries[['qid', 'query']]).groupby('qid')['docno'].apply(list).to_dict()
    docnos = list(docs)
    out = []
    for q in tqdm(queries.itertuples(), total=len(queries), desc='sampling negatives', disable=not verbose):
        pos_text = docs[q.pos]
        pool = [d for d in ranked.get(q.qid, []) if d != q.pos and docs[d] != pos_text]
        negatives = rng.sample(pool, min(num_negatives, len(pool)))
        while len(negatives) < num_negatives:  # too few BM25 candidates: random documents
            d = rng.choice(docnos)
            if d != q.pos and docs[d] != pos_text and d not in negatives:
                negatives.append(d)
        out.append(Example(q.query, pos_text, [docs[d] for d in negatives]))
    return out


def add_teacher_scores(
    examples: Sequence[Example], scorer: pt.Transformer, batch_size: int = 50_000, verbose: bool = True
) -> list[Example]:
    """Scores every (query, candidate) pair with a PyTerrier scorer (``qid, query, docno, text`` -> ``score``), e.g. a
    dense bi-encoder, BM25 or ``a + 0.1 * b``; returns examples carrying ``teacher``."""
    rows = [
        {'qid': str(i), 'query': ex.query, 'docno': f'{i}/{j}', 'text': text}
        for i, ex in enumerate(examples)
        for j, text in enumerate([ex.positive] + ex.negatives)
    ]
    scores = {}
    for start in tqdm(range(0, len(rows), batch_size), desc='teacher scores', disable=not verbose):
        res = scorer(pd.DataFrame(rows[start : start + batch_size]))
        scores.update(zip(res['docno'], res['score']))
    out = []
    for i, ex in enumerate(examples):
        teacher = [float(scores.get(f'{i}/{j}', math.nan)) for j in range(1 + len(ex.negatives))]
        if any(math.isnan(s) for s in teacher):
            raise ValueError(f'teacher returned no score for some candidates of example {i}')
        out.append(Example(ex.query, ex.positive, ex.negatives, teacher))
    return out


def from_qrels(
    topics: pd.DataFrame,
    qrels: pd.DataFrame,
    texts: dict,
    retriever: pt.Transformer,
    num_negatives: int = 3,
    depth: int = 30,
    seed: int = 0,
) -> list[Example]:
    """Supervised examples from real queries: one per (topic, relevant document) pair (``label > 0``; relevant
    documents in docno order), with ``num_negatives`` non-relevant documents sampled from the topic's ``retriever``
    top ``depth`` (e.g. BM25). Topics with fewer non-relevant candidates than that are skipped; the examples are
    shuffled (seeded). ``texts`` maps docno to text."""
    rng = random.Random(seed)
    relevant = qrels[qrels['label'] > 0].groupby('qid')['docno'].apply(set).to_dict()
    ranked = retriever(topics[['qid', 'query']]).groupby('qid')['docno'].apply(list).to_dict()
    out = []
    for qid, query in zip(topics['qid'], topics['query']):
        pool = [d for d in ranked.get(qid, [])[:depth] if d not in relevant.get(qid, ())]
        for docno in sorted(relevant.get(qid, ())):
            if len(pool) >= num_negatives:
                out.append(Example(query, texts[docno], [texts[d] for d in rng.sample(pool, num_negatives)]))
    rng.shuffle(out)
    return out
