"""Vaswani experiment: BM25 vs SPLADE vs SPLADE documents with inference-free IDF queries.

    python examples/vaswani.py                      # offline SPLADE checkpoint (the demo extra)
    python examples/vaswani.py --model naver/splade-v3 --precision bf16
    python examples/vaswani.py --irds-cache PATH   # offline: a prepared ir_datasets cache

Indexes go under --workdir and are reused on later runs. Progress goes to stderr (a line per stage, then its bars),
the table to stdout; --quiet prints the table alone.
"""

import argparse
import sys
import time
from pathlib import Path

import pyterrier as pt
from pyterrier.measures import AP, RR, R, nDCG

from pyterrier_lsr import IDFQueryEncoder, LsrIndex, Splade, systems
from pyterrier_lsr.core.extras import require_models
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.core.offline import use_irds_cache

MEASURES = [nDCG @ 10, AP, R @ 100, RR @ 10, 'mrt']
START = time.monotonic()


def step(text: str, verbose: bool = True):
    """A line of progress on stderr (stdout holds the table alone)."""
    if verbose:
        print(f'[{time.monotonic() - START:5.0f} s] {text}', file=sys.stderr, flush=True)


def experiment(model: str = 'splade-tiny', workdir: str = 'indices', precision: str = None, batch_size: int = 32,
               verbose: bool = True):
    dataset = pt.get_dataset('irds:vaswani')
    workdir = Path(workdir)
    step(f'loading {model}', verbose)
    splade = Splade.from_pretrained(resolve_model(model), precision=precision, batch_size=batch_size)

    step('BM25: indexing the 11,429 documents (once; reopened by later runs)', verbose)
    bm25 = systems.bm25(workdir / 'vaswani.pisa', dataset.get_corpus_iter(verbose=False), verbose=verbose)

    lsr_path = workdir / f'vaswani.{Path(model).name}.lsr'
    index = LsrIndex(lsr_path, splade, verbose=verbose)
    if not index.built():
        step('SPLADE: encoding and indexing the 11,429 documents (once)', verbose)
        index.index(dataset.get_corpus_iter(verbose=False))  # the index's own bar counts documents/s

    step('IDF query sides: document frequencies of the index and of the corpus', verbose)
    idf_index = IDFQueryEncoder.from_index(index)
    idf_corpus = IDFQueryEncoder.from_corpus(
        splade.tokenizer, (d['text'] for d in dataset.get_corpus_iter(verbose=False))
    )
    step('evaluating the 4 systems on the 93 topics', verbose)
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
    parser.add_argument('--threads', type=int, default=1,
                        help='torch threads (default 1, right on a shared machine; your cores on a quiet one)')
    parser.add_argument('--quiet', action='store_true', help='print the table only, no progress')
    args = parser.parse_args()
    require_models(args.model)  # the offline checkpoint (the demo extra), before any work
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import pandas as pd
    import torch

    torch.set_num_threads(args.threads)
    table = experiment(args.model, args.workdir, args.precision, args.batch_size, verbose=not args.quiet)
    with pd.option_context('display.width', 200, 'display.max_columns', 10):
        print(table.to_string(index=False))


if __name__ == '__main__':
    main()
