"""Checkpoints and resumption of the training loop (:mod:`.loop`): what a ``checkpoint-<step>`` folder holds, how the
newest intact one is found, and what a resumed run must match.

A checkpoint is an HF model folder plus ``trainer_state.pt``, built beside its final name and swapped in
(:func:`pyterrier_lsr.core.storage.build_folder`, marked ``checkpoint``).  The state holds tensors, numbers, strings,
lists and dicts only and is read with ``torch.load(weights_only=True)``: a checkpoint cannot run code.
"""
import csv
import io
import re
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from ..core import storage
from ..core.quiet import quiet_transformers

STATE_FILE = 'trainer_state.pt'
CHECKPOINT_KIND = 'checkpoint'
RUN_KIND = 'training_run'  # the output folder: checkpoints, metrics.csv/json
CHECKPOINT_NAME = re.compile(r'checkpoint-(\d+)')
STATE_KEYS = {'step', 'optimizer', 'scheduler', 'model', 'extra', 'torch_rng', 'config', 'log'}
# Fields that change logging and saving only: a resumed run may change them without resume='force'.
BOOKKEEPING_FIELDS = {'log_every', 'save_every', 'eval_every'}

def save_checkpoint(model, tokenizer, optimizer, scheduler, step: int, path: Path, config, log: list, extra):
    # Saving a step again (a rerun) replaces our checkpoint only once the new one is whole.
    with storage.build_folder(path, CHECKPOINT_KIND, overwrite=True, what='checkpoint') as tmp:
        with quiet_transformers():  # its "Writing model shards" bar: the run shows its own progress
            model.save_pretrained(str(tmp))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(tmp))
        state = {
            'step': step,
            'optimizer': optimizer.state_dict(),
            'scheduler': scheduler.state_dict(),
            'model': model.state_dict(),
            'extra': [p.detach().clone() for p in extra],
            'torch_rng': torch.get_rng_state(),
            'config': asdict(config),
            'log': log,
        }
        storage.write_stream(tmp / STATE_FILE, lambda file: torch.save(state, file))


def checkpoints(output_dir) -> list[Path]:
    """``checkpoint-<step>`` folders, newest first."""
    found = [p for p in Path(output_dir).glob('checkpoint-*') if CHECKPOINT_NAME.fullmatch(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: int(p.name.split('-')[1]), reverse=True)


def load_state(checkpoint: Path) -> dict:
    state = torch.load(checkpoint / STATE_FILE, weights_only=True, map_location='cpu')
    if not isinstance(state, dict) or not STATE_KEYS <= set(state):
        raise ValueError(f'{STATE_FILE} lacks {sorted(STATE_KEYS - set(state if isinstance(state, dict) else ()))}')
    step = state['step']
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or f'checkpoint-{step}' != checkpoint.name:
        raise ValueError(f'{STATE_FILE} records step {step!r:.40}; a checkpoint named {checkpoint.name} must record '
                         f'step {checkpoint.name.split("-")[1]}')
    if not isinstance(state['config'], dict) or not isinstance(state['log'], list):
        raise ValueError(f'{STATE_FILE}: "config" must be a dict and "log" a list')
    return state


def latest_state(output_dir) -> tuple[Path | None, dict | None]:
    """The newest checkpoint whose state loads (tensors and plain data only), warning about newer broken ones;
    ``ValueError`` when checkpoints exist but none loads (starting over would silently discard the run)."""
    skipped = []
    for checkpoint in checkpoints(output_dir):
        try:
            return checkpoint, load_state(checkpoint)
        except Exception as e:  # truncated, foreign or tampered (e.g. a pickle that would run code): never trusted
            skipped.append(checkpoint)
            warnings.warn(
                f'skipping checkpoint {checkpoint}: its {STATE_FILE} does not load safely '
                f'({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ""})'
            )
    if skipped:
        raise ValueError(
            f'no intact checkpoint to resume from in {output_dir}: {[p.name for p in skipped]} do not load'
        )
    return None, None


def claim_output(output_dir) -> Path:
    """``output_dir`` as a training folder of ours (see :func:`pyterrier_lsr.core.storage.claim_folder`), before any
    work: a user's folder (its ``metrics.csv`` would be replaced) is refused, not trained into.  A folder holding
    our checkpoints is a run written before runs were marked, and is adopted."""
    output_dir = Path(output_dir)
    if any(storage.is_artifact(p, CHECKPOINT_KIND) for p in checkpoints(output_dir)) and \
            not storage.is_artifact(output_dir, RUN_KIND):
        storage.mark(output_dir, RUN_KIND)
    return storage.claim_folder(output_dir, RUN_KIND, 'training folder')


def latest_checkpoint(output_dir) -> Path | None:
    """The newest intact ``checkpoint-<step>`` folder of ``output_dir`` (see :func:`run_loop`), or None."""
    return latest_state(output_dir)[0]


def check_resumed_config(saved: dict, config, checkpoint: Path):
    current = asdict(config)
    changed = sorted(
        k for k in saved.keys() | current.keys() if k not in BOOKKEEPING_FIELDS and saved.get(k) != current.get(k)
    )
    if changed:
        diff = ', '.join(f'{k}: {saved.get(k)!r} -> {current.get(k)!r}' for k in changed)
        raise ValueError(
            f'the TrainConfig differs from the one {checkpoint} was trained with ({diff}); resuming would '
            "not continue that run. Pass resume='force' to continue with the new settings anyway"
        )


def check_same_model(model: torch.nn.Module, saved, checkpoint: Path):
    """Before loading: torch would copy the tensors that fit, then raise a multi-line list of those that do not."""
    expected = model.state_dict()
    saved = saved if isinstance(saved, dict) else {}
    wrong = sorted(k for k in expected.keys() | saved.keys()
                   if k not in saved or k not in expected or getattr(saved[k], 'shape', None) != expected[k].shape)
    if wrong:
        raise ValueError(f'{checkpoint} holds the weights of another model ({len(wrong)} tensors missing, extra or '
                         f'of another shape, e.g. {wrong[0]}); resume with the model the run started from, or train '
                         'into a new folder')


def resume_state(output_dir, config, resume: bool | str) -> tuple[Path | None, dict | None]:
    """The checkpoint of ``output_dir`` that ``resume`` (see :func:`train`) continues from and its state,
    ``(None, None)`` to start afresh; a ``ValueError`` for a ``resume`` that is not False, True or 'force',
    checkpoints none of which loads, or (unless 'force') a config other than the checkpoint's.  Reads only, so the
    command line calls it before loading the model."""
    if resume not in (False, True, 'force'):
        raise ValueError(f"resume must be False, True or 'force', got {resume!r}")
    checkpoint, state = latest_state(output_dir) if resume else (None, None)
    if checkpoint is not None and resume != 'force':
        check_resumed_config(state['config'], config, checkpoint)
    return checkpoint, state


def write_log(output_dir: Path, log: list[dict]):
    storage.write_json(output_dir / 'metrics.json', log)
    keys = sorted({k for row in log for k in row}, key=lambda k: (k != 'step', k))
    table = io.StringIO(newline='')
    writer = csv.DictWriter(table, fieldnames=keys)
    writer.writeheader()
    writer.writerows(log)
    storage.write_text(output_dir / 'metrics.csv', table.getvalue())
