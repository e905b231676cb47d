"""Effectiveness on real data: the offline SPLADE checkpoint on a Vaswani subset gives the figures recorded when the
full-collection reproduction (``python examples/vaswani.py``, docs/results.md) last matched its
reference; a silent scoring change (quantization, document frequencies, query weights) moves them."""

import pyterrier as pt
import pytest
from pyterrier.measures import AP, nDCG

from pyterrier_lsr import IDFQueryEncoder, LsrIndex, systems
from pyterrier_lsr.core.collection import load_collection

# the first 30 topics, their relevant documents first, 1,000 documents in all
REFERENCE = {  # name: (nDCG@10, AP)
    'BM25': (0.7746, 0.6600),
    'SPLADE': (0.7444, 0.6185),
    'IDF queries (index df)': (0.7083, 0.5728),
    'IDF queries (corpus df)': (0.7086, 0.5787),
}


def test_vaswani_subset_reproduces_reference(splade, tmp_path):
    collection = load_collection('irds:vaswani').subset(docs=1000, topics=30)
    index = LsrIndex(tmp_path / 'splade.lsr', splade, verbose=False).index(collection.corpus)
    corpus_df = IDFQueryEncoder.from_corpus(splade.tokenizer, (d['text'] for d in collection.corpus))
    table = pt.Experiment(
        [systems.bm25(tmp_path / 'bm25.pisa', collection.corpus), index.retriever(),
         IDFQueryEncoder.from_index(index) >> index.toks_retriever(), corpus_df >> index.toks_retriever()],
        collection.topics, collection.qrels, [nDCG @ 10, AP], names=list(REFERENCE)).set_index('name')
    for name, (ndcg, ap) in REFERENCE.items():
        assert table.loc[name, 'nDCG@10'] == pytest.approx(ndcg, abs=0.005), table
        assert table.loc[name, 'AP'] == pytest.approx(ap, abs=0.005), table
