"""SAE-SPLADE vs SPLADE from the same backbone, data and training budget on Vaswani (docs/sae-splade.md).

Stage 1 trains a TopK SAE on the backbone's frozen token states of the corpus (``--n-latents``, ``--k``); stage 2
fine-tunes backbone + SAE encoder + α with the bundled loop.  The baseline fine-tunes the backbone's own SPLADE (its
MLM head) with exactly the same examples, steps, batch size and loop settings (examples/domain_adaptation.py's
self-supervised data and fusion teacher).  Each trained model is saved, indexed in PISA and measured: nDCG@10,
non-zeros per document and query, postings per query (the summed document frequencies of its terms: what an
exhaustive traversal reads) and ms/query (PISA, 1 thread, queries already encoded).

    OMP_NUM_THREADS=1 python examples/sae_splade.py --irds-cache PATH --cache-dir runs/cache

``--systems`` runs a subset (e.g. the two trainings in two processes; ``sae-splade-stage1`` is SAE-SPLADE before
stage 2); each system writes ``<output>/<system>/measures.json`` and ``<output>/summary.json`` collects the ones
present.  ``--stage1-dir`` shares one stage-1 SAE between outputs (e.g. runs with other FLOPS weights).  On a shared
machine ms/query drifts with the load, so ``--time-indexes A.lsr B.lsr ...`` re-times finished indexes interleaved, in
one process (``<output>/timing.json``), and ``--interpret MODEL`` writes ``<output>/interpret.json``: the top words
of the latents of the first topics, read off a sample of the corpus.
"""
import json
import time
from pathlib import Path

import numpy as np

from pyterrier_lsr import load_collection
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.systems.recipes import fine_tune, parse_args, parser, prepare_examples

SYSTEMS = ('sae-splade', 'splade', 'sae-splade-stage1')


def stage1(args, corpus, root: Path):
    """The stage-1 SAE (trained once, then reloaded from ``--stage1-dir``, default ``<output>/stage1``) and its
    training log."""
    from pyterrier_lsr.models.sae import SparseAutoencoder
    from pyterrier_lsr.train import train_token_sae
    folder = Path(args.stage1_dir or root / 'stage1')
    if (folder / 'log.json').exists():
        return SparseAutoencoder.from_pretrained(folder), json.loads((folder / 'log.json').read_text())
    start = time.time()
    settings = {'n_latents': args.n_latents, 'k': args.k, 'epochs': args.sae_epochs, 'seed': args.seed}
    sae, log = train_token_sae(resolve_model(args.model), [d['text'] for d in corpus], settings,
                               cache_dir=root / 'token_cache', max_train_vectors=args.sae_vectors,
                               max_length=args.max_length, batch_size=64)
    sae.save_pretrained(folder)
    log = {'settings': settings, 'max_train_vectors': args.sae_vectors, 'seconds': round(time.time() - start),
           'final': log[-1], 'curve': log}
    (folder / 'log.json').write_text(json.dumps(log, indent=1))
    return sae, log


def ms_per_query(index, queries, repeats: int = 3) -> float:
    """Median over ``repeats`` passes of PISA's time per query (1 thread, one query at a time, already encoded)."""
    run = index.toks_retriever(threads=1)
    timings = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(len(queries)):
            run(queries.iloc[i:i + 1])
        timings.append((time.perf_counter() - t0) / len(queries) * 1000)
    return float(np.median(timings))


def time_indexes(paths, topics, output: Path, rounds: int = 5) -> dict:
    """ms/query of finished indexes, timed in turn for ``rounds`` rounds so that load drifts hit all alike."""
    from pyterrier_lsr import LsrIndex
    indexes = {str(p): LsrIndex(p) for p in paths}
    queries = {p: index.model().query_encoder()(topics) for p, index in indexes.items()}
    times = {p: [] for p in indexes}
    for _ in range(rounds):
        for p, index in indexes.items():
            times[p].append(ms_per_query(index, queries[p], repeats=1))
    result = {p: {'median_ms': float(np.median(t)), 'all_ms': t} for p, t in times.items()}
    (output / 'timing.json').write_text(json.dumps(result, indent=1))
    return result


def interpret(folder, corpus, topics, output: Path, n_docs: int = 2000, n_queries: int = 3) -> dict:
    """What a model's latents mean: each of the first topics' top latents with the words of the query that fire it
    and its top words on ``n_docs`` sampled documents."""
    import random

    from pyterrier_lsr import SaeSplade
    model = SaeSplade.from_pretrained(str(folder))
    sample = [d['text'] for d in random.Random(0).sample(corpus, min(n_docs, len(corpus)))]
    words = model.top_words(sample, n=8)
    result = {row.query: model.explain(row.query, top=8, words=words) for row in topics.head(n_queries).itertuples()}
    (output / 'interpret.json').write_text(json.dumps(result, indent=1))
    return result


def measure(splade, corpus, topics, qrels, path: Path, repeats: int = 3) -> dict:
    """Indexes ``corpus`` with ``splade`` (a saved model, so the index records it) and measures effectiveness and
    cost; queries are encoded once, so ms/query is PISA alone."""
    import pyterrier as pt
    from pyterrier.measures import AP, R, nDCG

    from pyterrier_lsr import LsrIndex, SpladeIndexer
    from pyterrier_lsr.index import quantize
    start = time.time()
    index = SpladeIndexer(path, splade, overwrite=True, verbose=False).index(corpus)
    index_seconds = time.time() - start
    index = LsrIndex(path)  # reloads the recorded model: the round trip a user makes
    queries = index.model().query_encoder()(topics)
    run = index.toks_retriever(threads=1)
    res = pt.Experiment([run], queries, qrels, [nDCG @ 10, AP, R @ 100], names=['model'])
    df = index.document_frequencies()
    query_terms = [quantize(q, index.scale) for q in queries['query_toks']]
    return {**{k: float(v) for k, v in res.drop(columns='name').iloc[0].items()},
            'doc_nnz': sum(df.values()) / index.num_docs(),
            'query_nnz': float(np.mean([len(q) for q in query_terms])),
            'postings_per_query': float(np.mean([sum(df.get(t, 0) for t in q) for q in query_terms])),
            'ms_per_query': ms_per_query(index, queries, repeats), 'index_seconds': round(index_seconds),
            'terms_in_index': len(df)}


def main():
    p = parser(description=__doc__, steps=250)
    p.set_defaults(output='runs/sae_splade', evaluate=False, zero_shot=False)
    p.add_argument('--systems', nargs='+', choices=SYSTEMS, default=list(SYSTEMS))
    p.add_argument('--n-latents', type=int, default=16384, help='SAE width')
    p.add_argument('--k', type=int, default=8, help='latents per token (TopK)')
    p.add_argument('--sae-epochs', type=int, default=3)
    p.add_argument('--sae-vectors', type=int, default=200_000, help='token vectors sampled to train the SAE')
    p.add_argument('--alpha', type=float, help='initial α (default: DEFAULT_ALPHA of pyterrier_lsr.models.sae_splade)')
    p.add_argument('--stage1-dir', help='the stage-1 SAE folder (default: <output>/stage1; trained there if absent)')
    p.add_argument('--time-indexes', nargs='+', help='only re-time these finished indexes (see above)')
    p.add_argument('--interpret', help='only describe the latents of this SAE-SPLADE model folder (see above)')
    args = parse_args(p)
    from pyterrier_lsr import SaeSplade, Splade
    from pyterrier_lsr.models.sae_splade import DEFAULT_ALPHA
    collection = load_collection(args.dataset)
    corpus, topics, qrels = collection.corpus, collection.topics, collection.qrels
    root = Path(args.output)
    root.mkdir(parents=True, exist_ok=True)
    if args.time_indexes:
        print(json.dumps(time_indexes(args.time_indexes, topics, root), indent=1))
        return
    if args.interpret:
        print(json.dumps(interpret(args.interpret, corpus, topics, root), indent=1))
        return
    examples = prepare_examples(args, corpus)
    for system in args.systems:
        out = root / system
        out.mkdir(parents=True, exist_ok=True)
        record = {'args': vars(args)}
        if system.startswith('sae-splade'):
            sae, record['stage1'] = stage1(args, corpus, root)
            splade = SaeSplade.from_backbone(resolve_model(args.model), sae, alpha=args.alpha or DEFAULT_ALPHA)
        else:
            splade = Splade.from_pretrained(resolve_model(args.model))
        if system != 'sae-splade-stage1':
            record['train'] = fine_tune(splade.model, splade.tokenizer, examples, corpus, topics, qrels, out, args)
        if system.startswith('sae-splade'):
            record['alpha'] = splade.model.alpha.item()
        splade.save_pretrained(str(out / 'model'))
        model = type(splade).from_pretrained(str(out / 'model'))
        record['measures'] = measure(model, corpus, topics, qrels, out / 'index.lsr')
        (out / 'measures.json').write_text(json.dumps(record, indent=1))
        print(system, json.dumps(record['measures'], indent=1))
    summary = {s: json.loads((root / s / 'measures.json').read_text()) for s in SYSTEMS
               if (root / s / 'measures.json').exists()}
    (root / 'summary.json').write_text(json.dumps(summary, indent=1))


if __name__ == '__main__':
    main()
