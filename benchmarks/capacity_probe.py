"""How far can a SPLADE model get on a collection when trained on that collection's *real* queries?

A diagnostic for the domain-adaptation target (examples/domain_adaptation.py trains without the test queries):
if the model cannot reach a score even when trained on in-domain relevance judgements, the self-supervised
recipe cannot be expected to. Two modes, both clearly *not* results to compare with zero-shot systems:

- ``cv``: 2-fold cross-validation over the topics (train on one half's qrels, evaluate on the other half);
- ``fit``: train and evaluate on all topics (how well the model can fit the test queries at all).

Examples: each (query, relevant document) pair, with ``--negatives`` non-relevant documents sampled from the
query's BM25 top ``--depth``; InfoNCE with in-batch negatives (``--no-in-batch``: over each query's own candidates
only; a topic has ~20 relevant documents, so other examples of a batch are often relevant to it and in-batch
negatives are then false negatives); FLOPS as in examples/domain_adaptation.py; the bundled loop and evaluator.

    OMP_NUM_THREADS=1 python benchmarks/capacity_probe.py --irds-cache PATH --steps 150

Prints a table and writes benchmarks/results/capacity_probe.json (--output).
"""
import argparse
import json
import random
import tempfile
import time
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--dataset', default='irds:vaswani', help='irds:<id> or a collection folder')
    p.add_argument('--model', default='splade-tiny')
    p.add_argument('--modes', nargs='+', choices=['cv', 'fit'], default=['cv', 'fit'])
    p.add_argument('--steps', type=int, default=150)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--lr', type=float, default=1e-4)
    p.add_argument('--negatives', type=int, default=3)
    p.add_argument('--depth', type=int, default=30)
    p.add_argument('--doc-max-length', type=int, default=96)
    p.add_argument('--in-batch', action=argparse.BooleanOptionalAction, default=True)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--bf16', action='store_true', help='bf16 autocast (fast only on CPUs with AMX/avx512_bf16 or GPUs)')
    p.add_argument('--irds-cache')
    p.add_argument('--output', default='benchmarks/results/capacity_probe.json')
    args = p.parse_args()
    from pyterrier_lsr.core.offline import resolve_model, use_irds_cache
    if args.irds_cache:  # before ir_datasets is imported
        use_irds_cache(args.irds_cache)

    import pyterrier as pt
    import pyterrier_pisa
    from pyterrier.measures import nDCG

    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.collection import load_collection
    from pyterrier_lsr.train import TrainConfig, experiment_evaluator, from_qrels, train
    collection = load_collection(args.dataset)
    corpus, topics, qrels = collection.corpus, collection.topics, collection.qrels
    texts = {d['docno']: d['text'] for d in corpus}
    order = list(topics['qid'])
    random.Random(args.seed).shuffle(order)
    halves = [topics[topics['qid'].isin(order[:len(order) // 2])], topics[topics['qid'].isin(order[len(order) // 2:])]]
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.steps // 10,
                         lambda_q=1e-3, lambda_d=1e-3, in_batch_negatives=args.in_batch,
                         flops_warmup_steps=args.steps // 3,
                         doc_max_length=args.doc_max_length, bf16=args.bf16, seed=args.seed, log_every=10)
    runs = {'cv': [(halves[0], halves[1]), (halves[1], halves[0])], 'fit': [(topics, topics)]}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        bm25 = pyterrier_pisa.PisaIndex(f'{tmp}/bm25.pisa', text_field='text')
        bm25.index(corpus)
        retriever = bm25.bm25(num_results=args.depth, verbose=False)
        for mode in args.modes:
            for fold, (train_topics, test_topics) in enumerate(runs[mode]):
                splade = Splade.from_pretrained(resolve_model(args.model))
                evaluate = experiment_evaluator(splade.tokenizer, corpus, test_topics, qrels, [nDCG @ 10],
                                                precision='bf16' if args.bf16 else 'fp32')
                before = evaluate(splade.model)['nDCG@10']
                examples = from_qrels(train_topics, qrels, texts, retriever, args.negatives, args.depth, args.seed)
                start = time.time()
                log = train(splade.model, splade.tokenizer, examples, f'{tmp}/{mode}{fold}', config)
                seconds = time.time() - start
                after = evaluate(splade.model)['nDCG@10']
                bm25_score = float(pt.Experiment([bm25.bm25()], test_topics, qrels, [nDCG @ 10])['nDCG@10'].iloc[0])
                last = log[-1]
                results.append({'mode': mode, 'fold': fold, 'train_topics': len(train_topics),
                                'test_topics': len(test_topics), 'examples': len(examples), 'before': before,
                                'after': after, 'bm25': bm25_score, 'd_nnz': last['d_nnz'], 'q_nnz': last['q_nnz'],
                                'train_seconds': round(seconds)})
                print(json.dumps(results[-1]), flush=True)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps({'args': vars(args), 'results': results}, indent=1))
    print('| mode | fold | train / test topics | examples | BM25 | before | after | doc / query nnz |')
    print('|---|---:|---|---:|---:|---:|---:|---|')
    for r in results:
        print(f"| {r['mode']} | {r['fold']} | {r['train_topics']} / {r['test_topics']} | {r['examples']} | "
              f"{r['bm25']:.3f} | {r['before']:.3f} | {r['after']:.3f} | {r['d_nnz']:.0f} / {r['q_nnz']:.0f} |")


if __name__ == '__main__':
    main()
