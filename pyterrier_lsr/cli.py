"""Command line: ``pyterrier-lsr train ...`` (the bundled training loop), ``pyterrier-lsr head-report ...`` and
``pyterrier-lsr report config.yaml`` (effectiveness-cost report)."""
import argparse
import json
from dataclasses import fields

from .train.loop import TrainConfig


def _config_arguments(parser: argparse.ArgumentParser):
    for f in fields(TrainConfig):
        if f.name == 'losses':
            parser.add_argument('--losses', default='infonce=1', help='comma-separated name=weight (infonce, margin_mse, kl)')
        elif f.name == 'lr_multipliers':
            parser.add_argument('--lr-multipliers', default='', help='comma-separated parameter-name prefix=factor of --lr')
        elif f.type in (bool, 'bool'):
            parser.add_argument(f'--{f.name.replace("_", "-")}', action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(f'--{f.name.replace("_", "-")}', type=type(f.default), default=f.default)


def _load_examples(args):
    from .train import data
    if args.data.startswith('irds:'):
        return data.from_irds_docpairs(args.data[len('irds:'):], limit=args.limit)
    if args.data.startswith('self-supervised:'):
        import ir_datasets
        corpus = [{'docno': d.doc_id, 'text': d.default_text()}
                  for d in ir_datasets.load(args.data[len('self-supervised:'):]).docs_iter()]
        return data.self_supervised(corpus, num_negatives=args.negatives, seed=args.seed)
    import pandas as pd
    frame = pd.read_json(args.data, lines=args.data.endswith('.jsonl'))
    return data.from_dataframe(frame if args.limit is None else frame.head(args.limit))


def main(argv=None):
    parser = argparse.ArgumentParser(prog='pyterrier-lsr')
    sub = parser.add_subparsers(dest='command', required=True)
    tr = sub.add_parser('train', help='train a SPLADE model with the bundled loop')
    tr.add_argument('--model', required=True, help='HF masked-LM name or folder (or an offline name: splade-tiny)')
    tr.add_argument('--data', required=True, help='a .json/.jsonl DataFrame (query, positive, negative[s], teacher), '
                    'irds:<docpairs id>, or self-supervised:<ir_datasets id> (pseudo-queries from its corpus)')
    tr.add_argument('--output-dir', required=True)
    tr.add_argument('--limit', type=int, default=None, help='use at most this many examples')
    tr.add_argument('--negatives', type=int, default=1, help='hard negatives per example (self-supervised data)')
    tr.add_argument('--rescale-head', default=None, help='divide MLM logits by this factor, or "auto"')
    tr.add_argument('--resume', action='store_true')
    _config_arguments(tr)
    rep = sub.add_parser('head-report', help='MLM-head norms and activation statistics on sample texts')
    rep.add_argument('--model', required=True)
    rep.add_argument('texts', nargs='+')
    report = sub.add_parser('report', help='effectiveness vs cost report from a YAML config (see examples/)')
    report.add_argument('config')
    args = parser.parse_args(argv)

    if args.command == 'report':
        from .report import run_config
        print(run_config(args.config).to_string(index=False))
        return
    from .encoders import Splade
    from .offline import resolve_model
    from .train.distributed import setup
    setup()  # under torchrun: join the process group and pick this rank's GPU before the model is loaded
    splade = Splade.from_pretrained(resolve_model(args.model))
    if args.command == 'head-report':
        from .models.heads import head_report
        print(json.dumps(head_report(splade.model, splade.tokenizer, args.texts), indent=1))
        return
    from .models.heads import rescale_head
    from .train.loop import train
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    for name in ('losses', 'lr_multipliers'):  # comma-separated key=value
        values[name] = {k: float(v) for k, v in (item.rsplit('=', 1) for item in values[name].split(',') if item)}
    config = TrainConfig(**values)
    examples = _load_examples(args)
    if args.rescale_head and not args.resume:
        sample = [ex.positive for ex, _ in zip(examples, range(64))] if isinstance(examples, list) else ()
        rescale_head(splade.model, args.rescale_head if args.rescale_head == 'auto' else float(args.rescale_head),
                     splade.tokenizer, sample)
    train(splade.model, splade.tokenizer, examples, args.output_dir, config, resume=args.resume)


if __name__ == '__main__':
    main()
