"""Which side of a two-sided domain adaptation helps: the test topics' nDCG@10 of every mix of zero-shot and adapted
query / document encoders (Q0D0 = zero-shot, QaDa = adapted, Q0Da = adapted documents with zero-shot queries, QaD0 =
adapted queries against zero-shot documents). A diagnostic (benchmarks/RESULTS.md, "Query-side adaptation"), never a
selection.

    OMP_NUM_THREADS=1 python benchmarks/side_swap.py path/to/cisi out.json runs/da4/cisi/base_s*/model
"""
import argparse
import json
import tempfile
import time
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('collection')
    p.add_argument('output')
    p.add_argument('models', nargs='+', help='adapted SPLADE-tiny model folders')
    p.add_argument('--irds-cache', help='a prepared ir_datasets cache for irds: collections (copied first)')
    args = p.parse_args()
    from pyterrier_lsr.core.offline import resolve_model, use_irds_cache
    if args.irds_cache and args.collection.startswith('irds:'):
        use_irds_cache(args.irds_cache)
    import pyterrier as pt
    import torch
    from pyterrier.measures import nDCG

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.index import SpladeIndexer
    torch.set_num_threads(1)

    collection = load_collection(args.collection)
    models = {'zero': Splade.from_pretrained(resolve_model('splade-tiny')),
              **{m: Splade.from_pretrained(m) for m in args.models}}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        indexes = {}
        for i, (name, splade) in enumerate(models.items()):
            start = time.time()
            indexes[name] = SpladeIndexer(f'{tmp}/{i}.lsr', splade, verbose=False, save_model=False).index(
                collection.corpus)
            print(name, 'indexed in', round(time.time() - start), 's', flush=True)
        zero = models['zero']
        for name in args.models:
            mixes = {'Q0D0': (zero, 'zero'), 'QaDa': (models[name], name), 'Q0Da': (zero, name),
                     'QaD0': (models[name], 'zero')}
            pipes = [q.query_encoder() >> indexes[d].toks_retriever() for q, d in mixes.values()]
            table = pt.Experiment(pipes, collection.topics, collection.qrels, [nDCG @ 10], names=list(mixes))
            results[name] = dict(zip(table['name'], table['nDCG@10']))
            print(name, {k: round(v, 4) for k, v in results[name].items()}, flush=True)
    Path(args.output).write_text(json.dumps(results, indent=1))


if __name__ == '__main__':
    main()
