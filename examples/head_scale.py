"""SPLADE on a dense encoder without an MLM head (all-MiniLM-L6-v2), and the MLM-head scale experiment.

A new MLM head is put on the encoder (``splade_from_encoder``: identity transform, decoder tied to the input
embeddings) and its output bias is calibrated so that ``--target-active`` of the (text, term) pairs start active.
It is then trained exactly like examples/domain_adaptation.py (same self-supervised data, teacher and loop) in
up to three variants:

- ``plain``: the head as built;
- ``x16``: the head transform's LayerNorm weight and bias multiplied by 16 (the decoder input, so every logit is
  16 times larger: a backbone whose MLM head has a large norm), calibrated the same way;
- ``x16-rescaled``: the same inflated head followed by ``rescale_head(model, 16)``; it starts from exactly the
  plain model's logits and should land close to it.

    python examples/head_scale.py --irds-cache PATH --variants plain x16 x16-rescaled

Writes <output>/<variant>/{metrics.csv,result.json}, <output>/summary.json and loss / non-zero plots
(--plots, default benchmarks/results/head_scale_{loss,nonzeros}.png).
"""

import json
import random
import time
from pathlib import Path

import torch

from pyterrier_lsr import load_collection
from pyterrier_lsr.core.extras import require_extra
from pyterrier_lsr.core.names import resolve_model
from pyterrier_lsr.systems.recipes import fine_tune, parse_args, parser, prepare_examples

VARIANTS = ('plain', 'x16', 'x16-rescaled')
FACTOR = 16.0


def build(backbone: str, variant: str, sample_texts, target_active: float):
    """A calibrated SPLADE model (and its tokenizer) on ``backbone`` with a new MLM head, in the given variant."""
    from transformers import AutoTokenizer

    from pyterrier_lsr.models.heads import calibrate_activation, head_transform, rescale_head, splade_from_encoder

    tokenizer = AutoTokenizer.from_pretrained(backbone)
    model = splade_from_encoder(backbone, tokenizer.all_special_ids)
    if variant != 'plain':
        layer_norm = head_transform(model.mlm).LayerNorm
        with torch.no_grad():
            layer_norm.weight.mul_(FACTOR)
            layer_norm.bias.mul_(FACTOR)
    if variant == 'x16-rescaled':
        rescale_head(model, FACTOR)
    calibration = calibrate_activation(model, tokenizer, sample_texts, target_active=target_active)
    return model, tokenizer, calibration


def plot(runs: dict, path_prefix: str):
    """Loss and document/query non-zeros over steps, one line per variant."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    Path(path_prefix).parent.mkdir(parents=True, exist_ok=True)
    for name, keys in [('loss', ['loss']), ('nonzeros', ['d_nnz', 'q_nnz'])]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (variant, log) in enumerate(runs.items()):
            for key, style in zip(keys, ['-', '--']):
                rows = [row for row in log if key in row]
                ax.plot(
                    [r['step'] for r in rows], [r[key] for r in rows], style, color=f'C{i}', label=f'{variant} {key}'
                )
        ax.set_xlabel('step')
        ax.set_ylabel(name)
        ax.set_yscale('log')
        ax.legend()
        ax.set_title(f'MiniLM SPLADE: {name} (head x{FACTOR:g} vs plain)')
        fig.tight_layout()
        fig.savefig(f'{path_prefix}_{name}.png', dpi=120)
        plt.close(fig)


def main():
    p = parser(description=__doc__, steps=300)
    p.set_defaults(model='all-MiniLM-L6-v2', output='runs/head_scale')
    p.add_argument('--variants', nargs='+', choices=VARIANTS, default=list(VARIANTS))
    p.add_argument('--target-active', type=float, default=0.005, help='fraction of terms active at the start')
    p.add_argument('--calibration-texts', type=int, default=256)
    p.add_argument('--plots', default='benchmarks/results/head_scale', help='prefix of the PNG plots')
    args = parse_args(p)  # checks the offline checkpoints it names
    require_extra('report', 'matplotlib', needed_for='the plots')  # drawn last, after the training
    collection = load_collection(args.dataset)
    corpus, topics, qrels = collection.corpus, collection.topics, collection.qrels
    root = Path(args.output)
    start = time.time()
    examples = prepare_examples(args, corpus)
    prep_seconds = time.time() - start
    sample = [d['text'] for d in random.Random(args.seed).sample(corpus, min(args.calibration_texts, len(corpus)))]
    summary, logs = {}, {}
    for variant in args.variants:
        torch.manual_seed(args.seed)
        model, tokenizer, calibration = build(resolve_model(args.model), variant, sample, args.target_active)
        output = root / variant
        output.mkdir(parents=True, exist_ok=True)
        result = fine_tune(model, tokenizer, examples, corpus, topics, qrels, output, args, prep_seconds)
        logs[variant] = json.loads((output / 'metrics.json').read_text())
        summary[variant] = {
            'calibration': calibration,
            'zero_shot': result['zero_shot'],
            'curve': result['curve'],
            'train_seconds': result['train_seconds'],
            'last_logged': next(row for row in reversed(logs[variant]) if 'loss' in row),
        }
        (root / 'summary.json').write_text(json.dumps({'args': vars(args), 'runs': summary}, indent=1))
        plot(logs, args.plots)
    print(json.dumps(summary, indent=1))


if __name__ == '__main__':
    main()
