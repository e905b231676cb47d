"""The trained methods with the domain-adaptation recipe on one collection, same budget per method (issue #14).

Each method goes through :mod:`pyterrier_lsr.systems` with one :class:`~pyterrier_lsr.train.DomainConfig` (the
defaults unless ``--set``): adapted SPLADE-tiny, VT-SPLADE (SPLADE-tiny's vocabulary extended by the corpus's
``--extend`` most frequent split words), SAE-SPLADE (a TopK SAE of ``--latents`` latents, ``--k`` per token, trained
``--sae-epochs`` on SPLADE-tiny's token states, then the recipe), and SPLADE-tiny zero-shot as the reference.
:func:`pyterrier_lsr.report.report` measures them (nDCG@10, AP, postings per query, ...); VT-SPLADE is also compared
with SPLADE on the topics that contain one of its added words (the seed's claim). ``--minilm`` adds MiniLM-SPLADE
(all-MiniLM-L6-v2 with a new, calibrated head: :func:`~pyterrier_lsr.systems.new_head_splade`);
``--vt-warmup`` adds VT-SPLADE with an embedding warm-up (a first run that trains only the added words' rows);
``--sae-set`` a second SAE-SPLADE with its own settings. SPLADE-tiny also adapts with the default, query-side recipe
(its documents read from the zero-shot index); ``--then`` adds a query-side stage after each two-sided method
(documents from that system's index). ``--methods`` runs a subset (folder names: ``splade vt sae``...; zero-shot
SPLADE-tiny always runs).

    OMP_NUM_THREADS=1 python benchmarks/methods_transfer.py --collection path/to/cisi \\
        --workdir runs/methods_cisi

Re-runs reuse every trained model and index in ``--workdir``. Writes ``--output`` (JSON) and the report files.
"""
import argparse
import json
import time
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', required=True, help='irds:<id> or a folder (docs.jsonl, topics, qrels)')
    p.add_argument('--workdir', required=True)
    p.add_argument('--cache-dir', help='BM25 index, dense embeddings and examples (default: <workdir>/cache)')
    p.add_argument('--set', nargs='*', default=[], metavar='NAME=VALUE', help='DomainConfig overrides')
    p.add_argument('--extend', type=int, default=1000, help='words added to the vocabulary by VT-SPLADE')
    p.add_argument('--latents', type=int, default=4096, help='SAE width of SAE-SPLADE')
    p.add_argument('--k', type=int, default=4, help='SAE latents per token of SAE-SPLADE')
    p.add_argument('--sae-epochs', type=int, default=1, help='epochs of SAE-SPLADE\'s stage-1 SAE over its sample')
    p.add_argument('--sae-set', nargs='*', default=[], metavar='NAME=VALUE',
                   help='also SAE-SPLADE trained with these DomainConfig overrides, e.g. '
                        'lr_multipliers=latent_threshold:100 (its FLOPS-aware latent thresholds learn faster)')
    p.add_argument('--minilm', action='store_true', help='also MiniLM-SPLADE (all-MiniLM-L6-v2 with a new head)')
    p.add_argument('--vt-warmup', nargs='*', default=[], metavar='NAME=VALUE',
                   help='also VT-SPLADE with an embedding warm-up (only the added words train first), these '
                        'DomainConfig overrides for the warm-up run, e.g. steps=40 lr=1e-3')
    p.add_argument('--then', nargs='*', metavar='NAME=VALUE',
                   help='also a query-side stage (DomainConfig defaults, these overrides) after each two-sided '
                        'method, reading its documents from its index')
    p.add_argument('--methods', nargs='*', metavar='FOLDER',
                   help='only these methods (their folder names: splade vt sae sae-set minilm vt-warmup)')
    p.add_argument('--output', default='benchmarks/results/methods_transfer.json')
    p.add_argument('--irds-cache')
    p.add_argument('--threads', type=int, default=1)
    args = p.parse_args()
    from pyterrier_lsr.core.offline import resolve_model, use_irds_cache
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(args.threads)
    import pyterrier as pt
    from pyterrier.measures import AP, nDCG

    from pyterrier_lsr import Splade, systems
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.report import System, report
    from pyterrier_lsr.train.domain import DomainConfig, config_from_overrides

    def overrides(items, base=None):
        return config_from_overrides(dict(item.split('=', 1) for item in items), base)

    collection = load_collection(args.collection)
    work = Path(args.workdir)
    # every method with the same two-sided budget (the seeds' claims compare them so), plus SPLADE with the default
    # (query-side) recipe
    config = overrides(args.set, DomainConfig.two_sided())
    cache = Path(args.cache_dir) if args.cache_dir else work / 'cache'
    base = resolve_model('splade-tiny')
    # epochs only when not SAEConfig's default (1), so work folders of earlier runs keep matching their settings
    sae = {'n_latents': args.latents, 'k': args.k, **({'epochs': args.sae_epochs} if args.sae_epochs != 1 else {})}
    timings, models = {}, {}
    # name -> (folder in --workdir, builder); each index is <folder>.lsr
    builders = {
        'SPLADE-tiny zero-shot': ('zero-shot', lambda: Splade.from_pretrained(base)),
        'SPLADE-tiny adapted': ('splade', lambda: systems.adapted(lambda: Splade.from_pretrained(base),
                                                                  collection.corpus, work / 'splade', config, cache)),
        f'VT-SPLADE (+{args.extend} words)': ('vt', lambda: systems.vt_splade(collection.corpus, work / 'vt', config,
                                                                              base, args.extend, cache_dir=cache)),
        f'SAE-SPLADE (k={args.k})': ('sae', lambda: systems.sae_splade(collection.corpus, work / 'sae', config, base,
                                                                       sae, cache_dir=cache)),
    }
    if args.sae_set:
        sae_config = overrides(args.sae_set, config)
        builders[f'SAE-SPLADE (k={args.k}, {" ".join(args.sae_set)})'] = ('sae-set', lambda: systems.sae_splade(
            collection.corpus, work / 'sae-set', sae_config, base, sae, cache_dir=cache))
    if args.minilm:
        builders['MiniLM-SPLADE (new head)'] = ('minilm', lambda: systems.new_head_splade(
            collection.corpus, work / 'minilm', config, cache_dir=cache))
    if args.vt_warmup:
        warmup = overrides(args.vt_warmup, config)
        builders[f'VT-SPLADE (+{args.extend} words, warm-up)'] = ('vt-warmup', lambda: systems.vt_splade(
            collection.corpus, work / 'vt-warmup', config, base, args.extend, warmup, cache))
    if args.methods is not None:
        unknown = set(args.methods) - {folder for folder, _ in builders.values()}
        if unknown:
            p.error(f'unknown --methods {sorted(unknown)}; known: {sorted(f for f, _ in builders.values())}')
        builders = {n: b for n, b in builders.items() if b[0] in {'zero-shot', *args.methods}}
    for name, (_, build) in builders.items():
        start = time.time()
        models[name] = build()
        timings[name] = round(time.time() - start, 1)
        print(f'{name}: {timings[name]} s', flush=True)
    run = []
    indexes = {}
    for name, model in models.items():
        indexes[name] = systems.sparse_index(work / f'{builders[name][0]}.lsr', model, collection.corpus)
        run.append(System(name, indexes[name].toks_retriever(), str(indexes[name].path), model.query_encoder()))
    # query-side stages: the default recipe on zero-shot SPLADE, and (--then) after each two-sided method; each
    # reads its documents from the first stage's index and is served by it
    query_config = overrides(args.then or [], DomainConfig(seed=config.seed))
    stages = {'SPLADE-tiny adapted (query side)': ('SPLADE-tiny zero-shot', work / 'splade-query')}
    if args.then is not None:
        stages.update({f'{name} + query side': (name, work / builders[name][0] / 'queries') for name in models
                       if name != 'SPLADE-tiny zero-shot'})
    for name, (first, folder) in stages.items():
        start = time.time()
        model = systems.adapted(lambda: models[first], collection.corpus, folder, query_config, cache,
                                documents=indexes[first])
        timings[name] = round(time.time() - start, 1)
        print(f'{name}: {timings[name]} s', flush=True)
        run.append(System(name, indexes[first].toks_retriever(), str(indexes[first].path), model.query_encoder()))
        models[name] = model
    measures = [nDCG @ 10, AP]
    table = report(run, collection.topics, collection.qrels, measures, work / 'report', title=collection.name)
    print(table.to_string())
    # VT-SPLADE's claim: at least as good as SPLADE on the topics that contain one of its added words
    vt_names = [n for n in models if n.startswith('VT')]
    with_added, subset = [], None
    if vt_names:
        base_vocab = set(models['SPLADE-tiny zero-shot'].tokenizer.get_vocab())
        added = set(models[vt_names[0]].tokenizer.get_vocab()) - base_vocab
        tokenize = models[vt_names[0]].tokenizer.tokenize
        with_added = collection.topics[[bool(set(tokenize(q)) & added) for q in collection.topics['query']]]
        compared = [s for s in run if s.name.startswith(('SPLADE-tiny adapted', 'VT-SPLADE'))]
        subset = pt.Experiment([s.pipeline() for s in compared], with_added, collection.qrels, [nDCG @ 10],
                               names=[s.name for s in compared]) if len(with_added) else None
    if subset is not None:
        print(f'{len(with_added)} of {len(collection.topics)} topics contain an added word:\n{subset.to_string()}')
    decisions = {str(log.parent.relative_to(work)): json.loads(log.read_text())['decision']
                 for log in sorted(work.glob('**/domain_adapt.json'))}
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        'collection': collection.name, 'set': args.set,
        'extend': args.extend, 'vt_warmup': args.vt_warmup, 'then': args.then, 'sae_set': args.sae_set,
        'latents': args.latents, 'k': args.k, 'sae_epochs': args.sae_epochs, 'methods': args.methods,
        'seconds': timings, 'decisions': decisions,
        'table': json.loads(table.to_json(orient='records')),
        'topics_with_added_word': len(with_added),
        'vt_subset': None if subset is None else json.loads(subset.to_json(orient='records')),
        'date': time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, indent=1))


if __name__ == '__main__':
    main()
