"""Query latency of inference-free query encoders vs the transformer query encoder, and end-to-end PISA retrieval.

    python benchmarks/query_latency.py --irds-cache PATH

Measures, in one run on Vaswani (93 queries): per-query encoding time (one query at a time, as a search service
sees them) of the IDF and binary static encoders and of SPLADE's transformer query encoder over the same vocabulary;
and end-to-end ms/query of each pipeline through PISA with BM25 (PISA) as the reference. Prints a table and writes
benchmarks/results/query_latency.json.

    python benchmarks/query_latency.py --index path/to/index-100000 --queries path/to/queries.tsv \
        --bm25 path/to/bm25-100000 --label after --engine-settings seismic:query_cut=10,heap_factor=0.7

measures instead what a call costs beside the engine's own work: CPU ms per query (this process, the engines' native
code included; the least mean of ``--repeats`` passes) one query a call and in one batched call, for each engine of
the index and each query side (IDF table, the index model's queries), split into the query encoding, the engine alone
(its searcher on checked ``query_toks``) and the whole ``index.retriever()`` call; beside BM25 on PISA through
this library's ``BM25``, through pyterrier-pisa's own retriever (``pyterrier_pisa_*``) and, as "engine alone", through
PISA's native call with the results' frame built from its arrays. The
figures go under ``--label`` into ``benchmarks/results/query_call.json`` (so that runs before and after a change sit
together).
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import use_irds_cache


def per_query_seconds(fn, queries, repeats):
    """Median over ``repeats`` of the mean seconds per query, calling ``fn`` on one query at a time."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for q in queries:
            fn(q)
        runs.append((time.perf_counter() - start) / len(queries))
    return statistics.median(runs)


def cpu_ms_per_call(fn, inputs, repeats):
    """The least over ``repeats`` passes of the mean CPU ms of ``fn`` on each of ``inputs`` (after a warm-up)."""
    fn(inputs[0])
    best = None
    for _ in range(repeats):
        start = time.process_time()
        for x in inputs:
            fn(x)
        ms = (time.process_time() - start) * 1e3 / len(inputs)
        best = ms if best is None else min(best, ms)
    return best


def lean_bm25(retriever):
    """BM25 on PISA called as the LSR engines' PISA glue calls it (its native search, the results' frame built from
    arrays), without pyterrier-pisa's own frame handling: what BM25 would cost one query a call through that path."""
    from pyterrier_lsr.index.engines.native import result_frame
    from pyterrier_lsr.index.engines.pisa import pisa_hits

    return lambda frame: result_frame(frame, pisa_hits(retriever, frame['query'].tolist()))


def call_costs(args):
    """The ``--index`` mode (see the module notes)."""
    import os

    import pandas as pd
    import torch

    from pyterrier_lsr import IDFQueryEncoder, LsrIndex
    from pyterrier_lsr.core.quiet import quiet_native
    from pyterrier_lsr.index.bm25 import BM25

    torch.set_num_threads(args.threads or 1)
    queries = pd.read_csv(args.queries, sep='\t', names=['qid', 'query'], dtype=str, quoting=3).head(args.num_queries)
    frames = [queries.iloc[[i]] for i in range(len(queries))]
    index = LsrIndex(args.index)
    settings = {}
    for item in args.engine_settings:
        engine, _, values = item.partition(':')
        settings[engine] = {k: float(v) if '.' in v else int(v) for k, v in (kv.split('=') for kv in values.split(','))}
    from pyterrier_lsr.stages.pruning import Prune
    idf = IDFQueryEncoder.from_index(index)
    sides = {'idf': lambda: idf, 'idf-top5': lambda: idf >> Prune(top_n=5),
             'idf-ratio0.3': lambda: idf >> Prune(ratio=0.3),
             'splade': lambda: index.model().query_encoder()}
    sides = {side: sides[side]() for side in args.sides}
    rows = []
    with quiet_native():
        for side, encoder in sides.items():
            encode = encoder.encode if hasattr(encoder, 'encode') else lambda texts, e=encoder: list(
                e(pd.DataFrame({'qid': ['q'] * len(texts), 'query': texts}))['query_toks'])
            toks = [encode([q])[0] for q in queries['query']]
            encoding = cpu_ms_per_call(lambda q: encode([q]), list(queries['query']), args.repeats)
            for engine in index.meta['engines']:
                params = settings.get(engine, {})
                retriever = index.retriever(10, engine, query_encoder=encoder, **params)
                searcher = index.toks_retriever(10, engine, **params).engine_retriever
                bare = [(f[['qid']], [t]) for f, t in zip(frames, toks)]
                rows.append({'side': side, 'engine': engine, 'settings': params, 'query_encoding': encoding,
                             'engine_alone': cpu_ms_per_call(lambda x, s=searcher: s.results(*x), bare, args.repeats),
                             'retriever_one': cpu_ms_per_call(retriever, frames, args.repeats),
                             'retriever_batched': cpu_ms_per_call(retriever, [queries], args.repeats) / len(queries)})
                print(rows[-1], flush=True)
        if args.bm25:
            import pyterrier_pisa
            bm25 = BM25(pyterrier_pisa.PisaIndex(args.bm25), num_results=10, query_algorithm='block_max_maxscore')
            lean = lean_bm25(pyterrier_pisa.PisaIndex(args.bm25).bm25(num_results=10,
                                                                       query_algorithm='block_max_maxscore'))
            plain = pyterrier_pisa.PisaIndex(args.bm25).bm25(num_results=10, query_algorithm='block_max_maxscore')
            rows.append({'side': 'BM25', 'engine': 'pisa', 'retriever_one': cpu_ms_per_call(bm25, frames, args.repeats),
                         'retriever_batched': cpu_ms_per_call(bm25, [queries], args.repeats) / len(queries),
                         'engine_alone': cpu_ms_per_call(lean, frames, args.repeats),
                         'pyterrier_pisa_one': cpu_ms_per_call(plain, frames, args.repeats),
                         'pyterrier_pisa_batched': cpu_ms_per_call(plain, [queries], args.repeats) / len(queries)})
            print(rows[-1], flush=True)
    path = Path(args.output)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results[args.label] = {'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), 'load': os.getloadavg(),
                           'cpu': next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo')
                                        if line.startswith('model name')), '?'),
                           'index': Path(args.index).name, 'documents': index.num_docs(),
                           'queries': len(queries), 'repeats': args.repeats, 'rows': rows}
    path.write_text(json.dumps(results, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--workdir', default='indices')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument(
        '--threads', type=int, default=None, help="torch threads (1 is steadier on a shared machine; default: torch's)"
    )
    parser.add_argument('--irds-cache')
    parser.add_argument('--output', default=str(Path(__file__).parent / 'results' / 'query_latency.json'))
    parser.add_argument('--index', help='an LsrIndex: measure the cost of a call instead (see the module notes)')
    parser.add_argument('--queries', help='qid<TAB>query file (--index mode)')
    parser.add_argument('--num-queries', type=int, default=300)
    parser.add_argument('--bm25', help='a PISA text index for the BM25 reference (--index mode)')
    parser.add_argument('--engine-settings', nargs='*', default=[], help='engine:name=value,... (--index mode)')
    parser.add_argument('--sides', nargs='+', default=['idf', 'splade'],
                        choices=['idf', 'idf-top5', 'idf-ratio0.3', 'splade'],
                        help='query sides (--index mode): IDF table, its 5 rarest tokens, its tokens of idf at least '
                             '0.3 times the largest, the index model')
    parser.add_argument('--label', default='now', help='the key of this run in the --index mode output')
    args = parser.parse_args()
    if args.index:
        if args.output == parser.get_default('output'):
            args.output = str(Path(__file__).parent / 'results' / 'query_call.json')
        call_costs(args)
        return
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import pandas as pd
    import pyterrier as pt
    import pyterrier_pisa
    import torch

    from pyterrier_lsr import IDFQueryEncoder, LsrIndex, Splade, SpladeIndexer, StaticQueryEncoder

    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = pt.get_dataset('irds:vaswani')
    topics = dataset.get_topics()
    workdir = Path(args.workdir)
    splade = Splade.from_pretrained(resolve_model(args.model), batch_size=1)
    lsr_path = workdir / f'vaswani.{Path(args.model).name}.lsr'
    index = (
        LsrIndex(lsr_path, splade)
        if (lsr_path / 'lsr.json').exists()
        else SpladeIndexer(lsr_path, splade, overwrite=True).index(dataset.get_corpus_iter())
    )
    bm25_index = pyterrier_pisa.PisaIndex(str(workdir / 'vaswani.pisa'), text_field='text')
    if not bm25_index.built():
        bm25_index.index(dataset.get_corpus_iter())

    encoders = {
        'transformer (SPLADE)': splade.query_encoder(),
        'IDF (static table)': IDFQueryEncoder.from_index(index),
        'binary (static table)': StaticQueryEncoder.binary(splade.tokenizer),
    }
    queries = topics['query'].tolist()
    encode = {
        name: per_query_seconds(lambda q, e=enc: e.encode([q]), queries, args.repeats) for name, enc in encoders.items()
    }

    retriever = index.toks_retriever(num_results=1000)
    pipelines = {
        'BM25 (PISA)': bm25_index.bm25(num_results=1000),
        'SPLADE (transformer queries)': splade.query_encoder() >> retriever,
        'SPLADE docs + IDF queries': encoders['IDF (static table)'] >> retriever,
        'SPLADE docs + binary queries': encoders['binary (static table)'] >> retriever,
    }
    frames = [topics.iloc[[i]] for i in range(len(topics))]
    for pipe in pipelines.values():  # warm PISA's index context and caches once
        pipe(topics.iloc[:2])
    end_to_end = {name: per_query_seconds(pipe, frames, args.repeats) for name, pipe in pipelines.items()}

    ref_encode, ref_e2e = encode['transformer (SPLADE)'], end_to_end['BM25 (PISA)']
    rows = [
        {
            'measure': 'query encoding',
            'system': n,
            'ms/query': s * 1e3,
            'ratio': f'{ref_encode / s:.0f}x faster than transformer',
        }
        for n, s in encode.items()
    ]
    rows += [
        {'measure': 'end-to-end retrieval', 'system': n, 'ms/query': s * 1e3, 'ratio': f'{s / ref_e2e:.2f}x BM25'}
        for n, s in end_to_end.items()
    ]
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f'{x:.3f}'))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(
        json.dumps(
            {
                'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()),
                'machine': platform.processor() or platform.machine(),
                'threads': torch.get_num_threads(),
                'queries': len(queries),
                'repeats': args.repeats,
                'encode_ms': {k: v * 1e3 for k, v in encode.items()},
                'end_to_end_ms': {k: v * 1e3 for k, v in end_to_end.items()},
            },
            indent=1,
        )
    )


if __name__ == '__main__':
    main()
