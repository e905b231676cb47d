"""What a new user meets in the first hour, on a collection of their own: a header line in topics.tsv is a header, a
retriever given a string says how to search one query, an index not built yet says how to build it."""
import re

import pandas as pd
import pytest

from pyterrier_lsr import LsrIndex
from pyterrier_lsr.core.collection import read_topics
from pyterrier_lsr.systems import bm25


@pytest.mark.parametrize('header', ['qid\tquery', 'QID\tQuery', 'query_id\ttext', 'id\ttext', '\ufeffqid\tquery'])
def test_a_header_line_of_topics_tsv_is_skipped(tmp_path, header):
    path = tmp_path / 'topics.tsv'
    path.write_text(f'{header}\n1\tradio waves\n2\telectron density\n', encoding='utf8')
    topics = read_topics(path)
    assert topics['qid'].tolist() == ['1', '2'] and topics['query'].tolist() == ['radio waves', 'electron density']


def test_only_a_first_line_naming_the_columns_is_a_header(tmp_path):
    path = tmp_path / 'topics.tsv'
    path.write_text('\nqid\tquery\n1\tradio\n', encoding='utf8')  # blank lines before it do not count
    assert read_topics(path)['qid'].tolist() == ['1']
    path.write_text('1\tradio\nqid\tquery\n', encoding='utf8')  # later, it is a topic like any other
    assert read_topics(path)['qid'].tolist() == ['1', 'qid']
    path.write_text('id\tradio waves\n2\telectron\n', encoding='utf8')  # a topic whose qid is "id" stays one
    assert read_topics(path)['qid'].tolist() == ['id', '2']


@pytest.fixture(scope='module')
def built(tmp_path_factory, splade, vaswani_docs):
    folder = tmp_path_factory.mktemp('first-hour')
    index = LsrIndex(folder / 'splade.lsr', splade, verbose=False)
    index.index(vaswani_docs[:30])
    return index, bm25(folder / 'bm25.pisa', vaswani_docs[:30], verbose=False)


def test_a_retriever_given_a_string_says_to_use_search(built, vaswani_docs):
    index, bm25_retriever = built
    hint = re.escape(".search('radio waves')")
    for retriever in (index.retriever(), index.toks_retriever(), index, bm25_retriever):
        with pytest.raises(TypeError, match=f'takes a frame of queries .*{hint}'):
            retriever('radio waves')
        with pytest.raises(TypeError, match=hint):
            retriever.transform('radio waves')
    # and what the hint says works: one query's ranking
    query = ' '.join(vaswani_docs[0]['text'].split()[:4])
    assert len(index.retriever().search(query)) > 0 and len(bm25_retriever.search(query)) > 0
    assert len(index.retriever()(pd.DataFrame({'qid': ['1'], 'query': ['radio waves']}))) > 0


def test_an_index_not_built_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(f'no pyterrier-lsr index at {tmp_path / "none.lsr"} '
                                                          '(nothing there): build it with index.index(corpus)')):
        LsrIndex(tmp_path / 'none.lsr').retriever()
    (tmp_path / 'empty.lsr').mkdir()
    with pytest.raises(FileNotFoundError, match=r'\(no \.lsr-artifact\.json marking one\): build it with index\.index'):
        LsrIndex(tmp_path / 'empty.lsr').retriever()
