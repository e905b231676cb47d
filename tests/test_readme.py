"""Every ```python block of README.md runs as written: each in a fresh namespace and an empty working directory, on a
Vaswani subset, offline.

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
from pathlib import Path

import pytest

from pyterrier_lsr.offline import resolve_model

README = Path(__file__).resolve().parents[1] / 'README.md'
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
CAPS = {'TrainConfig': {'steps': 2, 'batch_size': 4, 'doc_max_length': 64, 'warmup_steps': 1},
        'DomainConfig': {'steps': 2, 'batch_size': 4, 'doc_max_length': 64, 'heldout': 20}}
SUBSET = {'docs': 200, 'topics': 3}
# first line of the block -> why it is not run
EXCLUDED = {
    'store = distributed.encode("corpus/*.parquet"': 'needs a Ray cluster and its shared storage',
}


def python_blocks():
    return re.findall(r'^```python\n(.*?)^```', README.read_text(), flags=re.S | re.M)


def runnable(block: str) -> str:
    for name, offline in HUB_NAMES.items():
        block = block.replace(f'"{name}"', repr(offline))
    for pattern, replacement in SMALL:
        block = re.sub(pattern, replacement, block)
    return block


BLOCKS = [b for b in python_blocks() if not any(b.startswith(first) for first in EXCLUDED)]


def test_the_exclusions_and_replacements_are_all_needed():
    text = '\n'.join(python_blocks())
    assert all(any(b.startswith(first) for b in python_blocks()) for first in EXCLUDED)
    assert all(f'"{name}"' in text for name in HUB_NAMES)
    assert len(BLOCKS) >= 12


@pytest.fixture(scope='module')
def small_vaswani():
    from pyterrier_lsr.collections import load_collection
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


@pytest.mark.parametrize('block', BLOCKS, ids=[f'block{i}' for i in range(len(BLOCKS))])
def test_readme_block_runs(block, small_vaswani, tmp_path, monkeypatch):
    import pyterrier as pt

    from pyterrier_lsr import train
    for name, caps in CAPS.items():
        cls = getattr(train, name)
        monkeypatch.setattr(cls, '__post_init__', capped(cls, caps))
    real = pt.get_dataset
    monkeypatch.setattr(pt, 'get_dataset',
                        lambda name, *a, **k: SmallDataset(small_vaswani) if name == 'irds:vaswani' else real(name))
    monkeypatch.chdir(tmp_path)
    code = runnable(block)
    exec(compile(code, 'README.md', 'exec'), {'__name__': '__main__'})
    # the blocks that only build (no training) are re-runnable as written: a second run reuses what the first built
    if 'built()' in block and not re.search(r'train|domain_adapt', block):
        exec(compile(code, 'README.md', 'exec'), {'__name__': '__main__'})
