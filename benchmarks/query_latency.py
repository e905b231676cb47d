"""Query latency of inference-free query encoders vs the transformer query encoder, and end-to-end PISA retrieval.

    python benchmarks/query_latency.py --irds-cache PATH

Measures, in one run on Vaswani (93 queries): per-query encoding time (one query at a time, as a search service
sees them) of the IDF and binary static encoders and of SPLADE's transformer query encoder over the same vocabulary;
and end-to-end ms/query of each pipeline through PISA with BM25 (PISA) as the reference. Prints a table and writes
benchmarks/results/query_latency.json.
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
    args = parser.parse_args()
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
