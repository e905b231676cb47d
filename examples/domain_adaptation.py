"""Domain adaptation without any query of the collection: ``pyterrier_lsr.train.domain_adapt``.

Pseudo-queries sampled from the corpus, candidates and teacher scores from BM25 and a dense bi-encoder (cached under
--cache-dir), training with the bundled loop, checkpoint selection on held-out pseudo-queries and a never-worse guard
(the starting model comes back when training does not beat it on them). The test topics are used only to report
nDCG@10 of the starting and the returned model (--no-evaluate skips that).

    OMP_NUM_THREADS=1 python examples/domain_adaptation.py --collection irds:vaswani --irds-cache PATH
    python examples/domain_adaptation.py --collection path/to/cisi --set steps=200 queries=keywords

Writes <output>/model (the returned model), <output>/domain_adapt.json (settings, held-out curve, decision) and
<output>/result.json (with the test scores).
"""
import argparse
import json
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--collection', default='irds:vaswani', help='irds:<id> or a folder (docs.jsonl, topics, qrels)')
    p.add_argument('--model', default='splade-tiny')
    p.add_argument('--set', nargs='*', default=[], metavar='NAME=VALUE',
                   help='DomainConfig overrides, e.g. steps=200 queries=keywords candidates=teacher negatives=7')
    p.add_argument('--output', default='runs/domain_adaptation')
    p.add_argument('--cache-dir', help='BM25 index, dense embeddings and examples (default: <output>/cache)')
    p.add_argument('--evaluate', action=argparse.BooleanOptionalAction, default=True,
                   help='report test nDCG@10 of the starting and the returned model')
    p.add_argument('--threads', type=int, default=1, help='torch threads (1 on a shared machine)')
    p.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    args = p.parse_args()
    from pyterrier_lsr.core.extras import require_models
    from pyterrier_lsr.core.names import resolve_model
    from pyterrier_lsr.core.offline import use_irds_cache
    require_models(args.model)  # before any work
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    import torch
    torch.set_num_threads(args.threads)
    from pyterrier.measures import nDCG

    from pyterrier_lsr import Splade, load_collection
    from pyterrier_lsr.train import domain_adapt, experiment_evaluator
    from pyterrier_lsr.train.domain import config_from_overrides

    collection = load_collection(args.collection)
    splade = Splade.from_pretrained(resolve_model(args.model))
    config = config_from_overrides(dict(item.split('=', 1) for item in args.set))
    # a query-side run keeps the starting model's documents: one index of them serves every evaluation
    test = experiment_evaluator(splade.tokenizer, collection.corpus, collection.topics, collection.qrels, [nDCG @ 10],
                                doc_model=splade.model if config.side == 'query' else None)
    zero_shot = test(splade.model)['nDCG@10'] if args.evaluate else None
    adapted_splade, log = domain_adapt(splade, collection.corpus, args.output, config, cache_dir=args.cache_dir)
    query_model = getattr(adapted_splade, 'query_splade', adapted_splade).model
    adapted = (zero_shot if log['guard'] else test(query_model)['nDCG@10']) if args.evaluate else None
    result = {'collection': args.collection, 'model': args.model, 'zero_shot_nDCG@10': zero_shot,
              'adapted_nDCG@10': adapted, **{k: log[k] for k in ('decision', 'selected_step', 'guard', 'start_score',
                                                                 'best_score', 'curve', 'config')}}
    (Path(args.output) / 'result.json').write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ('curve', 'config')}, indent=1))


if __name__ == '__main__':
    main()
