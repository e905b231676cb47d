"""Command line: ``pyterrier-lsr train ...`` (the bundled training loop), ``pyterrier-lsr head-report ...``,
``pyterrier-lsr report config.yaml`` (effectiveness-cost report) and ``pyterrier-lsr tune INDEX --topics ...``
(engine settings chosen on tuning queries, see :mod:`pyterrier_lsr.index.tuning`)."""

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from .core.checks import check_float, check_int
from .train.checkpoints import resume_state
from .train.config import TrainConfig


def _fail(command: str, message) -> None:
    """One line on stderr and exit status 2 (argparse's for bad usage), no traceback."""
    sys.stderr.write(f'pyterrier-lsr {command}: error: {" ".join(str(message).split())}\n')
    sys.exit(2)


def _irds_ids(spec: str) -> None:
    """Checks the ir_datasets id of an ``irds:`` / ``self-supervised:`` spec (``ValueError`` naming it)."""
    for prefix in ('irds:', 'self-supervised:'):
        if spec.startswith(prefix):
            from .core.collection import irds_dataset
            irds_dataset(spec[len(prefix):])


def _config_arguments(parser: argparse.ArgumentParser):
    for f in fields(TrainConfig):
        if f.name == 'losses':
            parser.add_argument(
                '--losses', default='infonce=1', help='comma-separated name=weight (infonce, margin_mse, kl)'
            )
        elif f.name == 'lr_multipliers':
            parser.add_argument(
                '--lr-multipliers', default='', help='comma-separated parameter-name prefix=factor of --lr'
            )
        elif f.type in (bool, 'bool'):
            parser.add_argument(
                f'--{f.name.replace("_", "-")}', action=argparse.BooleanOptionalAction, default=f.default
            )
        else:
            parser.add_argument(f'--{f.name.replace("_", "-")}', type=type(f.default), default=f.default)


def _key_values(text: str, name: str) -> dict:
    """``'a=1,b=0.5'`` -> ``{'a': 1.0, 'b': 0.5}``; ``ValueError`` naming the flag otherwise."""
    out = {}
    for item in filter(None, text.split(',')):
        key, sep, value = item.rpartition('=')
        try:
            out[key] = float(value)
        except ValueError:
            sep = ''
        if not sep or not key:
            raise ValueError(f'--{name.replace("_", "-")}: {item!r} is not name=number') from None
    return out


def _load_examples(args):
    from .train import data

    if args.data.startswith('irds:'):
        return data.from_irds_docpairs(args.data[len('irds:') :], limit=args.limit)
    if args.data.startswith('self-supervised:'):
        from .core.collection import irds_dataset

        corpus = [
            {'docno': d.doc_id, 'text': d.default_text()}
            for d in irds_dataset(args.data[len('self-supervised:') :]).docs_iter()
        ]
        return data.self_supervised(corpus, num_negatives=args.negatives, seed=args.seed)
    return data.from_json_file(args.data, args.limit)


# --- domain-adapt: the corpus-only recipe of train/domain/ (self-contained block) ---
def _domain_adapt_parser(sub):
    da = sub.add_parser(
        'domain-adapt',
        help='adapt a SPLADE model to a collection from its corpus alone '
        '(pseudo-queries, teacher, held-out selection, never-worse guard)',
    )
    da.add_argument('--model', required=True, help='HF masked-LM name or folder (or an offline name: splade-tiny), or '
                    'a model folder of the project (SAE-SPLADE, doc-only, a first stage\'s model/...)')
    da.add_argument('--collection', required=True, help='irds:<id> or a folder with docs.jsonl (topics unused)')
    da.add_argument('--output-dir', required=True, help='gets model/ (the selected model) and domain_adapt.json')
    da.add_argument('--cache-dir', default=None, help='BM25 index, dense embeddings, examples (default: output/cache)')
    da.add_argument('--documents', default=None, metavar='INDEX',
                    help="an LsrIndex of the collection built with --model: query-side adaptation reads the "
                         "documents' vectors from it instead of encoding them")
    da.add_argument(
        '--set',
        nargs='*',
        default=[],
        metavar='NAME=VALUE',
        help='DomainConfig overrides, e.g. steps=300 queries=keywords losses=infonce:1+kl:1',
    )


def _domain_adapt(args):
    from .core.collection import load_collection
    from .index import LsrIndex
    from .kinds.loading import load_model
    from .train.domain import claim_cache, claim_output, config_from_overrides, domain_adapt
    from .train.loop import TrainingDiverged

    try:  # the settings and the collection are checked before the model loads
        malformed = [item for item in args.set if '=' not in item]
        if malformed:
            raise ValueError(f'--set takes NAME=VALUE, got {malformed[0]!r}')
        config = config_from_overrides(dict(item.split('=', 1) for item in args.set))
        corpus = load_collection(args.collection).corpus
    except (ValueError, TypeError, FileNotFoundError) as e:
        _fail('domain-adapt', e)
    for flag, folder, claim in (('--output-dir', args.output_dir, claim_output),
                                ('--cache-dir', args.cache_dir, claim_cache)):
        try:  # folders it may not write into are refused before the model loads, each by its flag
            if folder is not None:
                claim(folder)
        except FileExistsError as e:
            _fail('domain-adapt', f'{flag}: {e}')
    try:
        splade = load_model(args.model)
    except (OSError, ValueError) as e:  # not found, damaged, or of another kind
        _fail('domain-adapt', f'--model: {e}')
    documents = LsrIndex(args.documents) if args.documents else None
    try:
        _, log = domain_adapt(splade, corpus, args.output_dir, config, args.cache_dir, documents=documents)
    except FileExistsError as e:  # a model/ folder of --output-dir it may not replace, refused before any work
        _fail('domain-adapt', f'--output-dir: {e}')
    except (TrainingDiverged, ValueError) as e:  # e.g. damaged cached examples, or an lr that diverges
        _fail('domain-adapt', e)
    # the decision itself was printed by domain_adapt, once
    print(json.dumps({k: log[k] for k in ('selected_step', 'guard', 'start_score', 'best_score')}, indent=1))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='pyterrier-lsr')
    sub = parser.add_subparsers(dest='command', required=True)
    tr = sub.add_parser('train', help='train a SPLADE model with the bundled loop')
    tr.add_argument('--model', required=True, help='HF masked-LM name or folder (or an offline name: splade-tiny)')
    tr.add_argument(
        '--data',
        required=True,
        help='a .json/.jsonl DataFrame (query, positive, negative[s], teacher), '
        'irds:<docpairs id>, or self-supervised:<ir_datasets id> (pseudo-queries from its corpus)',
    )
    tr.add_argument('--output-dir', required=True, help='gets model/ (the final model), checkpoints and metrics')
    tr.add_argument('--irds-cache', help='a prepared ir_datasets cache for irds: and self-supervised: data '
                                         '(copied to a temporary folder)')
    tr.add_argument('--limit', type=int, default=None, help='use at most this many examples')
    tr.add_argument('--negatives', type=int, default=1, help='hard negatives per example (self-supervised data)')
    tr.add_argument('--rescale-head', default=None, help='divide MLM logits by this factor, or "auto"')
    tr.add_argument(
        '--resume',
        nargs='?',
        const=True,
        default=False,
        choices=['force'],
        help="continue from the newest intact checkpoint; '--resume force' even with changed settings",
    )
    _config_arguments(tr)
    rep = sub.add_parser('head-report', help='MLM-head norms and activation statistics on sample texts')
    rep.add_argument('--model', required=True)
    rep.add_argument('texts', nargs='+')
    _domain_adapt_parser(sub)
    from .report import config_help

    report = sub.add_parser('report', help='effectiveness vs cost report from a YAML config (see examples/)',
                            epilog=config_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument('config')
    tune = sub.add_parser('tune', help="choose an index's engine settings on tuning queries (LsrIndex.tune)")
    tune.add_argument('index', help='an LsrIndex folder')
    tune.add_argument('--topics', required=True,
                      help='the tuning queries: a topics.tsv file (qid<TAB>query) or irds:<dataset id>')
    tune.add_argument('--target-recall', type=float, default=0.99, help='R@k against the exact ranking to reach')
    tune.add_argument('--engines', nargs='+', default=None, help='engines to tune (default: every engine built)')
    tune.add_argument('--k', type=int, default=10, help='the depth the recall is measured at')
    tune.add_argument('--query-encoder', choices=['model', 'idf'], default='model',
                      help="the query side: the index model's, or IDF weights of the index's terms")
    tune.add_argument('--repeats', type=int, default=1, help='passes per setting (the least CPU time kept)')
    tune.add_argument('--one-a-call', action='store_true', help='cost settings one query a call, not batched')
    tune.add_argument('--quiet', action='store_true', help='print nothing (the choice is still recorded)')
    return parser


def _tune(args):
    from .core.collection import load_collection, read_topics
    from .index.artifact import LsrIndex
    from .stages.query import IDFQueryEncoder

    try:
        topics = load_collection(args.topics).topics if args.topics.startswith('irds:') else read_topics(args.topics)
        index = LsrIndex(args.index)
        encoder = IDFQueryEncoder.from_index(index) if args.query_encoder == 'idf' else None
        record = index.tune(topics, args.target_recall, engines=args.engines, k=args.k, query_encoder=encoder,
                            repeats=args.repeats, one_a_call=args.one_a_call, verbose=not args.quiet)
    except (OSError, ValueError, TypeError) as e:
        _fail('tune', e)
    if not args.quiet:
        print(json.dumps({k: record[k] for k in ('engine', 'settings', 'cpu_ms', 'recall', 'k')}))


def _report(args):
    from .report import ConfigError, run_config

    try:
        table = run_config(args.config)
    except (ConfigError, FileExistsError) as e:  # a bad key, or a workdir folder the report will not replace
        _fail('report', e)
    print(table.to_string(index=False))


def _train_settings(args):
    """The TrainConfig, the head rescaling and the checkpoint to resume from, every setting and the data source
    checked before the model and data are loaded."""
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    try:
        for name in ('losses', 'lr_multipliers'):
            values[name] = _key_values(values[name], name)
        config = TrainConfig(**values)
        rescale = args.rescale_head if args.rescale_head in (None, 'auto') else float(args.rescale_head)
        if rescale not in (None, 'auto'):
            check_float('--rescale-head', rescale, 0, exclusive_minimum=True)
        for flag, value in (('--limit', args.limit), ('--negatives', args.negatives)):
            if value is not None:
                check_int(flag, value, 1)
    except (ValueError, TypeError) as e:
        _fail('train', str(e).replace('could not convert string to float', '--rescale-head: not a number or auto'))
    try:  # a run it cannot continue (changed settings, no checkpoint that loads) is refused before the model loads
        resumed = resume_state(args.output_dir, config, args.resume)  # loaded once: train() continues from it
    except ValueError as e:
        _fail('train', f'--resume: {e}')
    if args.irds_cache:
        from .core.offline import use_irds_cache
        try:
            use_irds_cache(args.irds_cache)
        except (FileNotFoundError, RuntimeError) as e:
            _fail('train', f'--irds-cache: {e}')
    try:
        _irds_ids(args.data)
    except ValueError as e:
        _fail('train', f'--data: {e}')
    if not args.data.startswith(('irds:', 'self-supervised:')) and not Path(args.data).is_file():
        _fail('train', f'--data: {args.data} is not a file (nor irds:<id> or self-supervised:<id>)')
    return config, rescale, resumed


def _claim_train_output(args):
    """Where rank 0 writes, before any work: the run's folder and its final model/ folder."""
    from .core import storage
    from .kinds.base import MODEL_ARTIFACT
    from .train.checkpoints import claim_output
    try:
        claim_output(args.output_dir)
        storage.check_replaceable(Path(args.output_dir) / 'model', MODEL_ARTIFACT, True, 'model folder')
    except FileExistsError as e:
        _fail('train', f'--output-dir: {e}')


def _train(args, splade, config, rescale, resumed):
    from .models.heads import rescale_head
    from .train.loop import TrainingDiverged, train
    from .train.torchrun import is_main

    try:
        examples = _load_examples(args)
    except (ValueError, TypeError, OSError) as e:  # a malformed file, named with its line
        _fail('train', f'--data: {e}')
    if rescale is not None and not args.resume:
        sample = [ex.positive for ex, _ in zip(examples, range(64))] if isinstance(examples, list) else ()
        rescale_head(splade.model, rescale, splade.tokenizer, sample)
    try:
        train(splade.model, splade.tokenizer, examples, args.output_dir, config, resume=args.resume, resumed=resumed)
    except (ValueError, TrainingDiverged) as e:  # e.g. a checkpoint of another --model, or an lr that diverges
        _fail('train', e)
    if is_main():
        final = Path(args.output_dir) / 'model'
        splade.save_pretrained(str(final))
        print(f'final model: {final} (load it with pyterrier_lsr.load_model)')


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.command == 'domain-adapt':
        _domain_adapt(args)
        return
    if args.command == 'report':
        _report(args)
        return
    if args.command == 'tune':
        _tune(args)
        return
    if args.command == 'train':  # every setting is checked before the model and data are loaded
        settings = _train_settings(args)
    from .core.names import resolve_model
    from .kinds.splade import Splade
    from .train.torchrun import is_main, setup

    setup()  # under torchrun: join the process group and pick this rank's GPU before the model is loaded
    try:
        splade = Splade.from_pretrained(resolve_model(args.model))
    except (OSError, ValueError) as e:  # not found (offline: no hub), or not a masked LM
        _fail(args.command, f'--model: {e}')
    if args.command == 'head-report':
        from .models.heads import head_report

        print(json.dumps(head_report(splade.model, splade.tokenizer, args.texts), indent=1))
        return
    if is_main():
        _claim_train_output(args)
    _train(args, splade, *settings)


if __name__ == '__main__':
    main()
