"""BM25, SPLADE, IDF queries, Latent Terms and VT-SPLADE on plain files; a re-run only evaluates (docs/assignment.md).

Progress goes to stderr (a line per stage, then its bars), the table to stdout; --quiet prints the table alone."""
import argparse
import contextlib
import sys
import time
from pathlib import Path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('collection', help='a folder holding docs.jsonl, topics.tsv and qrels.txt')
    parser.add_argument('--workdir', default='assignment', help='models and indexes, reused by a second run')
    parser.add_argument('--steps', type=int, default=120, help="VT-SPLADE's training steps (default: the recipe's 120)")
    parser.add_argument('--latents', type=int, default=16384, help="Latent Terms' SAE width")
    parser.add_argument('--threads', type=int, default=1, help='torch threads (default 1, right on a shared machine)')
    parser.add_argument('--quiet', action='store_true', help='print the table only, no progress')
    a = parser.parse_args(argv)
    # the extras, checked in a fraction of a second before the long part (the plot is drawn last)
    from pyterrier_lsr.core.extras import require_extra
    require_extra('demo', needed_for='the offline checkpoints splade-tiny and all-MiniLM-L6-v2')
    require_extra('report', 'matplotlib', needed_for='the plot')
    start, v = time.monotonic(), not a.quiet

    def step(text):  # on stderr: stdout holds the table alone
        if v:
            print(f'[{time.monotonic() - start:5.0f} s] {text}', file=sys.stderr, flush=True)

    step('loading the libraries and the collection')
    import pyterrier as pt
    import torch
    from pyterrier.measures import AP, R, nDCG

    from pyterrier_lsr import IDFQueryEncoder, Splade, load_collection
    from pyterrier_lsr.core.quiet import quiet_native
    from pyterrier_lsr.report import figure
    from pyterrier_lsr.systems import bm25, latent_terms_index, sparse_index, vt_splade
    from pyterrier_lsr.train import DomainConfig
    torch.set_num_threads(a.threads)
    c, w = load_collection(a.collection), Path(a.workdir)
    n = f'{len(c.corpus):,} documents'
    # PISA's and transformers' own output is shown only if something fails; the builders' logs join the progress
    with quiet_native(progress=v), contextlib.redirect_stdout(sys.stderr):
        step(f'SPLADE (splade-tiny): encoding and indexing {n}')
        splade = sparse_index(w / 'splade.lsr', Splade.from_pretrained('splade-tiny'), c.corpus, verbose=v)
        step(f'VT-SPLADE: new vocabulary, teachers and pseudo-queries, then {a.steps} training steps')
        vt = vt_splade(c.corpus, w / 'vt-splade', DomainConfig.two_sided(steps=a.steps), cache_dir=w / 'cache',
                       verbose=v)
        step(f'BM25: indexing {n}')
        s = {'BM25': bm25(w / 'bm25.pisa', c.corpus, verbose=v), 'SPLADE': splade.retriever(),
             'SPLADE + IDF queries': splade.retriever(query_encoder=IDFQueryEncoder.from_index(splade))}
        step(f'Latent Terms: MiniLM token embeddings of {n}, a {a.latents:,}-latent autoencoder, the index')
        s['Latent Terms'] = latent_terms_index(w / 'latent-terms.lsr', c.corpus, cache_dir=w / 'cache', verbose=v,
                                               sae={'n_latents': a.latents, 'k': 16}).retriever()
        step(f'VT-SPLADE: encoding and indexing {n}')
        s['VT-SPLADE'] = sparse_index(w / 'vt-splade.lsr', vt, c.corpus, verbose=v).retriever()
        step(f'evaluating the {len(s)} systems on {len(c.topics)} topics')
        table = pt.Experiment(list(s.values()), c.topics, c.qrels, [nDCG @ 10, AP, R @ 100, 'mrt'], names=list(s))
    print(table.to_string(index=False, float_format='%.3f'))
    figure(table, 'nDCG@10', 'mrt').savefig(w / 'plot.png', dpi=120, bbox_inches='tight')
    step(f'done; the plot is {w / "plot.png"}')


if __name__ == '__main__':
    main()
