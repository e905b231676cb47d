"""The surfaces a new user meets first: the plain-file collection reader, BM25, the builders' reuse, the first errors
and the one verbosity rule (progress by default, silent with verbose=False)."""
import json
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch

from pyterrier_lsr import systems
from pyterrier_lsr.core.collection import load_collection

QUERIES = pd.DataFrame({'qid': ['1', '2'], 'query': ['radio wave noise', 'electron density']})
DOCS = [{'docno': 'd1', 'text': 'nuclear reactor physics'}, {'docno': 'd2', 'text': 'radio wave noise'},
        {'docno': 'd3', 'text': 'electron density of the ionosphere'}]
SMALL_SAE = {'n_latents': 256, 'k': 4, 'epochs': 1}


def write_collection(folder, docs=None, topics=None, qrels=None):
    """A collection folder; each file's content as bytes or text, the good default otherwise."""
    folder.mkdir(exist_ok=True)
    files = {'docs.jsonl': ''.join(json.dumps(d) + '\n' for d in DOCS) if docs is None else docs,
             'topics.tsv': '1\tradio noise\n2\telectron\n' if topics is None else topics,
             'qrels.txt': '1 0 d2 1\n2 0 d3 2\n2 0 d1 0\n' if qrels is None else qrels}
    for name, content in files.items():
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode('utf8'))
    return folder


# -- 1. the plain-file collection reader ----------------------------------------------------------------------------
def test_a_collection_folder_reads_with_a_bom_crlf_line_ends_and_blank_lines(tmp_path):
    docs = '\ufeff' + ''.join(json.dumps(d, ensure_ascii=False) + '\r\n' for d in DOCS) + '\r\n  \n'
    docs = docs.replace('nuclear', 'nucléaire\u2028')  # a line separator inside a JSON string is text, not a line end
    topics, qrels = '\ufeff1\tradio noise\r\n\r\n2\telectron\r\n', '\n1 0 d2 1\r\n2\t0\td3 2\n2 0 d1 0\n\n'
    folder = write_collection(tmp_path / 'c', docs.encode('utf8'), topics, qrels)
    collection = load_collection(folder)
    assert [d['docno'] for d in collection.corpus] == ['d1', 'd2', 'd3']
    assert collection.corpus[0]['text'] == 'nucléaire\u2028 reactor physics'
    assert collection.topics.to_dict('list') == {'qid': ['1', '2'], 'query': ['radio noise', 'electron']}
    assert collection.qrels.to_dict('list') == {'qid': ['1', '2', '2'], 'docno': ['d2', 'd3', 'd1'], 'label': [1, 2, 0]}
    assert collection.qrels['label'].dtype == 'int64'


@pytest.mark.parametrize('file, content, line, match', [
    ('docs.jsonl', b'{"docno": "d1", "text": "caf\xe9"}\n', 1, 'not valid UTF-8'),
    ('docs.jsonl', '{"docno": "d1", "text": "a"}\n{"docno": "d2"}\n', 2, 'no "text" field'),
    ('docs.jsonl', '{"text": "a"}\n', 1, 'no "docno" field'),
    ('docs.jsonl', '"just a string"\n', 1, 'a JSON string, not an object'),
    ('docs.jsonl', '\n\n42\n', 3, 'a JSON number, not an object'),
    ('docs.jsonl', '["d1", "text"]\n', 1, 'a JSON array, not an object'),
    ('docs.jsonl', '{"docno": "d1", "text": "a"\n', 1, 'not valid JSON'),
    ('docs.jsonl', '{"docno": null, "text": "a"}\n', 1, 'docno is missing'),
    ('docs.jsonl', '{"docno": true, "text": "a"}\n', 1, 'docno True is a bool; docnos must be strings'),
    ('docs.jsonl', '{"docno": ["d1"], "text": "a"}\n', 1, 'is a list; docnos must be strings'),
    ('docs.jsonl', '{"docno": 7, "text": "a"}\n', 1, 'docno 7 is a int; docnos must be strings, never converted'),
    ('docs.jsonl', '{"docno": "d 1\\n", "text": "a"}\n', 1, 'line break'),
    ('docs.jsonl', '{"docno": "d1", "text": "a"}\n{"docno": "d1", "text": "b"}\n', 2, "docno 'd1' occurs twice"),
    ('docs.jsonl', '{"docno": "d1", "text": null}\n', 1, '"text" is a JSON null, not a string'),
    ('topics.tsv', '1\tradio\n2\telectron\tdensity\n', 2, '3 tab-separated fields.*may not contain a tab'),
    ('topics.tsv', '1 radio\n', 1, '1 tab-separated fields'),
    ('topics.tsv', '1\tradio\n1\tagain\n', 2, "qid '1' occurs twice"),
    ('topics.tsv', '1\t \n', 1, "the query of qid '1' is empty"),
    ('qrels.txt', '1 0 d2 1\n1 d2 1\n', 2, '3 fields; a TREC qrels line has 4'),
    ('qrels.txt', '1 0 d2 1 extra\n', 1, '5 fields; a TREC qrels line has 4'),
    ('qrels.txt', '1 0 d2 rel\n', 1, "label 'rel' is not an integer"),
    ('qrels.txt', '1 0 d2 1.5\n', 1, "label '1.5' is not an integer"),
    ('qrels.txt', '1 0 d2 1\n1 0 d2 0\n', 2, 'judged twice'),
])
def test_a_bad_collection_line_is_an_error_naming_file_line_and_field(tmp_path, file, content, line, match):
    folder = write_collection(tmp_path / 'c', **{file.split('.')[0]: content})
    with pytest.raises((ValueError, TypeError), match=re.escape(f'{folder / file}, line {line}: ') + f'.*{match}'):
        load_collection(folder)


def test_subset_checks_its_arguments():
    collection = load_collection('irds:vaswani')
    for kwargs, error in [({'docs': 2.5}, TypeError), ({'topics': '3'}, TypeError), ({'docs': 0}, ValueError)]:
        name = next(iter(kwargs))
        with pytest.raises(error, match=f'^{name} must be'):
            collection.subset(**kwargs)
    assert len(collection.subset(docs=50, topics=2).corpus) == 50


# -- 2. documents are checked wherever a corpus enters --------------------------------------------------------------
@pytest.mark.parametrize('corpus, error, match', [
    (DOCS + [DOCS[0]], ValueError, "docno 'd1' occurs twice"),
    (DOCS + [{'docno': None, 'text': 'x'}], ValueError, 'docno is missing'),
    ([{'docno': 'a\nb', 'text': 'x'}] + DOCS, ValueError, 'line break'),
    ([{'docno': 1, 'text': 'x'}] + DOCS, TypeError, 'docnos must be strings'),
    ([], ValueError, 'holds no documents'),
    ([{'docno': 'a', 'text': ' '}], ValueError, 'has a word'),
])
def test_bm25_refuses_bad_documents_before_pisa_sees_them(tmp_path, corpus, error, match):
    with pytest.raises(error, match=match):
        systems.bm25(tmp_path / 'bm25.pisa', corpus, verbose=False)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temporary folder


def test_bm25_refuses_a_file_and_a_folder_of_user_files_and_leaves_them_alone(tmp_path):
    (tmp_path / 'file').write_text('mine')
    with pytest.raises(FileExistsError, match='not a folder'):  # PISA aborted the process (SIGABRT) on a file
        systems.bm25(tmp_path / 'file', DOCS, verbose=False)
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match='not ours to replace'):
            systems.bm25(mine, DOCS, verbose=False, overwrite=overwrite)
    assert (tmp_path / 'file').read_text() == 'mine' and [p.name for p in mine.iterdir()] == ['notes.txt']
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file', 'mine']


def test_bm25_reopens_its_index_for_the_same_corpus_only(tmp_path):
    path = tmp_path / 'bm25.pisa'
    first = systems.bm25(path, DOCS, verbose=False, num_results=5)
    assert first(QUERIES)['docno'].tolist() == ['d2', 'd3']
    mtimes = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    again = systems.bm25(path, iter(DOCS), verbose=False, num_results=5)  # a generator is read once, too
    assert again(QUERIES)['docno'].tolist() == ['d2', 'd3']
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir() if p.name in mtimes} == mtimes
    other = DOCS[:2] + [{'docno': 'd3', 'text': 'electron beams'}]
    with pytest.raises(ValueError, match='another corpus.*overwrite=True'):
        systems.bm25(path, other, verbose=False)
    rebuilt = systems.bm25(path, other, verbose=False, overwrite=True, num_results=5)
    assert rebuilt(QUERIES.iloc[[1]])['docno'].tolist() == ['d3'] and rebuilt.index.built()


def test_the_latent_terms_and_sae_splade_builders_refuse_unconverted_docnos_before_any_work(tmp_path, monkeypatch):
    from pyterrier_lsr.systems import builders
    from pyterrier_lsr.train import sae
    monkeypatch.setattr(sae, 'LatentTerms', lambda *a, **k: pytest.fail('must not load a model'))
    with pytest.raises(TypeError, match='document 1 of the corpus: docno 2 is a int'):
        sae.build_latent_terms([{'docno': '1', 'text': 'a'}, {'docno': 2, 'text': 'b'}], tmp_path / 'x.lsr')
    with pytest.raises(TypeError, match='document 0 of stage1_extra: docno 1 is a int'):
        builders.sae_splade(DOCS, tmp_path / 'sae', stage1_extra=[{'docno': 1, 'text': 'a'}])
    assert list(tmp_path.iterdir()) == []


# -- 3. builders never reuse silently -------------------------------------------------------------------------------
def test_sparse_index_reuses_for_the_same_model_only(tmp_path, splade):
    from pyterrier_lsr import Splade
    from pyterrier_lsr.core.names import resolve_model
    path = tmp_path / 'splade.lsr'
    index = systems.sparse_index(path, splade, DOCS, verbose=False)
    build = index.build_id()
    same = Splade.from_pretrained(resolve_model('splade-tiny'), name='another name')
    assert systems.sparse_index(path, same, DOCS, verbose=False).build_id() == build
    other = Splade.from_pretrained(resolve_model('splade-tiny'))
    with torch.no_grad():
        next(other.model.parameters()).add_(0.01)
    for model, corpus, kwargs, differs in [(other, DOCS, {}, 'model'), (splade, DOCS[:2], {}, 'corpus'),
                                           (splade, DOCS, {'scale': 50.}, 'settings.scale (100.0 recorded, 50.0')]:
        with pytest.raises(ValueError, match=re.escape(f'built with a different {differs}') + '.*overwrite=True'):
            systems.sparse_index(path, model, corpus, verbose=False, **kwargs)
    assert systems.sparse_index(path, splade, DOCS, verbose=False).build_id() == build  # refusals change nothing
    rebuilt = systems.sparse_index(path, other, DOCS, verbose=False, overwrite=True)
    assert rebuilt.build_id() != build and systems.sparse_index(path, other, DOCS, verbose=False).build_id() == \
        rebuilt.build_id()


def test_sparse_index_reuses_for_the_same_model_reloaded(tmp_path, splade):
    from pyterrier_lsr import LsrIndex, Splade
    from pyterrier_lsr.models.vocab_transfer import transfer_vocabulary
    from pyterrier_lsr.models.vocabularies import extend_vocabulary
    target, words = extend_vocabulary(splade.tokenizer, [d['text'] for d in DOCS] * 2, 5)
    assert words
    model, tokenizer, _ = transfer_vocabulary(splade.model, splade.tokenizer, target)
    index = systems.sparse_index(tmp_path / 'vt.lsr', Splade(model, tokenizer, name='vt'), DOCS, verbose=False)
    reloaded = LsrIndex(tmp_path / 'vt.lsr').model()  # writes its settings in another order, its loader state too
    assert systems.sparse_index(tmp_path / 'vt.lsr', reloaded, DOCS, verbose=False).build_id() == index.build_id()


def test_sparse_index_refuses_an_index_it_did_not_record(tmp_path, splade):
    from pyterrier_lsr import LsrIndex
    LsrIndex(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)
    with pytest.raises(ValueError, match='this builder did not record'):
        systems.sparse_index(tmp_path / 'x.lsr', splade, DOCS, verbose=False)


def test_latent_terms_index_refuses_other_sae_settings(tmp_path, vaswani_docs):
    from pyterrier_lsr import LsrIndex
    corpus = [{'docno': d['docno'], 'text': d['text']} for d in vaswani_docs[:20]]
    path, cache = tmp_path / 'lt.lsr', tmp_path / 'cache'
    index = systems.latent_terms_index(path, corpus, cache_dir=cache, sae=SMALL_SAE, verbose=False)
    again = systems.latent_terms_index(path, corpus, cache_dir=cache, sae=SMALL_SAE, verbose=False)
    assert again.build_id() == index.build_id()
    with pytest.raises(ValueError, match=r"different settings\.sae \(.*'n_latents': 256.*'n_latents': 512"):
        systems.latent_terms_index(path, corpus, cache_dir=cache, sae={**SMALL_SAE, 'n_latents': 512}, verbose=False)
    with pytest.raises(ValueError, match=r'different settings\.sqrt_tf'):
        systems.latent_terms_index(path, corpus, cache_dir=cache, sae=SMALL_SAE, sqrt_tf=False, verbose=False)
    assert LsrIndex(path).build_id() == index.build_id()  # refusals change nothing


# -- 4. a new user's first errors -----------------------------------------------------------------------------------
def test_an_unavailable_hub_model_is_one_clear_error_naming_the_offline_names(tmp_path):
    script = 'from pyterrier_lsr import Splade\nSplade.from_pretrained("naver/splade-v3")\n'
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                          env={**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_HOME': str(tmp_path / 'hf')})
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) < 12, done.stderr  # the hub client's traceback was 91 lines
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("FileNotFoundError: cannot load the model 'naver/splade-v3'"), last
    assert 'local model folder' in last and "'splade-tiny'" in last and "'all-MiniLM-L6-v2'" in last, last


def test_a_missing_model_path_or_a_file_names_the_offline_names_too(tmp_path):
    from pyterrier_lsr import load_model
    (tmp_path / 'weights.bin').write_text('x')
    for name, reason in [(tmp_path / 'missing', 'a path is never looked up'), (tmp_path / 'weights.bin', 'is a file')]:
        with pytest.raises(FileNotFoundError, match=f"{reason}.*local model folder.*'splade-tiny'"):
            load_model(name)


def test_a_folder_of_user_files_is_refused_without_suggesting_overwrite(tmp_path, splade):
    from pyterrier_lsr import LsrIndex
    mine = tmp_path / 'mine'
    mine.mkdir()
    (mine / 'thesis.tex').write_text('years of work')
    with pytest.raises(FileExistsError) as refused:
        LsrIndex(mine, splade, verbose=False).index(DOCS)
    assert 'not ours to replace, with or without overwrite=True' in str(refused.value)
    assert 'pass overwrite=True' not in str(refused.value)
    LsrIndex(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)
    with pytest.raises(FileExistsError, match='already exists .*pass overwrite=True to replace it'):  # ours: it may
        LsrIndex(tmp_path / 'x.lsr', splade, verbose=False).index(DOCS)


# -- 5. one verbosity rule ------------------------------------------------------------------------------------------
def progress_bars(err: str) -> list:
    """The tqdm bars in captured stderr that reached their end, with counts and an estimate."""
    return re.findall(r'(\S+):\s+100%\|[^|]*\| (\d+)/\2 \[[0-9:]+<[0-9:]+', err)


def test_each_builder_shows_progress_by_default_and_is_silent_with_verbose_false(tmp_path, capfd, splade,
                                                                                vaswani_docs):
    corpus = [{'docno': d['docno'], 'text': d['text']} for d in vaswani_docs[:20]]
    builds = {
        'bm25': lambda path, **kw: systems.bm25(path, corpus, **kw),
        'sparse_index': lambda path, **kw: systems.sparse_index(path, splade, corpus, **kw),
        'latent_terms_index': lambda path, **kw: systems.latent_terms_index(path, corpus, sae=SMALL_SAE,
                                                                            cache_dir=path.with_suffix('.cache'), **kw),
    }
    for name, build in builds.items():
        capfd.readouterr()
        build(tmp_path / f'{name}-quiet.x', verbose=False)
        assert capfd.readouterr() == ('', ''), name
        build(tmp_path / f'{name}-default.x')
        bars = progress_bars(capfd.readouterr().err)
        assert bars and ('20' in [count for _, count in bars]), (name, bars)


def test_bm25_refuses_a_corpus_without_a_word_before_pisa_aborts(tmp_path):
    with pytest.raises(ValueError, match='has a word'):
        systems.bm25(tmp_path / 'x', [{'docno': 'a', 'text': '!!! ???'}], verbose=False)


@pytest.mark.parametrize('docno', ['doc 1', 'a\tb'])
def test_bm25_refuses_docnos_pisa_would_cut(docno, tmp_path):
    with pytest.raises(ValueError, match='whitespace'):
        systems.bm25(tmp_path / 'x', [{'docno': docno, 'text': 'radio'}, {'docno': 'b', 'text': 'cats'}],
                     verbose=False)


def test_corpora_that_join_alike_have_other_keys_and_a_lone_surrogate_has_one():
    from pyterrier_lsr.core.collection import corpus_key
    assert corpus_key({'a': 'radio\nb\twaves', 'c': 'cats'}) != corpus_key({'a': 'radio', 'b': 'waves\nc\tcats'})
    assert len(corpus_key({'a': 'radio \ud800'})) == 12


@pytest.mark.parametrize('line', ['{"docno": ' + '9' * 5000 + ', "text": "x"}', '[' * 100_000])
def test_unreadable_json_names_file_and_line(line, tmp_path):
    (tmp_path / 'docs.jsonl').write_text('{"docno": "a", "text": "x"}\n' + line + '\n')
    (tmp_path / 'topics.tsv').write_text('1\tx\n')
    (tmp_path / 'qrels.txt').write_text('1 0 a 1\n')
    with pytest.raises(ValueError, match=r'docs.jsonl, line 2'):
        load_collection(tmp_path)


def test_one_string_is_not_a_list_of_texts(splade):
    for encode in (splade.encode, splade.encode_queries, splade.encode_docs):
        with pytest.raises(TypeError, match='texts: a list of strings'):
            encode('radio')


def test_a_user_file_named_like_our_lock_is_kept(tmp_path):
    from pyterrier_lsr import SpladeIndexer
    lock = tmp_path / '.ix.lock'
    lock.write_text('user content')
    with pytest.raises(ValueError, match='not a lock file of ours'):
        SpladeIndexer(tmp_path / 'ix', verbose=False).index([{'docno': 'd1', 'toks': {'a': 1.0}}])
    assert lock.read_text() == 'user content'
