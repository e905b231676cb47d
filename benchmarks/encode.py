"""Document-encoding speed, peak memory and output agreement: pyterrier-lsr (torch and ONNX) vs pyterrier-splade 0.1.0.

    python benchmarks/encode.py --irds-cache PATH
    python benchmarks/encode.py --irds-cache PATH --threads 1   # on a shared machine
    python benchmarks/encode.py --irds-cache PATH --threads 1 --precisions fp32 bf16 int8 --cisi PATH/cisi

Both libraries encode the same Vaswani documents with the same SPLADE checkpoint (default: the offline
``splade-tiny``).  Measured, in one run:

* speed: docs/s of each library's ``doc_encoder()`` on the first ``--docs`` documents, fp32 and bf16
  (pyterrier-splade has no precision option: its bf16 runs under ``torch.autocast``), at ``--batch-size``
  for both libraries and at pyterrier-splade's default batch size (100).  Every configuration runs in a
  fresh subprocess, ``--rounds`` times interleaved with the others; the best round is reported (the
  machine may be shared, so slower rounds measure the neighbours, not the code).  Docs per CPU-second
  (process time, all threads) is reported too: it is less sensitive to other processes than wall time.
* peak memory: the subprocess's peak RSS (``ru_maxrss``), and its growth over the RSS measured after the
  model and documents were loaded.
* ONNX: with the ``pyterrier-lsr-onnx`` library the model is exported once (``export_onnx``, fp32 and onnxruntime's
  dynamic int8) and encoded through the ONNX backend; ``int8`` is ours (``precision='int8'``) for pyterrier-lsr and
  onnxruntime's quantized graph for pyterrier-lsr-onnx (pyterrier-splade has none). The ONNX fp32 and int8 weights
  are compared with our torch fp32 weights too. sentence-transformers' own ONNX backend needs ``optimum-onnx``,
  which requires transformers < 4.58: where it is not importable the report says so instead of timing it.
* output equality: our fp32 weights vs pyterrier-splade's fp32 float weights (``encode(..., format='torch')``,
  special tokens dropped, since pyterrier-splade emits them as terms), and the index impacts
  ``int(100 w)`` vs pyterrier-splade's ``doc_encoder()`` (which truncates at scale 100).
* effectiveness: nDCG@10 on all Vaswani topics (and CISI's with ``--cisi``, a folder read by ``load_collection``) of a
  full-corpus index of documents encoded at each precision and backend, searched with queries of the same encoder,
  vs torch fp32 (for bf16, fp32 queries on bf16 documents too).

Prints a table and writes JSON (``--output``).
"""

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path

OURS, THEIRS, ONNX = 'pyterrier-lsr', 'pyterrier-splade', 'pyterrier-lsr-onnx'
# the precisions each library runs: int8 is ours (torch) or onnxruntime's quantized graph; bf16 is torch autocast
PRECISIONS = {OURS: ('fp32', 'bf16', 'int8'), THEIRS: ('fp32', 'bf16'), ONNX: ('fp32', 'int8')}
THEIR_DEFAULT_BATCH_SIZE = 100
SCALE = 100.0  # the index scale; pyterrier-splade's doc_encoder() default scale too
WARMUP_DOCS = 64


def load_docs(limit=None):
    import pandas as pd
    import pyterrier as pt

    docs = itertools.islice(pt.get_dataset('irds:vaswani').get_corpus_iter(verbose=False), limit)
    return pd.DataFrame([{'docno': d['docno'], 'text': d['text']} for d in docs])


def rss_mb() -> float:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2**20


def doc_encoder(impl: str, model_path: str, precision: str, batch_size: int):
    """The library's document encoder and the context to call it in."""
    import torch

    if impl in (OURS, ONNX):
        import pyterrier_lsr

        if impl == ONNX:  # model_path: the folder exported at this precision
            splade = pyterrier_lsr.Splade.from_pretrained(model_path, backend='onnx')
        else:
            splade = pyterrier_lsr.Splade.from_pretrained(model_path, device='cpu', precision=precision)
        return splade.doc_encoder(batch_size=batch_size), nullcontext
    import pyterrier_splade

    splade = pyterrier_splade.Splade(model_path, device='cpu')
    autocast = (lambda: torch.autocast('cpu', dtype=torch.bfloat16)) if precision == 'bf16' else nullcontext
    return splade.doc_encoder(batch_size=batch_size), autocast


def measure_speed(config: dict) -> dict:
    """Runs in its own process, so that ``ru_maxrss`` is this configuration's peak."""
    import torch

    if config['threads']:
        torch.set_num_threads(config['threads'])
    docs = load_docs(config['docs'])
    encoder, context = doc_encoder(config['impl'], config['model'], config['precision'], config['batch_size'])
    loaded_mb = rss_mb()
    with context():
        encoder(docs.iloc[:WARMUP_DOCS])
        start, start_cpu = time.perf_counter(), time.process_time()
        encoder(docs)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(
        config,
        torch_threads=torch.get_num_threads(),
        seconds=seconds,
        docs_per_s=len(docs) / seconds,
        docs_per_cpu_s=len(docs) / cpu_seconds,
        loaded_mb=loaded_mb,
        peak_mb=peak_mb,
    )


def speed(configs, rounds: int):
    """Best round per configuration (docs/s), with the largest peak RSS seen, and docs/s ratios to
    pyterrier-splade at the same precision (same batch size, and its default batch size)."""
    runs = []
    for _ in range(rounds):
        for config in configs:
            with ProcessPoolExecutor(1, mp_context=get_context('spawn')) as pool:
                runs.append(pool.submit(measure_speed, config).result())
            print(
                f'  {config["impl"]:16} {config["precision"]} batch {config["batch_size"]:3}: '
                f'{runs[-1]["docs_per_s"]:7.1f} docs/s, {runs[-1]["docs_per_cpu_s"]:7.1f} docs/CPU-s, '
                f'peak {runs[-1]["peak_mb"]:.0f} MB, load {os.getloadavg()[0]:.1f}',
                flush=True,
            )
    results = []
    for config in configs:
        mine = [r for r in runs if all(r[k] == v for k, v in config.items())]
        best = max(mine, key=lambda r: r['docs_per_s'])
        results.append(
            dict(
                best,
                docs_per_cpu_s=max(r['docs_per_cpu_s'] for r in mine),
                peak_mb=max(r['peak_mb'] for r in mine),
                growth_mb=max(r['peak_mb'] - r['loaded_mb'] for r in mine),
                rounds_docs_per_s=[round(r['docs_per_s'], 1) for r in mine],
            )
        )
    theirs = {(r['precision'], r['batch_size']): r for r in results if r['impl'] == THEIRS}
    for r in results:
        for name, batch_size in (('same_batch', r['batch_size']), ('default_batch', THEIR_DEFAULT_BATCH_SIZE)):
            reference = theirs.get((r['precision'], batch_size))
            for metric in ('docs_per_s', 'docs_per_cpu_s'):
                r[f'{metric}_vs_theirs_{name}'] = r[metric] / reference[metric] if reference else None
    return results


def output_agreement(model_path: str, n_docs: int, batch_size: int) -> dict:
    """Our fp32 vectors vs pyterrier-splade's fp32 vectors on the same documents."""
    import pyterrier_splade
    import torch

    import pyterrier_lsr
    from pyterrier_lsr.index import quantize

    texts = load_docs(n_docs)['text'].tolist()
    ours = pyterrier_lsr.Splade.from_pretrained(model_path, device='cpu', precision='fp32')
    theirs = pyterrier_splade.Splade(model_path, device='cpu')
    our_vecs = ours.encode(texts, batch_size=batch_size)
    special = torch.tensor(theirs.tokenizer.all_special_ids)
    max_diff, term_set_mismatches, impacts, impact_mismatches = 0.0, 0, 0, 0
    for start in range(0, len(texts), batch_size):
        weights = theirs.encode(texts[start : start + batch_size], 'd', format='torch')
        weights[:, special] = 0.0
        truncated = (weights * SCALE).int()  # exactly what pyterrier-splade's doc_encoder() emits
        for row, trunc, mine in zip(weights, truncated, our_vecs[start : start + batch_size]):
            cols = row.nonzero()[:, 0].tolist()
            theirs_vec = {ours.terms[c]: row[c].item() for c in cols}
            term_set_mismatches += theirs_vec.keys() != mine.keys()
            max_diff = max(
                [max_diff] + [abs(theirs_vec.get(t, 0.0) - mine.get(t, 0.0)) for t in theirs_vec.keys() | mine.keys()]
            )
            their_impacts = {ours.terms[c]: trunc[c].item() for c in cols if trunc[c] > 0}
            our_impacts = quantize(mine, SCALE)
            impacts += len(their_impacts.keys() | our_impacts.keys())
            impact_mismatches += sum(
                their_impacts.get(t) != our_impacts.get(t) for t in their_impacts.keys() | our_impacts.keys()
            )
    return {
        'docs': len(texts),
        'max_abs_diff': max_diff,
        'docs_with_different_terms': term_set_mismatches,
        'impacts': impacts,
        'impact_mismatches': impact_mismatches,
    }


def onnx_agreement(model_path: str, onnx_folders: dict, n_docs: int, batch_size: int) -> dict:
    """The ONNX backend's weights (fp32 and int8 graphs) vs our torch fp32 weights on the same documents."""
    import pyterrier_lsr

    texts = load_docs(n_docs)['text'].tolist()
    torch_vecs = pyterrier_lsr.Splade.from_pretrained(model_path, device='cpu').encode(texts, batch_size=batch_size)
    report = {}
    for precision, folder in onnx_folders.items():
        onnx_vecs = pyterrier_lsr.Splade.from_pretrained(folder, backend='onnx').encode(texts, batch_size=batch_size)
        report[precision] = {
            'docs': len(texts),
            'max_abs_diff': max(abs(a.get(t, 0.0) - b.get(t, 0.0))
                                for a, b in zip(torch_vecs, onnx_vecs) for t in a.keys() | b.keys()),
            'docs_with_different_terms': sum(a.keys() != b.keys() for a, b in zip(torch_vecs, onnx_vecs)),
        }
    return report


def effectiveness(model_path: str, onnx_folders: dict, precisions, batch_size: int, workdir: str,
                  cisi: str | None) -> dict:
    """nDCG@10 on Vaswani (and CISI) of full-corpus indexes of documents encoded by each precision and backend,
    searched with queries of the same encoder; the first system, torch fp32, is the baseline."""
    import pyterrier as pt
    from pyterrier.measures import nDCG

    import pyterrier_lsr
    from pyterrier_lsr.core.collection import load_collection

    models = {
        f'torch {p}': pyterrier_lsr.Splade.from_pretrained(model_path, device='cpu', precision=p, batch_size=batch_size)
        for p in ['fp32'] + [p for p in precisions if p != 'fp32']
    }
    for p, folder in onnx_folders.items():
        models[f'onnx {p}'] = pyterrier_lsr.Splade.from_pretrained(folder, backend='onnx', batch_size=batch_size)
    collections = {'vaswani': 'irds:vaswani', **({'cisi': cisi} if cisi else {})}
    report = {}
    for name, spec in collections.items():
        collection = load_collection(spec)
        indexes, encode_s = {}, {}
        for label, model in models.items():
            start = time.perf_counter()
            indexes[label] = pyterrier_lsr.SpladeIndexer(
                Path(workdir) / f'{name}-{label.replace(" ", "-")}', model=model, overwrite=True, verbose=False
            ).index(collection.corpus)
            encode_s[label] = time.perf_counter() - start
        systems = {f'{label} docs, {label} queries': model.query_encoder() >> indexes[label].toks_retriever()
                   for label, model in models.items()}
        if 'torch bf16' in models:
            systems['torch bf16 docs, torch fp32 queries'] = (models['torch fp32'].query_encoder()
                                                              >> indexes['torch bf16'].toks_retriever())
        table = pt.Experiment(list(systems.values()), collection.topics, collection.qrels, [nDCG @ 10],
                              names=list(systems), baseline=0)
        ndcg = dict(zip(table['name'], table['nDCG@10']))
        baseline = ndcg['torch fp32 docs, torch fp32 queries']
        report[name] = {
            'topics': len(collection.topics),
            'docs': len(collection.corpus),
            'index_seconds': encode_s,
            'ndcg@10': ndcg,
            'vs_torch_fp32': {k: v / baseline for k, v in ndcg.items()},
            'topics_better_worse_vs_torch_fp32': {
                k: [None if b != b else int(b), None if w != w else int(w)]
                for k, b, w in zip(table['name'], table['nDCG@10 +'], table['nDCG@10 -'])},
        }
    return report


def export_onnx_folders(model_path: str, workdir: str, precisions) -> dict:
    """The model exported once per ONNX precision (fp32, onnxruntime's dynamic int8), and each export's seconds."""
    import pyterrier_lsr

    splade = pyterrier_lsr.Splade.from_pretrained(model_path, device='cpu')
    folders, seconds = {}, {}
    for precision in precisions:
        start = time.perf_counter()
        folders[precision] = str(splade.export_onnx(Path(workdir) / f'onnx-{precision}', precision=precision))
        seconds[precision] = time.perf_counter() - start
    return folders, seconds


def sentence_transformers_onnx() -> str | None:
    """Why sentence-transformers' own ONNX backend cannot be timed here, or None when it can."""
    try:
        import optimum.onnxruntime  # noqa: F401  (what SparseEncoder(..., backend='onnx') imports)
    except ImportError as ex:
        return (f'not measured: SparseEncoder(backend="onnx") needs optimum-onnx[onnxruntime] ({ex}); '
                'optimum-onnx 0.1.0 requires transformers<4.58, this environment pins transformers 5.24')
    return None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine() -> dict:
    lscpu = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
    model = next((line.split(':', 1)[1].strip() for line in lscpu.splitlines() if line.startswith('Model name')), '?')
    flags = open('/proc/cpuinfo').read()
    import torch

    return {
        'cpu': model,
        'nproc': os.cpu_count(),
        'torch_threads': torch.get_num_threads(),
        'torch': torch.__version__,
        'avx512_bf16': 'avx512_bf16' in flags,
        'amx_bf16': 'amx_bf16' in flags,
        'avx512_vnni': 'avx512_vnni' in flags,
        'onnxruntime': _version('onnxruntime'),
        'python': platform.python_version(),
        'loadavg_start': os.getloadavg(),
    }


def print_report(report: dict):
    def ratio(value):
        return 'n/a' if value is None else f'{value:.2f}x'

    print(
        f'\n{"library":16} {"prec":4} {"batch":>5} {"docs/s":>7} {"vs theirs":>9} {"vs @100":>8} '
        f'{"docs/CPU-s":>10} {"vs theirs":>9} {"vs @100":>8} {"peak RSS MB":>11} {"growth MB":>9}'
    )
    for r in report['speed']:
        print(
            f'{r["impl"]:16} {r["precision"]:4} {r["batch_size"]:5} {r["docs_per_s"]:7.1f} '
            f'{ratio(r["docs_per_s_vs_theirs_same_batch"]):>9} {ratio(r["docs_per_s_vs_theirs_default_batch"]):>8} '
            f'{r["docs_per_cpu_s"]:10.1f} {ratio(r["docs_per_cpu_s_vs_theirs_same_batch"]):>9} '
            f'{ratio(r["docs_per_cpu_s_vs_theirs_default_batch"]):>8} {r["peak_mb"]:11.0f} {r["growth_mb"]:9.0f}'
        )
    if 'agreement' in report:
        agreement = report['agreement']
        print(
            f'\nfp32 output, {agreement["docs"]} docs: max |ours - pyterrier-splade| = '
            f'{agreement["max_abs_diff"]:.2e}; {agreement["docs_with_different_terms"]} docs with different terms; '
            f'{agreement["impact_mismatches"]} of {agreement["impacts"]} int({SCALE:g} w) impacts differ'
        )
    for precision, agreement in report.get('onnx_agreement', {}).items():
        print(
            f'ONNX {precision} vs torch fp32, {agreement["docs"]} docs: max |diff| = {agreement["max_abs_diff"]:.2e}; '
            f'{agreement["docs_with_different_terms"]} docs with different terms'
        )
    if report.get('sentence_transformers_onnx'):
        print(f'sentence-transformers ONNX backend: {report["sentence_transformers_onnx"]}')
    for name, eff in report.get('effectiveness', {}).items():
        print(f'\nnDCG@10, {name} ({eff["topics"]} topics, {eff["docs"]} docs):')
        for system, value in eff['ndcg@10'].items():
            print(f'  {system:40} {value:.4f} ({eff["vs_torch_fp32"][system]:.2%} of torch fp32)')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache to use (copied to a temporary folder)')
    parser.add_argument('--model', default='splade-tiny', help='checkpoint (name, folder or offline model name)')
    parser.add_argument('--docs', type=int, default=2000, help='documents encoded for the speed measurements')
    parser.add_argument('--batch-size', type=int, default=32, help='batch size of both libraries')
    parser.add_argument('--threads', type=int, help="torch threads of the speed runs (default: torch's, one per core)")
    parser.add_argument('--rounds', type=int, default=2, help='interleaved repetitions of every speed configuration')
    parser.add_argument('--skip-ndcg', action='store_true', help='skip the full-corpus nDCG@10 comparison')
    parser.add_argument(
        '--libraries',
        nargs='+',
        choices=[OURS, THEIRS, ONNX],
        default=[OURS, THEIRS, ONNX],
        help='libraries to time (the output agreement needs pyterrier-lsr and pyterrier-splade)',
    )
    parser.add_argument('--precisions', nargs='+', choices=['fp32', 'bf16', 'int8'], default=['fp32', 'bf16'],
                        help="precisions, each run by the libraries that have it (int8: ours and onnxruntime's)")
    parser.add_argument('--cisi', help='a CISI folder (docs.jsonl, topics.tsv, qrels.txt): nDCG@10 on it too')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'encode.json'))
    args = parser.parse_args()

    from pyterrier_lsr.core.names import resolve_model
    from pyterrier_lsr.core.offline import use_irds_cache

    if args.irds_cache:
        use_irds_cache(args.irds_cache)  # before anything imports ir_datasets; subprocesses inherit it
    model_path = resolve_model(args.model)
    report = {
        'command': ' '.join(['python'] + sys.argv),
        'date': datetime.datetime.now().astimezone().isoformat(),
        'machine': machine(),
        'model': args.model,
        'docs': args.docs,
        'rounds': args.rounds,
    }

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # the exports and the nDCG runs, as the speed runs
    workdir = tempfile.TemporaryDirectory()
    onnx_folders = {}
    if ONNX in args.libraries:
        onnx_precisions = [p for p in args.precisions if p in PRECISIONS[ONNX]]
        print(f'exporting to ONNX: {onnx_precisions}', flush=True)
        onnx_folders, report['onnx_export_seconds'] = export_onnx_folders(model_path, workdir.name, onnx_precisions)
        report['sentence_transformers_onnx'] = sentence_transformers_onnx()
    batch_sizes = sorted({args.batch_size, THEIR_DEFAULT_BATCH_SIZE})
    configs = [
        {
            'impl': impl,
            'precision': precision,
            'batch_size': batch_size,
            'docs': args.docs,
            'model': onnx_folders[precision] if impl == ONNX else model_path,
            'threads': args.threads,
        }
        for batch_size in batch_sizes
        for impl in args.libraries
        for precision in args.precisions
        if precision in PRECISIONS[impl]
    ]
    print(f'speed: {args.docs} Vaswani docs, {args.rounds} rounds', flush=True)
    report['speed'] = speed(configs, args.rounds)
    if {OURS, THEIRS} <= set(args.libraries) and 'fp32' in args.precisions:
        print('output agreement (fp32)', flush=True)
        report['agreement'] = output_agreement(model_path, args.docs, args.batch_size)
    if onnx_folders:
        print('ONNX output agreement', flush=True)
        report['onnx_agreement'] = onnx_agreement(model_path, onnx_folders, args.docs, args.batch_size)
    if not args.skip_ndcg:
        print('nDCG@10: indexing the full corpora', flush=True)
        torch_precisions = [p for p in args.precisions if p in PRECISIONS[OURS]] if OURS in args.libraries else []
        report['effectiveness'] = effectiveness(model_path, onnx_folders, torch_precisions, args.batch_size,
                                                workdir.name, args.cisi)
    workdir.cleanup()
    report['machine']['loadavg_end'] = os.getloadavg()

    print_report(report)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f'\nwrote {args.output}')


if __name__ == '__main__':
    main()
