import os
from pathlib import Path

import pytest

from pyterrier_lsr.core.offline import use_irds_cache

SHARED_IRDS = Path(__file__).resolve().parents[2] / 'shared' / 'ir_datasets'

# The caller's IR_DATASETS_HOME wins; otherwise a temporary copy of the prepared offline cache next to the checkout.
if 'IR_DATASETS_HOME' not in os.environ and SHARED_IRDS.is_dir():
    use_irds_cache(str(SHARED_IRDS))

# Under pytest-xdist the workers share the cores: torch threads (and those of processes the tests start) are split
# between them, so two workers on two cores do not each spin two threads.
if os.environ.get('PYTEST_XDIST_WORKER_COUNT'):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ['PYTEST_XDIST_WORKER_COUNT'])))
    os.environ.setdefault('OMP_NUM_THREADS', _threads)
    import torch
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


@pytest.fixture(scope='session')
def splade():
    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.names import resolve_model
    return Splade.from_pretrained(resolve_model('splade-tiny'), device='cpu', batch_size=8)


@pytest.fixture(scope='session')
def vaswani():
    import pyterrier as pt
    return pt.get_dataset('irds:vaswani')


@pytest.fixture(scope='session')
def vaswani_docs(vaswani):
    return list(vaswani.get_corpus_iter(verbose=False))


@pytest.fixture(scope='session')
def texts(vaswani_docs):
    """Real documents of varied lengths, a non-ASCII one, and one far over max_length."""
    docs = [d['text'] for d in vaswani_docs[:40]]
    return docs + ['Über die Quantenmechanik: naïve café, 東京 and Ελληνικά', ' '.join(docs[:12])]


TINY_WORDS = ('the a of and in to is for on with by nuclear reactor physics cat dog sat electron density ionosphere '
              'transistor amplifier measurement dielectric constant liquids radio wave noise circuit').split()


@pytest.fixture
def tiny():
    """A tiny random BERT masked LM (4 heads x 32 hidden, 1 layer) with a ~90-token WordPiece vocabulary."""
    return make_tiny()


def make_tiny(dropout: float = 0.1):
    """The model of the ``tiny`` fixture, as a function for processes that tests start."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from pyterrier_lsr.models import SpladeModel
    letters = 'abcdefghijklmnopqrstuvwxyz'
    vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + TINY_WORDS + list(letters) + ['##' + c for c in letters]
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=dropout,
                        attention_probs_dropout_prob=dropout)
    return SpladeModel(BertForMaskedLM(config), tokenizer.all_special_ids), tokenizer
