"""VT-SPLADE evidence on Vaswani: vocabulary transfer, MLM adaptation, APC, then the bundled SPLADE training.

Two experiments, each a set of arms trained under the same budget (``--experiment``):

``domain`` (real weights): SPLADE-tiny with its vocabulary extended by the ``--extend`` most frequent Vaswani words it
splits (``extend_vocabulary`` + ``transfer_vocabulary``: old tokens copy, new words are composed) vs the original
vocabulary. Both arms get the same MLM adaptation (``--mlm-steps``) on the corpus and the same SPLADE training as
examples/domain_adaptation.py (cached self-supervised examples and teacher scores). Reports nDCG@10 on all topics and
on the topics containing an added word, plus non-zeros.

``bpe`` (cased byte-level BPE backbones): a tiny RoBERTa-style and a tiny ModernBERT-style masked LM with a cased
byte-level BPE tokenizer trained here on the Vaswani corpus (mixed-case copies of the texts), pre-trained briefly as
MLMs; then ``original`` (SPLADE on the BPE vocabulary) vs ``vt`` (transfer to a lowercase WordPiece of the same size
trained on the corpus); both get the same MLM adaptation, APC (``--target-active``) and SPLADE training. Reports the
active fraction at step 0 too.

    OMP_NUM_THREADS=1 python examples/vocab_transfer.py --irds-cache PATH \
        --cache-dir runs/cache --experiment domain --arms original extended

Writes <output>/<experiment>/<arm>/{metrics.csv,result.json,arm.json} and <output>/<experiment>/summary.json; --results
copies the summary into benchmarks/results/.
"""

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from pyterrier_lsr import load_collection
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.systems.recipes import fine_tune, parse_args, parser, prepare_examples

DOMAIN_ARMS = ('original', 'extended')
BPE_ARMS = ('roberta-original', 'roberta-vt', 'modernbert-original', 'modernbert-vt')


def evaluate(model, tokenizer, corpus, topics, qrels, subset=()) -> dict:
    """nDCG@10 on all topics and on ``subset`` (qids), average non-zeros per indexed document and per query."""
    import pyterrier as pt
    from pyterrier.measures import nDCG

    from pyterrier_lsr import Splade, SpladeIndexer

    splade = Splade(model, tokenizer, batch_size=64)
    with tempfile.TemporaryDirectory() as tmp:
        index = SpladeIndexer(f'{tmp}/eval.lsr', splade).index(corpus)
        per_query = pt.Experiment([index.retriever()], topics, qrels, [nDCG @ 10], perquery=True)
        d_nnz = sum(index.document_frequencies().values()) / index.num_docs()
    scores = dict(zip(per_query['qid'], per_query['value']))
    queries = splade.encode(topics['query'].tolist())
    out = {
        'nDCG@10': sum(scores.get(q, 0.0) for q in topics['qid']) / len(topics),
        'd_nnz': d_nnz,
        'q_nnz': sum(map(len, queries)) / len(queries),
    }
    if len(subset):
        out['nDCG@10_subset'] = sum(scores.get(q, 0.0) for q in subset) / len(subset)
    return out


def mlm_config(args, steps: int, lr: float):
    from pyterrier_lsr.train import TrainConfig

    return TrainConfig(
        steps=steps,
        batch_size=args.mlm_batch_size,
        lr=lr,
        warmup_steps=steps // 10,
        precision=args.precision,
        seed=args.seed,
        log_every=args.log_every,
    )


def adapt(model, tokenizer, texts, output: Path, args, steps: int, lr: float) -> dict:
    """MLM adaptation with the bundled loop; returns the first and last logged MLM loss/accuracy."""
    from pyterrier_lsr.train import train_mlm

    if steps <= 0:
        return {}
    log = train_mlm(
        model,
        tokenizer,
        texts,
        output,
        mlm_config(args, steps, lr),
        mask_rate=args.mask_rate,
        max_length=args.mlm_max_length,
    )
    return {'first': log[0], 'last': log[-1]}


def domain_arm(arm: str, args, corpus, topics, qrels, examples):
    """SPLADE-tiny, original or Vaswani-extended vocabulary: transfer -> MLM adaptation -> SPLADE training."""
    from pyterrier_lsr import Splade
    from pyterrier_lsr.models.vocab_transfer import transfer_vocabulary
    from pyterrier_lsr.models.vocabularies import extend_vocabulary

    splade = Splade.from_pretrained(resolve_model(args.model))
    texts = [d['text'] for d in corpus]
    added, words = extend_vocabulary(splade.tokenizer, texts, args.extend)
    new_words = set(words)
    normalize = splade.tokenizer.backend_tokenizer.normalizer.normalize_str
    subset = [q.qid for q in topics.itertuples() if new_words & set(normalize(q.query).split())]
    model, tokenizer, report = splade.model, splade.tokenizer, {}
    if arm == 'extended':
        model, tokenizer, report = transfer_vocabulary(model, splade.tokenizer, added, temperature=args.temperature)
    return run_arm(
        arm,
        model,
        tokenizer,
        texts,
        args,
        corpus,
        topics,
        qrels,
        examples,
        subset,
        {'transfer': report, 'subset_size': len(subset)},
    )


def run_arm(arm, model, tokenizer, texts, args, corpus, topics, qrels, examples, subset, info: dict):
    """Evaluate, MLM-adapt, calibrate (``--target-active``), evaluate, SPLADE-train, evaluate; writes result.json."""
    from pyterrier_lsr.models.heads import calibrate_activation, head_report

    root = Path(args.output) / args.experiment / arm
    root.mkdir(parents=True, exist_ok=True)
    sample = random.Random(args.seed).sample(texts, min(args.calibration_texts, len(texts)))
    result = dict(info, arm=arm)
    start = time.time()
    if args.eval_start:
        result['start'] = evaluate(model, tokenizer, corpus, topics, qrels, subset)
    result['mlm'] = adapt(model.mlm, tokenizer, texts, root / 'mlm', args, args.mlm_steps, args.mlm_lr)
    result['mlm_seconds'] = round(time.time() - start)
    if args.target_active:
        result['calibration'] = calibrate_activation(model, tokenizer, sample, target_active=args.target_active)
    held_out = random.Random(args.seed + 1).sample(texts, 64)
    result['head'] = head_report(model, tokenizer, held_out)
    result['active_step0'] = result['head']['nonzeros_per_text'] / (model.vocab_size - len(model.special_token_ids))
    if args.eval_start and args.mlm_steps:
        result['after_mlm'] = evaluate(model, tokenizer, corpus, topics, qrels, subset)
    trained = fine_tune(model, tokenizer, examples, corpus, topics, qrels, root, args)
    result['step0'] = next(row for row in json.loads((root / 'metrics.json').read_text()) if 'd_nnz' in row)
    result['train_seconds'] = trained['train_seconds']
    result['final'] = evaluate(model, tokenizer, corpus, topics, qrels, subset)
    (root / 'arm.json').write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != 'head'}, indent=1))
    return result


def cased_copies(texts, seed: int):
    """The corpus with case variety a cased tokenizer sees in real text: each text as is, Capitalized Words, or
    UPPERCASE (Vaswani's documents are lowercase, its topics uppercase)."""
    rng = random.Random(seed)
    return [rng.choice([t, t.title(), t.upper(), t.capitalize()]) for t in texts]


def tiny_mlm(kind: str, vocab_size: int, seed: int):
    from transformers import ModernBertConfig, ModernBertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=2,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    if kind == 'roberta':
        return RobertaForMaskedLM(RobertaConfig(max_position_embeddings=258, type_vocab_size=1, **common))
    return ModernBertForMaskedLM(
        ModernBertConfig(
            cls_token_id=0, sep_token_id=2, max_position_embeddings=256, global_attn_every_n_layers=1, **common
        )
    )


def bpe_arm(arm: str, args, corpus, topics, qrels, examples):
    """Tiny cased-BPE backbone pre-trained as an MLM (cached under --output), then original vs transferred."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from pyterrier_lsr.models import SpladeModel
    from pyterrier_lsr.models.vocab_transfer import transfer_vocabulary
    from pyterrier_lsr.models.vocabularies import train_byte_level_bpe, train_wordpiece

    kind, variant = arm.split('-')
    texts = [d['text'] for d in corpus]
    cased = cased_copies(texts, args.seed)
    base = Path(args.output) / args.experiment / f'{kind}-base'
    if not (base / 'model' / 'config.json').exists():
        tokenizer = train_byte_level_bpe(cased, args.bpe_vocab)
        mlm = tiny_mlm(kind, len(tokenizer), args.seed)
        adapt(mlm, tokenizer, cased, base / 'pretrain', args, args.pretrain_steps, args.pretrain_lr)
        mlm.save_pretrained(str(base / 'model'))
        tokenizer.save_pretrained(str(base / 'model'))
    tokenizer = AutoTokenizer.from_pretrained(str(base / 'model'))
    mlm = AutoModelForMaskedLM.from_pretrained(str(base / 'model'))
    info = {'pretrain': json.loads((base / 'pretrain' / 'metrics.json').read_text())[-1]}
    if variant == 'vt':
        target = (
            train_wordpiece(texts, args.bpe_vocab)
            if args.target_vocab == 'corpus'
            else AutoTokenizer.from_pretrained(resolve_model(args.target_vocab))
        )
        model, tokenizer, info['transfer'] = transfer_vocabulary(mlm, tokenizer, target, temperature=args.temperature)
    else:
        model = SpladeModel(mlm, tokenizer.all_special_ids)
    # The original arm gets the same MLM adaptation budget (on the corpus as it is) so only the vocabulary differs.
    return run_arm(arm, model, tokenizer, texts, args, corpus, topics, qrels, examples, [], info)


def table(summary: dict) -> str:
    """The summary as a Markdown table: nDCG@10 (all topics / topics with an added word) along the pipeline, non-zeros
    and the active fraction at step 0."""

    def ndcg(row):
        return (
            ''
            if not row
            else f'{row["nDCG@10"]:.3f}' + (f' / {row["nDCG@10_subset"]:.3f}' if 'nDCG@10_subset' in row else '')
        )

    lines = [
        '| arm | copied / averaged / composed / fallback | start | after MLM | final | doc nnz | query nnz | '
        'active at step 0 | train s |',
        '|---|---|---|---|---|---:|---:|---:|---:|',
    ]
    for arm, r in summary.items():
        t = r.get('transfer') or {}
        transfer = ' / '.join(str(t[k]) for k in ('copied', 'averaged', 'composed', 'fallback')) if t else '–'
        active = r.get('active_step0', r.get('calibration', {}).get('active_after'))
        lines.append(
            f'| {arm} | {transfer} | {ndcg(r.get("start"))} | {ndcg(r.get("after_mlm"))} | {ndcg(r["final"])} | '
            f'{r["final"]["d_nnz"]:.1f} | {r["final"]["q_nnz"]:.1f} | '
            f'{"" if active is None else f"{active:.4f}"} | {r["train_seconds"]} |'
        )
    return '\n'.join(lines)


def main():
    p = parser(description=__doc__, steps=250)
    p.set_defaults(output='runs/vocab_transfer', evaluate=False, zero_shot=False)
    p.add_argument('--experiment', choices=['domain', 'bpe'], default='domain')
    p.add_argument('--arms', nargs='+', help=f'default: all of the experiment ({DOMAIN_ARMS} or {BPE_ARMS})')
    p.add_argument('--extend', type=int, default=1000, help='Vaswani words added to the vocabulary (domain)')
    p.add_argument('--temperature', type=float, default=0.05, help='sparsemax temperature of the composition')
    p.add_argument('--mlm-steps', type=int, default=200, help='MLM adaptation steps before SPLADE training (every arm)')
    p.add_argument('--mlm-batch-size', type=int, default=16)
    p.add_argument('--mlm-lr', type=float, default=5e-5)
    p.add_argument('--mlm-max-length', type=int, default=128)
    p.add_argument('--mask-rate', type=float, default=0.3)
    p.add_argument(
        '--target-active',
        type=float,
        default=0.0,
        help='APC: fraction of (text, term) pairs active after MLM adaptation (0: no calibration)',
    )
    p.add_argument('--calibration-texts', type=int, default=256)
    p.add_argument(
        '--eval-start',
        action=argparse.BooleanOptionalAction,
        default=True,
        help='evaluate before/after MLM adaptation too',
    )
    p.add_argument('--bpe-vocab', type=int, default=8000, help='BPE vocabulary of the tiny cased backbones (bpe)')
    p.add_argument('--pretrain-steps', type=int, default=600, help='MLM pre-training of the tiny backbones (bpe)')
    p.add_argument('--pretrain-lr', type=float, default=5e-4)
    p.add_argument(
        '--target-vocab',
        default='corpus',
        help='tokenizer the bpe arms transfer to: a folder or offline '
        'name (splade-tiny: bert-base-uncased WordPiece), or "corpus" (train_wordpiece on the corpus, '
        '--bpe-vocab terms: the same size as the BPE vocabulary)',
    )
    p.add_argument('--results', help='also write the summary to this JSON file')
    args = parse_args(p)
    collection = load_collection(args.dataset)
    corpus, topics, qrels = collection.corpus, collection.topics, collection.qrels
    examples = prepare_examples(args, corpus)
    arms = args.arms or (DOMAIN_ARMS if args.experiment == 'domain' else BPE_ARMS)
    run = domain_arm if args.experiment == 'domain' else bpe_arm
    for arm in arms:
        run(arm, args, corpus, topics, qrels, examples)
    root = Path(args.output) / args.experiment
    summary = {path.parent.name: json.loads(path.read_text()) for path in sorted(root.glob('*/arm.json'))}
    for result in summary.values():
        result.pop('head', None)
    (root / 'summary.json').write_text(json.dumps(summary, indent=1))
    if args.results:
        Path(args.results).write_text(json.dumps({'args': vars(args), 'arms': summary}, indent=1))
    print(table(summary))


if __name__ == '__main__':
    main()
