"""Costs and recall measured by ``benchmarks/scale.py``: the machine, a process's peak memory, wall and CPU ms per
query (one query a call and batched), the exact top 10 with ties, R@10 against it, and a setting chosen on tuning
queries; the corpus's shuffle and the queries' split."""
import gzip
import itertools
import json
import os
import platform
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pyterrier_lsr import LsrIndex
from pyterrier_lsr.core.quiet import quiet_native
from pyterrier_lsr.core.storage import write_json

FLAGS = ('avx2', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_int8', 'amx_bf16')
K = 10


def machine() -> dict:
    info = Path('/proc/cpuinfo').read_text() if Path('/proc/cpuinfo').exists() else ''
    flags = set(next((line.split(':', 1)[1].split() for line in info.splitlines() if line.startswith('flags')), []))
    model = next((line.split(':', 1)[1].strip() for line in info.splitlines() if line.startswith('model name')), '?')
    import torch
    return {'cpu': model, 'cores': os.cpu_count(), 'flags': {f: f in flags for f in FLAGS},
            'torch': torch.__version__, 'torch_threads': torch.get_num_threads(), 'python': platform.python_version()}


def rss_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


class PeakMemory:
    """The largest resident set size of this process sampled every ``interval`` seconds inside the ``with``."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.peak, self.start = interval, 0, 0
        self._stop = threading.Event()

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self):
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class Clock:
    """Wall and CPU milliseconds since it started: on a loaded shared machine the CPU time of this process (every
    thread, the engines' included) is what the code costs; the wall time adds the waits for a core."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def ms(self) -> tuple[float, float]:
        return (time.perf_counter() - self.wall) * 1e3, (time.process_time() - self.cpu) * 1e3


def per_query(call, frame: pd.DataFrame) -> tuple[dict, object]:
    """``call`` on each one-row frame of ``frame`` (after a warm-up call), then once on all of it: ms/query wall and
    CPU (mean, median, p99 one at a time; mean in the batched call), and the batched call's output."""
    call(frame.iloc[:1])
    one = []
    for i in range(len(frame)):
        clock = Clock()
        call(frame.iloc[[i]])
        one.append(clock.ms())
    wall, cpu = np.array(one).T
    clock = Clock()
    output = call(frame)
    batch_wall, batch_cpu = clock.ms()
    return {'ms_one': float(wall.mean()), 'ms_one_median': float(np.median(wall)),
            'ms_one_p99': float(np.percentile(wall, 99)), 'cpu_ms_one': float(cpu.mean()),
            'cpu_ms_one_median': float(np.median(cpu)), 'cpu_ms_one_p99': float(np.percentile(cpu, 99)),
            'ms_batch': batch_wall / len(frame), 'cpu_ms_batch': batch_cpu / len(frame)}, output


def batched(retriever, frame: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """ms/query (wall and CPU) of one call on all of ``frame``, after a warm-up call; and its results."""
    retriever(frame.iloc[:1])
    clock = Clock()
    results = retriever(frame)
    wall, cpu = clock.ms()
    return {'ms_batch': wall / len(frame), 'cpu_ms_batch': cpu / len(frame)}, results


def exact_truth(index: LsrIndex, frame: pd.DataFrame, depth: int = 100) -> dict:
    """Per query, the documents of PISA's exact top-``K`` with ties (every one scoring at least the ``K``-th), and
    how many a perfect engine returns (``K``, or fewer when fewer documents match)."""
    with quiet_native():
        results = index.toks_retriever(depth, 'pisa')(frame)
    truth = {}
    for qid, group in results.groupby('qid'):
        scores = group.sort_values('rank')
        kth = scores.score.iloc[min(K, len(scores)) - 1]
        truth[qid] = (sorted(scores.docno[scores.score >= kth]), min(K, len(scores)))
    return truth


def recall(results: pd.DataFrame, truth: dict) -> float:
    got = {qid: set(g.sort_values('rank').docno[:K]) for qid, g in results.groupby('qid')}
    return float(np.mean([len(got.get(qid, set()) & set(docs)) / n for qid, (docs, n) in truth.items() if n]))


def grid(index: LsrIndex, engine: str, settings: list[dict], frame: pd.DataFrame, truth: dict) -> list[dict]:
    rows = []
    for params in settings:
        with quiet_native():
            cost, results = batched(index.toks_retriever(K, engine, **params), frame)
        rows.append({**params, **cost, 'recall@10': recall(results, truth)})
        print(f'    {engine} {params}: {cost["cpu_ms_batch"]:.2f} CPU ms, R@10 {rows[-1]["recall@10"]:.4f}', flush=True)
    return rows


def choose(rows: list[dict], target: float) -> dict:
    """The fastest row (CPU ms) reaching ``target`` R@10 on the tuning queries, else the most accurate one."""
    meeting = [r for r in rows if r['recall@10'] >= target]
    return min(meeting, key=lambda r: r['cpu_ms_batch']) if meeting else max(rows, key=lambda r: r['recall@10'])


def postings(index: LsrIndex, frame: pd.DataFrame) -> float:
    df = index.document_frequencies()
    return float(np.mean([sum(df.get(t, 0) for t in toks) for toks in frame['query_toks']]))


# -- sparse query sides --------------------------------------------------------------------------------------------

def query_side(name: str, index: LsrIndex):
    """The query encoder named ``name`` over ``index``: ``splade`` (the index model's), ``idf``
    (:class:`~pyterrier_lsr.IDFQueryEncoder` of the index's document frequencies), either followed by ``-top<n>``
    (its ``n`` heaviest terms) or ``-ratio<r>`` (terms weighing at least ``r`` times its heaviest): :class:`Prune`."""
    from pyterrier_lsr import IDFQueryEncoder
    from pyterrier_lsr.stages.pruning import Prune
    base, _, rule = name.partition('-')
    if base not in ('splade', 'idf'):
        raise ValueError(f'query side {name!r}: splade or idf, optionally -top<n> or -ratio<r>')
    encoder = IDFQueryEncoder.from_index(index) if base == 'idf' else index.model().query_encoder()
    if rule.startswith('top'):
        return encoder >> Prune(top_n=int(rule[3:]))
    if rule.startswith('ratio'):
        return encoder >> Prune(ratio=float(rule[5:]))
    if rule:
        raise ValueError(f'query side {name!r}: unknown rule {rule!r}')
    return encoder


def ndcg10(retriever, collection) -> float:
    """nDCG@10 of ``retriever`` on every judged topic of ``collection`` (a :func:`load_collection` result)."""
    import ir_measures
    from ir_measures import nDCG
    with quiet_native():
        run = retriever(collection.topics[['qid', 'query']])
    run = run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'})[['query_id', 'doc_id', 'score']]
    qrels = collection.qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})
    run['query_id'], qrels['query_id'] = run['query_id'].astype(str), qrels['query_id'].astype(str)
    return float(ir_measures.calc_aggregate([nDCG @ 10], qrels[['query_id', 'doc_id', 'relevance']], run)[nDCG @ 10])


# -- corpus and queries ------------------------------------------------------------------------------------------

def shuffle_corpus(source: Path, target: Path, seed: int) -> dict:
    with gzip.open(source, 'rt', encoding='utf8') as f:
        lines = [line for line in f if line.strip()]
    order = np.random.default_rng(seed).permutation(len(lines))
    tmp = target.with_name(target.name + '.tmp')
    with gzip.open(tmp, 'wt', encoding='utf8', compresslevel=1) as f:
        f.writelines(lines[i] for i in order)
    os.replace(tmp, target)
    return {'documents': len(lines), 'seed': seed}


def documents(path: Path, n: int):
    with gzip.open(path, 'rt', encoding='utf8') as f:
        yield from (json.loads(line) for line in itertools.islice(f, n))


def query_split(corpus: Path, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    queries = pd.read_csv(corpus / 'queries.tsv', sep='\t', names=['qid', 'query'], dtype=str, quoting=3)
    order = np.random.default_rng(seed).permutation(len(queries))
    half = len(queries) // 2
    return (queries.iloc[np.sort(order[:half])].reset_index(drop=True),
            queries.iloc[np.sort(order[half:])].reset_index(drop=True))


def encode_queries(model, queries: pd.DataFrame, path: Path) -> dict:
    """Encodes the queries one at a time (the latency a searcher pays), then in one call; keeps the vectors."""
    stats, output = per_query(model.query_encoder(), queries)
    toks = list(output['query_toks'])
    write_json(path, dict(zip(queries['qid'], toks)))
    return {'queries': len(queries), **stats, 'terms_per_query': float(np.mean([len(t) for t in toks]))}


# -- measuring -----------------------------------------------------------------------------------------------------
