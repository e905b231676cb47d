"""Domain adaptation without the test queries: fine-tune a SPLADE model on a corpus with self-supervised pairs
(pseudo-queries sampled from documents, BM25 hard negatives) and distillation from a teacher (MiniLM, BM25 or their
z-score fusion), with the bundled training loop. The test queries are used only to report the curve.

    python examples/domain_adaptation.py --irds-cache ../shared/ir_datasets            # Vaswani, SPLADE-tiny
    python examples/domain_adaptation.py --dataset irds:antique/test --model splade-tiny --steps 600

Writes <output>/metrics.{csv,json} (loss parts, non-zeros, FLOPS, lr and nDCG@10 over steps) and <output>/result.json.
"""
import argparse
import json
import time
from pathlib import Path

from pyterrier_lsr.offline import resolve_model, use_irds_cache


def run(args):
    import pyterrier as pt
    import pyterrier_pisa
    from pyterrier.measures import nDCG

    from pyterrier_lsr import Splade
    from pyterrier_lsr.train import (DenseScorer, RetrieverScorer, TrainConfig, ZScoreFusion, add_teacher_scores,
                                     experiment_evaluator, self_supervised, train)
    dataset = pt.get_dataset(args.dataset)
    corpus = [{'docno': d['docno'], 'text': d['text']} for d in dataset.get_corpus_iter(verbose=False)]
    topics, qrels = dataset.get_topics(), dataset.get_qrels()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    start = time.time()

    bm25_index = pyterrier_pisa.PisaIndex(str(output / 'bm25.pisa'), text_field='text')
    if not bm25_index.built():
        bm25_index.index(corpus)
    examples = self_supervised(corpus, num_negatives=args.negatives, depth=args.depth, seed=args.seed,
                               per_doc=args.per_doc, bm25_index=bm25_index)
    teachers = {'bm25': lambda: RetrieverScorer(bm25_index.bm25(), {d['docno']: d['text'] for d in corpus}),
                'minilm': lambda: DenseScorer(resolve_model(args.dense_teacher))}
    if args.teacher != 'none':
        names = ['bm25', 'minilm'] if args.teacher == 'fusion' else [args.teacher]
        scorer = ZScoreFusion([teachers[n]() for n in names], [args.teacher_scale] * len(names))
        examples = add_teacher_scores(examples, scorer)
    prep_seconds = time.time() - start

    splade = Splade.from_pretrained(resolve_model(args.model))
    losses = dict(item.split('=') for item in args.losses.split(','))
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.steps // 10,
                         losses={k: float(v) for k, v in losses.items()}, lambda_q=args.lambda_q, lambda_d=args.lambda_d,
                         flops_warmup_steps=args.steps // 3, doc_max_length=args.doc_max_length, bf16=args.bf16,
                         seed=args.seed, eval_every=args.eval_every, log_every=10)
    evaluate = experiment_evaluator(splade.tokenizer, corpus, topics, qrels, [nDCG @ 10], precision='bf16' if args.bf16 else 'fp32')
    zero_shot = evaluate(splade.model)
    train_start = time.time()
    log = train(splade.model, splade.tokenizer, examples, output, config, evaluate=evaluate)
    result = {'args': vars(args), 'zero_shot': zero_shot, 'final': {k: v for k, v in log[-1].items()},
              'prep_seconds': round(prep_seconds), 'train_seconds': round(time.time() - train_start),
              'curve': [(row['step'], row['nDCG@10']) for row in log if 'nDCG@10' in row]}
    (output / 'result.json').write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dataset', default='irds:vaswani')
    parser.add_argument('--model', default='splade-tiny')
    parser.add_argument('--dense-teacher', default='all-MiniLM-L6-v2')
    parser.add_argument('--teacher', choices=['none', 'bm25', 'minilm', 'fusion'], default='fusion')
    parser.add_argument('--teacher-scale', type=float, default=2.0, help='weight of each z-normalized teacher score')
    parser.add_argument('--losses', default='infonce=1,kl=1')
    parser.add_argument('--steps', type=int, default=600)
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--negatives', type=int, default=3)
    parser.add_argument('--depth', type=int, default=30, help='BM25 depth negatives are sampled from')
    parser.add_argument('--per-doc', type=int, default=1, help='pseudo-queries per document')
    parser.add_argument('--lr', type=float, default=5e-5)
    parser.add_argument('--lambda-q', type=float, default=1e-3)
    parser.add_argument('--lambda-d', type=float, default=1e-3)
    parser.add_argument('--doc-max-length', type=int, default=128)
    parser.add_argument('--bf16', action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument('--eval-every', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--output', default='runs/domain_adaptation')
    parser.add_argument('--irds-cache', help='a prepared ir_datasets cache (copied to a temporary folder)')
    args = parser.parse_args()
    if args.irds_cache:
        use_irds_cache(args.irds_cache)
    run(args)


if __name__ == '__main__':
    main()
