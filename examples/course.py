"""The course kit: every method of the project on Vaswani in one re-runnable script, one experiment table.

BM25 (PISA), SPLADE (offline splade-tiny), SPLADE documents + IDF queries (inference-free), Latent Terms (a TopK SAE
over the token embeddings of ``--dense``: all-mpnet-base-v2 when its packages are installed, else all-MiniLM-L6-v2),
VT-SPLADE (splade-tiny + Vaswani words), SAE-SPLADE (splade-tiny's token states through a TopK SAE) and
domain-adapted SPLADE; the three trained systems train with ``pyterrier_lsr.train.domain_adapt`` (pseudo-queries
from the corpus only, never the test topics) for ``--steps`` (VT- and SAE-SPLADE, both sides) or 3x as many (the
adapted SPLADE: its query encoder alone, the default recipe; VT-SPLADE's queries adapt that way too after its
two-sided training).

    python examples/course.py --irds-cache PATH                     # all of Vaswani
    python examples/course.py --irds-cache PATH --docs 2000 --topics 30 --steps 60

Everything is cached under ``--workdir`` (one folder per corpus size, trained models per step count): a second run
reuses the indexes and models and only evaluates.  ``--docs`` keeps the topics' relevant documents plus the first
others (``Collection.subset``).  Progress goes to stderr (a line per stage, then its bars), the table to stdout;
``--quiet`` prints the table alone.
"""
import argparse
import contextlib
import sys
import time
from pathlib import Path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--docs', type=int, help='corpus subset size (default: all 11,429 documents)')
    parser.add_argument('--topics', type=int, help='first N topics (default: all 93)')
    parser.add_argument('--steps', type=int, default=120,
                        help='training steps of VT-SPLADE and SAE-SPLADE (both sides train); the adapted SPLADE '
                             '(query side only, a fraction of the cost per step) runs 3x as many')
    parser.add_argument('--latents', type=int, default=4096, help='SAE width of Latent Terms and SAE-SPLADE')
    parser.add_argument('--dense', help="Latent Terms' dense base (default: the strongest installed offline one, "
                        'all-mpnet-base-v2 or all-MiniLM-L6-v2)')
    parser.add_argument('--workdir', default='course', help='models, indexes and caches; reused by later runs')
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    parser.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    parser.add_argument('--quiet', action='store_true', help='print the table only, no progress')
    args = parser.parse_args(argv)
    from pyterrier_lsr.core.extras import require_extra
    require_extra('demo', needed_for='the offline checkpoints splade-tiny and all-MiniLM-L6-v2')  # before any work
    start, v = time.monotonic(), not args.quiet

    def step(text):  # on stderr: stdout holds the table alone
        if v:
            print(f'[{time.monotonic() - start:5.0f} s] {text}', file=sys.stderr, flush=True)

    step('loading the libraries and the collection')
    from pyterrier_lsr.core.offline import use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)  # before anything imports ir_datasets

    import pandas as pd
    import pyterrier as pt
    import torch
    from pyterrier.measures import AP, RR, R, nDCG

    from pyterrier_lsr import IDFQueryEncoder, Splade, load_collection
    from pyterrier_lsr.core.quiet import quiet_native
    from pyterrier_lsr.systems import (
        SAE_SPLADE,
        adapted,
        best_dense,
        bm25,
        latent_terms_index,
        sae_splade,
        sparse_index,
        vt_splade,
    )
    from pyterrier_lsr.train import DomainConfig
    torch.set_num_threads(args.threads)
    dense = args.dense or best_dense()

    data = load_collection('irds:vaswani').subset(args.docs, args.topics)
    corpus, n = data.corpus, f'{len(data.corpus):,} documents'
    work = Path(args.workdir) / f'vaswani-{args.docs or "all"}'
    trained = work / f'{args.steps}-steps'
    # selection holds out up to 60 pseudo-queries' documents, at most a tenth of a small corpus
    heldout = min(60, len(corpus) // 10)
    config = DomainConfig.two_sided(steps=args.steps, heldout=heldout)
    query_side = DomainConfig(steps=3 * args.steps, heldout=heldout)  # the recipe's 360 steps for --steps 120
    cache = work / 'cache'  # BM25 index, dense embeddings and examples shared by the trained systems

    # PISA's and transformers' own output is shown only if something fails; the builders' logs join the progress
    with quiet_native(progress=v), contextlib.redirect_stdout(sys.stderr):
        step(f'SPLADE (splade-tiny): encoding and indexing {n}')
        splade = Splade.from_pretrained('splade-tiny')
        splade_index = sparse_index(work / 'splade.lsr', splade, corpus, verbose=v)
        step(f'VT-SPLADE: new vocabulary, teachers and pseudo-queries, {args.steps} two-sided steps, the index')
        vt = vt_splade(corpus, trained / 'vt-splade', config, cache_dir=cache, verbose=v)
        vt_index = sparse_index(trained / 'vt-splade.lsr', vt, corpus, verbose=v)
        # then its queries alone adapt (the default recipe), reading the VT documents from its index
        step(f"VT-SPLADE's queries: {query_side.steps} query-side steps")
        vt_queries = adapted(lambda: vt, corpus, trained / 'vt-splade-queries', query_side, cache_dir=cache,
                             verbose=v, documents=vt_index)
        step(f'SAE-SPLADE: token states, a {args.latents:,}-latent autoencoder, {args.steps} two-sided steps')
        sae = sae_splade(corpus, trained / f'sae-splade-{args.latents}', config,
                         sae={**SAE_SPLADE, 'n_latents': args.latents}, cache_dir=cache, verbose=v)
        # the adapted SPLADE's documents are splade-tiny's: it reads them from splade.lsr, which then serves it
        step(f'adapted SPLADE: {query_side.steps} query-side steps')
        da = adapted(lambda: splade, corpus, trained / 'splade-adapted', query_side, cache_dir=cache, verbose=v,
                     documents=splade_index)
        step(f'BM25: indexing {n}')
        systems = [bm25(work / 'bm25.pisa', corpus, verbose=v), splade_index.retriever(),
                   splade_index.retriever(query_encoder=IDFQueryEncoder.from_index(splade_index))]
        step(f'Latent Terms over {dense}: token embeddings of {n}, a {args.latents:,}-latent autoencoder, the index')
        systems.append(latent_terms_index(work / f'latent-terms-{dense}-{args.latents}.lsr', corpus, dense,
                                          cache_dir=cache, verbose=v,
                                          sae={'n_latents': args.latents, 'k': 16}).retriever())
        systems.append(vt_index.retriever(query_encoder=vt_queries.query_encoder()))
        step(f'SAE-SPLADE: encoding and indexing {n}')
        systems.append(sparse_index(trained / f'sae-splade-{args.latents}.lsr', sae, corpus, verbose=v).retriever())
        systems.append(splade_index.retriever(query_encoder=da.query_encoder()))
        step(f'evaluating the {len(systems)} systems on {len(data.topics)} topics')
        table = pt.Experiment(systems, data.topics, data.qrels, [nDCG @ 10, AP, R @ 100, RR @ 10, 'mrt'])
    with pd.option_context('display.width', 200, 'display.max_columns', 10, 'display.max_colwidth', 60):
        print(table.to_string(index=False))
    return table


if __name__ == '__main__':
    main()
