import os
from pathlib import Path

import pytest

from pyterrier_lsr.offline import use_irds_cache

SHARED_IRDS = Path(__file__).resolve().parents[2] / 'shared' / 'ir_datasets'

# The caller's IR_DATASETS_HOME wins; otherwise a temporary copy of the prepared offline cache next to the checkout.
if 'IR_DATASETS_HOME' not in os.environ and SHARED_IRDS.is_dir():
    use_irds_cache(str(SHARED_IRDS))


@pytest.fixture(scope='session')
def splade():
    from pyterrier_lsr import Splade
    from pyterrier_lsr.offline import resolve_model
    return Splade.from_pretrained(resolve_model('splade-tiny'), batch_size=8)


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
