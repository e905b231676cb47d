"""End-to-end scale benchmark on a real corpus: encode -> LsrIndex -> PISA, BMP, Seismic, beside BM25 on PISA.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/scale.py --corpus path/to/packages --data path/to/scale-data \
        --sizes 10000 100000 all --threads 1

The corpus folder holds ``docs.jsonl.gz`` (``{docno, text}`` a line) and ``queries.tsv`` (``qid<TAB>query``). The
documents are shuffled once (``--seed``) and every size is a prefix of that order (nested samples). Per size:

* ``encode``: the prefix encoded by SPLADE-tiny (``--precision``; ``--compare-precisions`` encode it again up to
  ``--compare-up-to`` documents, for their rates) through :func:`pyterrier_lsr.scaleout.encode` in this process,
  shard by shard into ``<data>/vectors-<precision>`` (nested sizes reuse the shards already written);
* ``index``: an :class:`~pyterrier_lsr.LsrIndex` with PISA from those vectors;
* ``bmp-<B>``: BMP on documents reordered by graph bisection, block size ``B`` (each of ``--bmp-block-sizes`` up to
  ``--tune-builds-up-to`` documents, beyond it the size chosen at the largest size tuned), its ``alpha``/``beta``
  grid measured on the tuning queries;
* ``seismic``: Seismic with its default build settings, its ``query_cut``/``heap_factor`` grid on the tuning queries;
* ``bm25``: PISA's BM25 text index of the same texts;
* ``measure``: each engine's setting chosen on the tuning half (the fastest with R@10 >= ``--target-recall`` there;
  the exact one when none reaches it), and BM25's fastest query algorithm, measured on the other half: ms/query one
  query at a time and in one batched call, R@10 against PISA's exact ranking (ties at the 10th score count),
  postings per query (the summed document frequencies of its terms: what an exhaustive traversal reads);
* ``sparse-<side>`` (sizes in ``--query-sides-at``): a query side of ``--query-sides`` (``idf``: IDF weights of the
  index's terms; ``splade``: the model's; ``-top<n>`` / ``-ratio<r>``: pruned) tuned by ``LsrIndex.tune`` on the
  tuning half against its own exact ranking, then every engine's setting chosen there measured on the test half
  through ``index.retriever`` (query encoding included; ``--one-a-call-queries`` of them one a call), beside BM25
  (the reference: pyterrier-pisa's own retriever, as PyTerrier users call it; and this library's ``BM25``).
Then ``effectiveness-<name>``: nDCG@10 of each query side and engine setting on ``--effectiveness`` collections.

The queries are split once into two seeded halves. Every stage records its wall and CPU seconds, the peak resident
memory sampled while it ran (beside the process's resident memory when it started), the load average, and its
output's size on disk, in ``<data>/stages/<stage>.json``, written when it is done: a rerun skips done stages and
resumes an interrupted encoding from its last shard. The result JSON (``--output``) and the plot (``--plot``: cost
against corpus size, log-log) are rewritten after each stage.
"""
import argparse
import itertools
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scale_costs import (
    Clock,
    K,
    PeakMemory,
    batched,
    choose,
    documents,
    encode_queries,
    exact_truth,
    grid,
    machine,
    ndcg10,
    per_query,
    postings,
    query_side,
    query_split,
    recall,
    shuffle_corpus,
)
from scale_plot import plot

from pyterrier_lsr import LsrIndex, Splade, load_collection, scaleout
from pyterrier_lsr.core.quiet import quiet_native
from pyterrier_lsr.core.storage import read_json, write_json
from pyterrier_lsr.index.bm25 import BM25
from pyterrier_lsr.index.tuning import exact_tops
from pyterrier_lsr.index.tuning import recall as recall_against
from pyterrier_lsr.index.vectors import VectorStore
from pyterrier_lsr.report.costs import index_size_bytes

PISA_ALGORITHMS = ('maxscore', 'block_max_wand', 'block_max_maxscore')
BMP_GRID = [dict(alpha=a, beta=b) for b in (1., 0.8) for a in (1., 0.95, 0.9, 0.8, 0.7, 0.6, 0.5)]
SEISMIC_GRID = [dict(query_cut=c, heap_factor=h) for c in (5, 10, 20, 30, 50) for h in (0.5, 0.7, 0.8, 0.9, 1.0)]
MIB = 2 ** 20


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob('*') if f.is_file())


def public(value):
    """An absolute path as ``path/to/<name>`` (no machine folders in the results); other values as given."""
    return f'path/to/{Path(value).name}' if isinstance(value, str) and os.path.isabs(value) else value


class Stages:
    """Done-markers (``<data>/stages/<name>.json``, the stage's record) and the result file rebuilt from them."""

    def __init__(self, args):
        self.args, self.folder = args, Path(args.data) / 'stages'
        self.folder.mkdir(parents=True, exist_ok=True)
        self.machine = machine()

    def record(self, name: str) -> dict | None:
        path = self.folder / f'{name}.json'
        return read_json(path, 'stage record') if path.is_file() else None

    def run(self, name: str, work) -> dict:
        """``work()``'s record (a dict), measured, or the one kept from a run before."""
        done = self.record(name)
        if done is not None:
            return done
        print(f'{datetime.now(timezone.utc):%H:%M:%S} {name} ...', flush=True)
        load, start, cpu = os.getloadavg(), time.perf_counter(), time.process_time()
        with PeakMemory() as memory:
            result = work()
        record = {**result, 'wall_s': round(time.perf_counter() - start, 2),
                  'cpu_s': round(time.process_time() - cpu, 2), 'torch_threads': torch.get_num_threads(),
                  'peak_rss_mib': round(memory.peak / MIB, 1),
                  'rss_at_start_mib': round(memory.start / MIB, 1), 'load_start': load, 'load_end': os.getloadavg(),
                  'finished': datetime.now(timezone.utc).isoformat(timespec='seconds')}
        write_json(self.folder / f'{name}.json', record)
        print(f'  {name}: {record["wall_s"]} s, peak {record["peak_rss_mib"]} MiB', flush=True)
        self.publish()
        return record

    def publish(self):
        records = {p.stem: read_json(p, 'stage record') for p in sorted(self.folder.glob('*.json'))}
        write_json(Path(self.args.output), {
            # absolute paths are this machine's: recorded as path/to/<name>
            'command': ' '.join(['python'] + [public(a) for a in sys.argv]),
            'machine': self.machine,
            'corpus': 'packages: 963,715 package descriptions (8.5 words a document on average, shorter than MS '
                      'MARCO passages, about 56); nested prefixes of one seeded shuffle',
            'settings': {k: [public(x) for x in v] if isinstance(v, list) else v for k, v in vars(self.args).items()
                         if k not in ('corpus', 'data', 'output', 'plot')},
            'stages': records})
        if self.args.plot:
            plot(records, Path(self.args.plot), self.args.precision)


# -- stages --------------------------------------------------------------------------------------------------------

class Run:
    """The stages of one invocation, over the data folder ``args.data``."""

    def __init__(self, args):
        self.args, self.data = args, Path(args.data)
        self.stages = Stages(args)
        self.shuffled = self.data / 'shuffled.jsonl.gz'
        self.tune, self.test = query_split(Path(args.corpus), args.seed)

    def model(self, precision: str):
        return Splade.from_pretrained(self.args.model, precision=precision, batch_size=self.args.batch_size)

    def index_path(self, n: int) -> Path:
        return self.data / f'index-{n}'

    def frame(self, queries: pd.DataFrame) -> pd.DataFrame:
        toks = read_json(self.data / f'queries-{self.args.precision}.json', 'encoded queries')
        return queries.assign(query_toks=[toks[q] for q in queries['qid']])[['qid', 'query_toks']]

    def encode(self, precision: str, n: int) -> dict:
        folder = self.data / f'vectors-{precision}'
        store = scaleout.encode(documents(self.shuffled, n), self.model(precision), folder, num_workers=0,
                                shard_size=self.args.shard_size, verbose=False)
        # Nested sizes share the shards: the cost of n documents is that of the shards holding them, whenever encoded.
        shards = [read_json(folder / f'part-{i:05d}.json', 'shard record')
                  for i in range(-(-len(store) // self.args.shard_size))]
        seconds, cpu = sum(s['seconds'] for s in shards), sum(s['cpu_seconds'] for s in shards)
        return {'precision': precision, 'documents': len(store), 'encode_s': round(seconds, 2),
                'encode_cpu_s': round(cpu, 2), 'docs_per_s': round(len(store) / seconds, 1),
                'docs_per_cpu_s': round(len(store) / cpu, 1), 'vector_bytes': store.total_bytes()}

    def encode_ray(self, n: int) -> dict:
        """The first ``n`` documents on ``--ray-workers`` local Ray workers of one thread each (Ray's start-up
        included in the wall time), checked against the in-process vectors."""
        folder = self.data / f'vectors-{self.args.precision}-ray{self.args.ray_workers}'
        clock = Clock()
        store = scaleout.encode(documents(self.shuffled, n), self.model(self.args.precision), folder,
                                num_workers=self.args.ray_workers, threads_per_worker=1,
                                shard_size=self.args.shard_size, verbose=False)
        wall = clock.ms()[0] / 1e3
        shards = [read_json(path, 'shard record') for path in sorted(folder.glob('part-*.json'))]
        local = VectorStore(self.data / f'vectors-{self.args.precision}')
        return {'precision': self.args.precision, 'workers': self.args.ray_workers, 'documents': len(store),
                'docs_per_s': round(len(store) / wall, 1),
                'docs_per_worker_cpu_s': round(len(store) / sum(s['cpu_seconds'] for s in shards), 1),
                'worker_pids': sorted({s['pid'] for s in shards}),
                'equal_to_in_process': list(store) == list(itertools.islice(local, len(store)))}

    def index(self, n: int) -> dict:
        store = VectorStore(self.data / f'vectors-{self.args.precision}')
        index = LsrIndex(self.index_path(n), self.model(self.args.precision), scale=self.args.scale, overwrite=True,
                         verbose=False)
        index.index({'docno': docno, 'toks': toks} for docno, toks in itertools.islice(store, n))
        vectors = folder_bytes(self.index_path(n) / 'vectors')
        return {'documents': index.num_docs(), 'bytes': index_size_bytes(index.path), 'vector_bytes': vectors,
                'pisa_build_s': index.meta['engines']['pisa']['build_seconds']}

    def truth(self, n: int) -> dict:
        index = LsrIndex(self.index_path(n))
        queries = pd.concat([self.frame(self.tune), self.frame(self.test)])
        write_json(self.data / f'truth-{n}.json', exact_truth(index, queries))
        return {'queries': len(queries), 'postings_per_query': postings(index, queries)}

    def tuning(self, n: int, engine: str, settings: list[dict]) -> list[dict]:
        truth = read_json(self.data / f'truth-{n}.json', 'exact rankings')
        tune = self.frame(self.tune)
        return grid(LsrIndex(self.index_path(n)), engine, settings, tune, {q: truth[q] for q in tune['qid']})

    def bmp(self, n: int, block_size: int) -> dict:
        clock = Clock()
        index = LsrIndex(self.index_path(n)).build_engine('bmp', overwrite=True, block_size=block_size, reorder=True)
        build_cpu_s = clock.ms()[1] / 1e3
        built = index.meta['engines']['bmp']
        rows = [{'block_size': block_size, **r} for r in self.tuning(n, 'bmp', BMP_GRID)]
        return {'block_size': block_size, 'build_s': built['build_seconds'], 'build_cpu_s': round(build_cpu_s, 2),
                'bytes': folder_bytes(index.path / 'bmp'), 'tuning': rows}

    def seismic(self, n: int) -> dict:
        clock = Clock()
        index = LsrIndex(self.index_path(n)).build_engine('seismic', overwrite=True)
        build_cpu_s = clock.ms()[1] / 1e3
        built = index.meta['engines']['seismic']
        return {'build_s': built['build_seconds'], 'build_cpu_s': round(build_cpu_s, 2),
                'bytes': folder_bytes(index.path / 'seismic'),
                'tuning': self.tuning(n, 'seismic', SEISMIC_GRID)}

    def bm25(self, n: int) -> dict:
        import pyterrier_pisa
        path = self.data / f'bm25-{n}'
        index = pyterrier_pisa.PisaIndex(str(path), text_field='text', overwrite=True)
        with quiet_native():
            index.index(documents(self.shuffled, n))
            BM25(index, num_results=K)(self.tune.iloc[:1])  # PISA compresses its files on first use: part of a build
        return {'documents': index.num_docs(), 'bytes': folder_bytes(path)}

    def postings(self, n: int) -> dict:
        """Terms and postings per query (all queries) of SPLADE-tiny's query vectors and of BM25's stemmed, stopped
        query terms: the work an exhaustive traversal of each index does."""
        from pyterrier_lsr.report.costs import System
        queries = pd.concat([self.tune, self.test])
        lsr = System('SPLADE-tiny', None, str(self.index_path(n)))
        bm25 = System('BM25', None, str(self.data / f'bm25-{n}'), stemmer='porter2')
        out = {}
        for name, system, terms in (('lsr', lsr, list(self.frame(queries)['query_toks'])),
                                    ('bm25', bm25, bm25.query_terms(queries))):
            df, _, key = system.document_frequencies()
            out[name] = {'terms_per_query': float(np.mean([len(t) for t in terms])),
                         'postings_per_query': float(np.mean([sum(df.get(key(t), 0) for t in q) for q in terms]))}
        return out

    def block_sizes(self, n: int) -> list[int]:
        """Every block size up to ``--tune-builds-up-to`` documents; beyond, the one chosen at the largest tuned."""
        if n <= self.args.tune_builds_up_to:
            return self.args.bmp_block_sizes
        measured = (int(p.stem.split('-')[1]) for p in self.stages.folder.glob('measure-*.json'))
        tuned = [m for m in measured if m <= self.args.tune_builds_up_to]
        if not tuned:
            raise ValueError(f'{n} documents: no size up to --tune-builds-up-to was measured to choose the block size')
        return [self.stages.record(f'measure-{max(tuned)}')['engines']['bmp']['block_size']]

    def measure(self, n: int) -> dict:
        """Each engine's setting chosen on the tuning queries (PISA's and BM25's fastest query algorithm), measured
        on the test queries; the speed-ups over BM25 from the medians of one-query calls (CPU ms)."""
        import pyterrier_pisa
        index = LsrIndex(self.index_path(n))
        truth = read_json(self.data / f'truth-{n}.json', 'exact rankings')
        test = self.frame(self.test)
        bmp = choose([r for b in self.block_sizes(n) for r in self.stages.record(f'bmp-{b}-{n}')['tuning']],
                     self.args.target_recall)
        if index.meta['engines']['bmp']['block_size'] != bmp['block_size']:
            index.build_engine('bmp', overwrite=True, block_size=bmp['block_size'], reorder=True)
        algorithms = [{'query_algorithm': a} for a in PISA_ALGORITHMS]
        chosen = {'pisa': choose(self.tuning(n, 'pisa', algorithms), 1.), 'bmp': bmp,
                  'seismic': choose(self.stages.record(f'seismic-{n}')['tuning'], self.args.target_recall)}
        engines = {}
        for engine, row in chosen.items():
            params = {k: v for k, v in row.items() if k in ('query_algorithm', 'alpha', 'beta', 'query_cut',
                                                            'heap_factor')}
            with quiet_native():
                stats, results = per_query(index.toks_retriever(K, engine, **params), test)
            engines[engine] = {**params, 'block_size': row.get('block_size'), **stats,
                               'recall@10': recall(results, {q: truth[q] for q in test['qid']}),
                               'tuning': {k: row[k] for k in ('ms_batch', 'cpu_ms_batch', 'recall@10')}}
        text = pyterrier_pisa.PisaIndex(str(self.data / f'bm25-{n}'))
        rows = [{**a, **batched(BM25(text, num_results=K, **a), self.tune[['qid', 'query']])[0]} for a in algorithms]
        best = min(rows, key=lambda r: r['cpu_ms_batch'])['query_algorithm']
        stats, _ = per_query(text.bm25(num_results=K, query_algorithm=best), self.test[['qid', 'query']])
        ours, _ = per_query(BM25(text, num_results=K, query_algorithm=best), self.test[['qid', 'query']])
        engines['bm25'] = {'query_algorithm': best, **stats, 'tuning': rows, 'pyterrier_lsr': ours}
        encoding = self.stages.record(f'queries-{self.args.precision}')
        # Medians of CPU ms: on a loaded shared machine wall times and means carry the other processes' bursts.
        bm25_ms = engines['bm25']['cpu_ms_one_median']
        speedups = {e: {'engine_only': bm25_ms / r['cpu_ms_one_median'],
                        'with_query_encoding': bm25_ms / (r['cpu_ms_one_median'] + encoding['cpu_ms_one_median']),
                        'recall@10': r['recall@10']} for e, r in engines.items() if e != 'bm25'}
        return {'documents': index.num_docs(), 'test_queries': len(test), 'engines': engines,
                'speedup_over_bm25': speedups, 'query_encoding': encoding}

    def sparse(self, n: int, side: str) -> dict:
        """One query side at ``n`` documents: ``LsrIndex.tune`` on the tuning half (every engine's grid, against the
        exact ranking of this query side), then each engine's cheapest setting reaching the target there measured on
        the test half through ``index.retriever`` (query encoding included), R@10 against this side's exact ranking;
        BM25 measured again in the same stage, so that both share its machine state."""
        import pyterrier_pisa
        index = LsrIndex(self.index_path(n))
        encoder = query_side(side, index)
        with quiet_native():
            record = index.tune(self.tune, self.args.target_recall, query_encoder=encoder, verbose=False)
        test = self.test[['qid', 'query']]
        frame = encoder(test)[['qid', 'query_toks']]
        truth = exact_tops(index, frame, K)
        one = test.iloc[:self.args.one_a_call_queries]
        encoding, _ = per_query(encoder, one)
        engines = {}
        for engine in index.meta['engines']:
            row = choose([dict(r, **{'recall@10': r['recall'], 'cpu_ms_batch': r['cpu_ms']})
                          for r in record['rows'] if r['engine'] == engine], self.args.target_recall)
            retriever = index.retriever(K, engine, query_encoder=encoder, **row['settings'])
            with quiet_native():
                stats, _ = per_query(retriever, one)
                batch, results = batched(retriever, test)
            stats.update(batch)  # every test query in one call: its cost and the results R@10 is taken from
            engines[engine] = {'settings': row['settings'], **stats, 'recall@10': recall_against(results, truth, K),
                               'tuning': {'cpu_ms_batch': row['cpu_ms'], 'recall@10': row['recall']}}
        tuned = index.retriever(K, query_encoder=encoder).toks_retriever
        algorithm = self.stages.record(f'measure-{n}')['engines']['bm25']['query_algorithm']
        text = pyterrier_pisa.PisaIndex(str(self.data / f'bm25-{n}'))
        with quiet_native():  # BM25 as pyterrier-pisa's retriever serves it, and through this library's BM25
            bm25, _ = per_query(text.bm25(num_results=K, query_algorithm=algorithm), one)
            bm25.update(batched(text.bm25(num_results=K, query_algorithm=algorithm), test)[0])
            ours, _ = per_query(BM25(text, num_results=K, query_algorithm=algorithm), one)
            ours.update(batched(BM25(text, num_results=K, query_algorithm=algorithm), test)[0])
        bm25['pyterrier_lsr'] = ours
        return {'side': side, 'documents': index.num_docs(), 'test_queries': len(test), 'one_a_call_queries': len(one),
                'chosen': {'engine': record['engine'], 'settings': record['settings'],
                           'retriever_uses': [tuned.engine, tuned.params]},
                'engines': engines, 'bm25': {'query_algorithm': algorithm, **bm25}, 'query_encoding': encoding,
                'terms_per_query': float(np.mean([len(t) for t in frame['query_toks']])),
                'postings_per_query': postings(index, frame), 'front': record['front']}

    def effectiveness(self, spec: str, n: int) -> dict:
        """nDCG@10 on every judged topic of ``spec`` (none of them tunes anything) of each query side with each
        engine at the setting chosen for it at ``n`` packages documents, beside BM25 on PISA of the same texts."""
        import pyterrier_pisa
        collection = load_collection(spec)
        name = collection.name
        index = LsrIndex(self.data / f'eff-{name}', self.model(self.args.precision), engines=('pisa', 'bmp', 'seismic'),
                         overwrite=True, verbose=False)
        with quiet_native():
            index.index(collection.corpus)
        out = {}
        for side in self.args.query_sides:
            encoder = query_side(side, index)
            chosen = self.stages.record(f'sparse-{side}-{n}')['engines']
            out[side] = {engine: ndcg10(index.retriever(K, engine, query_encoder=encoder, **r['settings']), collection)
                         for engine, r in chosen.items()}
        text = pyterrier_pisa.PisaIndex(str(self.data / f'eff-{name}-bm25'), text_field='text', overwrite=True)
        with quiet_native():
            text.index(iter(collection.corpus))
        return {'collection': name, 'documents': len(collection.corpus), 'judged_topics': int(collection.qrels['qid']
                .nunique()), 'settings_from': n, 'ndcg@10': out, 'bm25': ndcg10(BM25(text, num_results=K), collection)}

    def size(self, n: int):
        stages, args = self.stages, self.args
        stages.run(f'encode-{args.precision}-{n}', lambda: self.encode(args.precision, n))
        stages.run(f'index-{n}', lambda: self.index(n))
        stages.run(f'truth-{n}', lambda: self.truth(n))
        for block_size in self.block_sizes(n):
            stages.run(f'bmp-{block_size}-{n}', lambda b=block_size: self.bmp(n, b))
        stages.run(f'seismic-{n}', lambda: self.seismic(n))
        stages.run(f'bm25-{n}', lambda: self.bm25(n))
        stages.run(f'postings-{n}', lambda: self.postings(n))
        stages.run(f'measure-{n}', lambda: self.measure(n))
        if n in self.args.query_sides_at or (n == self.total and 'all' in self.args.query_sides_at):
            for side in args.query_sides:
                stages.run(f'sparse-{side}-{n}', lambda s=side: self.sparse(n, s))
        if n <= args.compare_up_to:
            for precision in args.compare_precisions:
                stages.run(f'encode-{precision}-{n}', lambda p=precision: self.encode(p, n))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--corpus', default='corpora/packages', help='folder of docs.jsonl.gz and queries.tsv')
    parser.add_argument('--data', default='scale-data', help='folder for every intermediate file (not the repo)')
    parser.add_argument('--sizes', nargs='+', default=['10000', '100000', 'all'], help='prefix sizes, or "all"')
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--precision', default='int8', choices=['fp32', 'bf16', 'int8'],
                        help='the encoding the index is built from')
    parser.add_argument('--compare-precisions', nargs='*', default=['fp32', 'bf16'])
    parser.add_argument('--compare-up-to', type=int, default=100_000,
                        help='sizes up to this are encoded in --compare-precisions too (for their rates)')
    parser.add_argument('--batch-size', type=int, default=64, help='texts per forward pass')
    parser.add_argument('--shard-size', type=int, default=10_000, help='documents per shard: the unit of resume')
    parser.add_argument('--ray-workers', type=int, default=0,
                        help='then encode --ray-docs documents again on this many local Ray workers (0: not)')
    parser.add_argument('--ray-docs', type=int, default=20_000, help='a size encoded in-process before')
    parser.add_argument('--scale', type=float, default=100.)
    parser.add_argument('--bmp-block-sizes', nargs='+', type=int, default=[16, 32, 64])
    parser.add_argument('--tune-builds-up-to', type=int, default=100_000,
                        help='sizes up to this build BMP at every --bmp-block-sizes; larger ones at the size chosen')
    parser.add_argument('--target-recall', type=float, default=0.99)
    parser.add_argument('--query-sides', nargs='*', default=['idf', 'idf-top5', 'splade', 'splade-top5'],
                        help='query encoders measured on every engine (splade, idf; -top<n>, -ratio<r>: pruned)')
    parser.add_argument('--one-a-call-queries', type=int, default=300,
                        help='test queries timed one a call per query side and engine (all of them batched)')
    parser.add_argument('--query-sides-at', nargs='*', default=['100000', 'all'],
                        help='the sizes the query sides are measured at')
    parser.add_argument('--effectiveness', nargs='*', default=['irds:vaswani', 'collections/cisi'],
                        help='collections whose nDCG@10 of each query side and engine setting is measured')
    parser.add_argument('--effectiveness-settings-at', type=int, default=100_000,
                        help='the size whose chosen engine settings the effectiveness runs use')
    parser.add_argument('--seed', type=int, default=0, help='of the document shuffle and the query split')
    parser.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    parser.add_argument('--output', default='benchmarks/results/scale.json')
    parser.add_argument('--plot', default='benchmarks/results/scale.png')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    Path(args.data).mkdir(parents=True, exist_ok=True)
    run = Run(args)
    total = run.stages.run('shuffle', lambda: shuffle_corpus(Path(args.corpus) / 'docs.jsonl.gz', run.shuffled,
                                                              args.seed))['documents']
    run.stages.run(f'queries-{args.precision}', lambda: encode_queries(
        run.model(args.precision), pd.concat([run.tune, run.test]), run.data / f'queries-{args.precision}.json'))
    run.total = total
    args.query_sides_at = [s if s == 'all' else int(s) for s in args.query_sides_at]
    for size in args.sizes:
        run.size(total if size == 'all' else min(int(size), total))
    sides_done = all(run.stages.record(f'sparse-{s}-{args.effectiveness_settings_at}') for s in args.query_sides)
    if args.query_sides and sides_done:
        for spec in args.effectiveness:
            name = Path(spec).name if not spec.startswith('irds:') else spec[len('irds:'):]
            run.stages.run(f'effectiveness-{name}', lambda s=spec: run.effectiveness(s, args.effectiveness_settings_at))
    if args.ray_workers:
        run.stages.run(f'encode-ray{args.ray_workers}-{args.precision}-{args.ray_docs}',
                       lambda: run.encode_ray(args.ray_docs))
    run.stages.publish()


if __name__ == '__main__':
    main()
