"""Every ```python block of README.md runs as written: each in a fresh namespace and an empty working directory, on a
Vaswani subset, offline (``tests/test_docs.py`` runs those of docs/*.md and pyterrier_lsr/pt_docs/ the same way).

What is changed, all of it listed here:
* ``HUB_NAMES``: hub checkpoints the README names but this machine cannot download are replaced by the offline ones
  (SPLADE checkpoints by ``splade-tiny``; the masked LMs that ``transformers`` itself loads by splade-tiny's folder,
  since ``AutoTokenizer`` knows no offline short names).
* ``SMALL`` and ``CAPS``: SAE widths, sample sizes and every ``TrainConfig``/``DomainConfig``'s steps, batch size and
  lengths are cut so that the whole file runs in about two minutes.
* ``pt.get_dataset('irds:vaswani')`` (and so ``load_collection('irds:vaswani')``) gives the first topics, their
  relevant documents and the first others (``Collection.subset``), ``SUBSET`` documents in all.
* ``EXCLUDED``: blocks that cannot run here, with the reason.
"""
import re
import textwrap
from pathlib import Path

import pytest

from pyterrier_lsr.core.names import resolve_model

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
HUB_NAMES = {
    'naver/splade-v3': 'splade-tiny',
    'naver/splade-cocondenser-ensembledistil': 'splade-tiny',
    'answerdotai/ModernBERT-base': resolve_model('splade-tiny'),
    'bert-base-uncased': resolve_model('splade-tiny'),
}
SMALL = [
    (r'"n_latents": \d+', '"n_latents": 256'),
    (r'n=1000\b', 'n=50'),
    (r'(texts|corpus)\[:\d+\]', r'\1[:32]'),
]
# upper bounds on the fields of every TrainConfig / DomainConfig the blocks make (held-out: the subset is small)
CAPS = {'TrainConfig': {'steps': 2, 'batch_size': 4, 'max_length': 64, 'warmup_steps': 1},
        'DomainConfig': {'steps': 2, 'batch_size': 4, 'max_length': 64, 'heldout': 20}}
SUBSET = {'docs': 200, 'topics': 3}
# first line of a block (README.md or docs/*.md) -> why it is not run
EXCLUDED = {
    'store = scaleout.encode("corpus/*.parquet"': 'needs a Ray cluster and its shared storage',
}


def python_blocks(path: Path = README) -> list:
    """The ```python blocks of a Markdown page, or the ``.. code-block:: python`` directives of a reStructuredText one
    (pyterrier_lsr/pt_docs/), dedented."""
    if path.suffix == '.rst':
        pattern = r'^\.\. code-block:: python\n(?:    :\w+:.*\n)*\n((?:(?:    .*)?\n)+)'
        directives = re.findall(pattern, path.read_text(), flags=re.M)
        return [textwrap.dedent(block).strip('\n') + '\n' for block in directives]
    return re.findall(r'^```python\n(.*?)^```', path.read_text(), flags=re.S | re.M)


def runnable(block: str) -> str:
    for name, offline in HUB_NAMES.items():
        block = block.replace(f'"{name}"', repr(offline))
    for pattern, replacement in SMALL:
        block = re.sub(pattern, replacement, block)
    return block


def executed(path: Path) -> list:
    return [b for b in python_blocks(path) if not any(b.startswith(first) for first in EXCLUDED)]


BLOCKS = executed(README)


def test_the_readme_shows_one_experiment():
    assert len(BLOCKS) == 1 and 'pt.Experiment(' in BLOCKS[0]
    assert len(README.read_text().splitlines()) <= 250


@pytest.fixture(scope='module')
def small_vaswani():
    from pyterrier_lsr.core.collection import load_collection
    return load_collection('irds:vaswani').subset(**SUBSET)


class SmallDataset:
    def __init__(self, collection):
        self.collection = collection

    def get_corpus_iter(self, verbose=True):
        return iter([dict(d) for d in self.collection.corpus])

    def get_topics(self, *args, **kwargs):
        return self.collection.topics.copy()

    def get_qrels(self, *args, **kwargs):
        return self.collection.qrels.copy()


def capped(cls, caps: dict):
    post_init = cls.__post_init__

    def __post_init__(self):
        for name, cap in caps.items():
            setattr(self, name, min(getattr(self, name), cap))
        post_init(self)
    return __post_init__


def run_block(block: str, filename: str, collection, tmp_path, monkeypatch):
    """Runs ``block`` (after :func:`runnable`) in ``tmp_path`` with Vaswani replaced by ``collection`` and every
    training config capped; a block that only builds (no training) runs twice, the second run reusing the first's."""
    import pyterrier as pt

    from pyterrier_lsr import train
    for name, caps in CAPS.items():
        cls = getattr(train, name)
        monkeypatch.setattr(cls, '__post_init__', capped(cls, caps))
    real = pt.get_dataset
    monkeypatch.setattr(pt, 'get_dataset',
                        lambda name, *a, **k: SmallDataset(collection) if name == 'irds:vaswani' else real(name))
    monkeypatch.chdir(tmp_path)
    code = compile(runnable(block), filename, 'exec')
    exec(code, {'__name__': '__main__'})
    if 'built()' in block and not re.search(r'train|domain_adapt', block):
        exec(code, {'__name__': '__main__'})


@pytest.mark.parametrize('block', BLOCKS, ids=[f'block{i}' for i in range(len(BLOCKS))])
def test_readme_block_runs(block, small_vaswani, tmp_path, monkeypatch):
    run_block(block, 'README.md', small_vaswani, tmp_path, monkeypatch)
