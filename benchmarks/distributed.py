"""Scale-out on CPUs: Ray encoding (1 and 2 workers) vs the in-process encoder, and 2-process training vs 1.

    python benchmarks/distributed.py --irds-cache PATH

Encoding: the Vaswani corpus with SPLADE-tiny, one torch thread everywhere. The in-process encoder is ``model.encode``
over chunks of ``--chunk-size`` documents (what ``LsrIndex.index`` does); the Ray runs are
``pyterrier_lsr.scaleout.encode`` with 1 and 2 CPU workers on a local Ray session started beforehand (its start-up
time is reported apart). Reported: docs/s (wall), docs per CPU-second counting every process of the run (this one, Ray's
GCS, raylet and workers, model loading included: read from /proc, so Linux only), and docs per CPU-second of the
workers' encoding alone; then whether the vectors equal the in-process ones exactly, and whether the index built from
the Ray shards (``distributed.index``, resuming from the 2-worker shards) equals ``LsrIndex(path, model).index(corpus)``
(vectors, document frequencies, and the PISA run over all topics).

Training: ``torchrun --standalone --nproc_per_node N`` (N = 1, 2) of this script's ``train-worker`` part: the bundled
loop on self-supervised Vaswani pairs, same global batch, same steps, gloo; pairs/s over the steps after ``--warmup``.

Prints tables and writes JSON (``--output``).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system, reaped children included) of ``root`` and all its live descendants."""
    stats, children = {}, {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            pid = int(entry)
            children.setdefault(int(fields[1]), []).append(pid)
            stats[pid] = sum(int(x) for x in fields[11:15])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / os.sysconf('SC_CLK_TCK')


def load_corpus(limit):
    import pyterrier as pt
    dataset = pt.get_dataset('irds:vaswani')
    docs = [{'docno': d['docno'], 'text': d['text']} for d in dataset.get_corpus_iter(verbose=False)]
    return docs[:limit], dataset.get_topics(), dataset


def encoding(args):
    import more_itertools
    import pandas as pd
    import ray
    import torch

    from pyterrier_lsr import LsrIndex, Splade
    from pyterrier_lsr import scaleout as distributed
    from pyterrier_lsr.core.offline import resolve_model
    torch.set_num_threads(1)
    docs, topics, _ = load_corpus(args.docs)
    model = Splade.from_pretrained(resolve_model(args.model), device='cpu')
    rows, me = [], os.getpid()

    start, cpu = time.perf_counter(), tree_cpu_seconds(me)
    expected = [(d['docno'], v) for chunk in more_itertools.chunked(docs, args.chunk_size)
                for d, v in zip(chunk, model.encode([d['text'] for d in chunk]))]
    wall, cpu = time.perf_counter() - start, tree_cpu_seconds(me) - cpu
    rows.append({'encoder': 'in-process model.encode', 'docs/s': len(docs) / wall, 'docs/CPU-s (all)': len(docs) / cpu,
                 'docs/CPU-s (encoding)': len(docs) / cpu, 'seconds': wall, 'equal to in-process': True})

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for workers in args.workers:
            start = time.perf_counter()
            ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False)
            ray_start = time.perf_counter() - start
            start, cpu = time.perf_counter(), tree_cpu_seconds(me)
            store = distributed.encode(docs, model, tmp / f'w{workers}', num_workers=workers,
                                       shard_size=args.shard_size, chunk_size=args.chunk_size, verbose=False)
            wall, cpu = time.perf_counter() - start, tree_cpu_seconds(me) - cpu
            ray.shutdown()
            records = [json.loads(p.read_text()) for p in (tmp / f'w{workers}').glob('part-*.json')]
            rows.append({'encoder': f'Ray, {workers} worker(s)', 'docs/s': len(docs) / wall,
                         'docs/CPU-s (all)': len(docs) / cpu,
                         'docs/CPU-s (encoding)': len(docs) / sum(r['cpu_seconds'] for r in records),
                         'seconds': wall, 'ray start seconds': ray_start,
                         'equal to in-process': list(store) == expected})

        single = LsrIndex(tmp / 'single', model, batch_size=args.chunk_size, verbose=False).index(docs)
        os.rename(tmp / f'w{args.workers[-1]}', tmp / 'ray.vectors')  # where distributed.index looks for its shards
        start = time.perf_counter()
        built = distributed.index(docs, model, tmp / 'ray', num_workers=0, shard_size=args.shard_size,
                                  chunk_size=args.chunk_size, verbose=False)  # every shard is there: index only
        resume_seconds = time.perf_counter() - start
        run_single = single.retriever(num_results=1000)(topics)
        run_built = built.retriever(num_results=1000)(topics)
        index_equal = {'vectors': list(built.vectors()) == list(single.vectors()),
                       'document frequencies': built.document_frequencies() == single.document_frequencies(),
                       'PISA run (all topics, top 1000)': run_built.equals(run_single),
                       'resume + index seconds': resume_seconds}
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f'{x:.1f}'))
    print('distributed.index == LsrIndex.index:', index_equal)
    return {'docs': len(docs), 'rows': rows, 'index_equal': index_equal}


def training(args):
    import pandas as pd
    rows = []
    for procs in args.procs:
        with tempfile.NamedTemporaryFile(suffix='.json') as out:
            command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={procs}',
                       __file__, '--part', 'train-worker', '--worker-output', out.name, '--model', args.model,
                       '--steps', str(args.steps), '--warmup', str(args.warmup), '--batch-size', str(args.batch_size)]
            env = dict(os.environ, OMP_NUM_THREADS='1')
            subprocess.run(command, check=True, env=env)
            rows.append({'processes': procs, **json.loads(Path(out.name).read_text())})
    for row in rows:
        row['speed-up'] = row['pairs/s'] / rows[0]['pairs/s']
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f'{x:.3f}'))
    return {'rows': rows}


def train_worker(args):
    """One torchrun process: the bundled loop; rank 0 writes pairs/s."""
    import torch

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.offline import resolve_model
    from pyterrier_lsr.train import TrainConfig, self_supervised, train
    from pyterrier_lsr.train import torchrun as dist
    torch.set_num_threads(1)
    dist.setup()
    docs, _, _ = load_corpus(None)
    examples = self_supervised(docs, num_negatives=1, seed=0, verbose=False)
    splade = Splade.from_pretrained(resolve_model(args.model), device='cpu')
    total = args.warmup + args.steps
    config = TrainConfig(steps=total, batch_size=args.batch_size, lr=2e-5, warmup_steps=0, flops_warmup_steps=0,
                         lambda_q=1e-3, lambda_d=1e-3, doc_max_length=128, log_every=1, save_every=10 ** 9)
    with tempfile.TemporaryDirectory() as tmp:
        log = train(splade.model, splade.tokenizer, examples[:total * args.batch_size], tmp, config, verbose=False)
    if dist.is_main():
        seconds = {row['step']: row['seconds'] for row in log if 'seconds' in row}
        elapsed = seconds[total] - seconds[args.warmup]
        Path(args.worker_output).write_text(json.dumps({
            'pairs/s': args.steps * args.batch_size / elapsed, 'seconds': elapsed, 'final loss': log[-1]['loss']}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--part', choices=['all', 'encode', 'train', 'train-worker'], default='all')
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--docs', type=int, default=None, help='first N Vaswani documents (default: all)')
    parser.add_argument('--workers', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--shard-size', type=int, default=2048)
    parser.add_argument('--chunk-size', type=int, default=1024)
    parser.add_argument('--procs', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--steps', type=int, default=30)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--batch-size', type=int, default=16, help='global batch (split over processes)')
    parser.add_argument('--worker-output')
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'distributed.json'))
    args = parser.parse_args()
    if args.irds_cache:
        from pyterrier_lsr.core.offline import use_irds_cache
        use_irds_cache(args.irds_cache)
    if args.part == 'train-worker':
        return train_worker(args)
    results = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'machine': platform.machine(),
               'cpus': os.cpu_count(), 'settings': vars(args)}
    if args.part in ('all', 'encode'):
        results['encoding'] = encoding(args)
    if args.part in ('all', 'train'):
        results['training'] = training(args)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))


if __name__ == '__main__':
    main()
