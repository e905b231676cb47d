import json
import math

import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_lsr import IDFQueryEncoder, SpladeIndexer, StaticQueryEncoder
from pyterrier_lsr.stages.query import idf

TOY = ['the cat sat', 'the dog', 'a cat', None]


def test_idf_by_hand(splade):
    enc = IDFQueryEncoder.from_corpus(splade.tokenizer, TOY)
    # N = 4 documents; df(cat) = 2, df(dog) = 1, df(the) = 2
    assert enc.weights['cat'] == pytest.approx(math.log(1 + (4 - 2 + 0.5) / (2 + 0.5)))
    assert enc.weights['dog'] == pytest.approx(math.log(1 + (4 - 1 + 0.5) / (1 + 0.5)))
    assert idf(4, 4) > 0
    vec = enc.encode(['Cat cat DOG [SEP] [CLS] zebra'])[0]
    assert vec == {'cat': enc.weights['cat'], 'dog': enc.weights['dog']}


def test_idf_from_index_uses_quantized_document_frequencies(splade, tmp_path):
    docs = [{'docno': str(i), 'text': t} for i, t in enumerate(TOY)]
    index = SpladeIndexer(tmp_path / 'toy.lsr', splade, verbose=False).index(docs)
    vecs = [{t for t, w in v.items() if int(w * index.scale) > 0} for v in splade.encode(TOY)]
    enc = IDFQueryEncoder.from_index(index)
    assert enc.weights['cat'] == pytest.approx(idf(sum('cat' in v for v in vecs), 4))
    assert set(enc.weights) == set().union(*vecs)
    out = (enc >> index.toks_retriever())(pd.DataFrame({'qid': ['q'], 'query': ['cat']}))
    assert set(out.docno) == {str(i) for i, v in enumerate(vecs) if 'cat' in v}


def test_unknown_and_blank_queries(splade):
    enc = IDFQueryEncoder.from_corpus(splade.tokenizer, TOY)
    assert enc.encode(['zebra', '', None, float('nan')]) == [{}, {}, {}, {}]
    out = enc(pd.DataFrame(columns=['qid', 'query']))
    assert len(out) == 0 and 'query_toks' in out.columns
    assert 'query_toks' in pt.inspect.transformer_outputs(enc, ['qid', 'query'])
    with pytest.raises(pt.validate.InputValidationError, match='query'):
        enc(pd.DataFrame({'qid': ['1']}))


def test_idf_json_round_trip(splade, tmp_path):
    enc = IDFQueryEncoder.from_corpus(splade.tokenizer, TOY + ['Ünïcödé façade'])
    enc.save_pretrained(tmp_path)
    assert json.loads((tmp_path / 'idf.json').read_text(encoding='utf8')) == enc.weights
    again = StaticQueryEncoder.from_pretrained(str(tmp_path))
    assert again.weights == enc.weights
    queries = ['the cat', 'façade dog', 'unknown']
    assert again.encode(queries) == enc.encode(queries)
