"""Quiet when asked and no leftovers: with verbose=False builders write nothing to the terminal (checked at the
file-descriptor level, where PISA's C++ writes), and use_irds_cache leaves no copy of the cache behind."""
import os
import subprocess
import sys

import pandas as pd

QUERIES = pd.DataFrame({'qid': ['1', '2'], 'query': ['radio wave noise', 'electron density']})


def test_builders_print_nothing_with_verbose_false(tmp_path, capfd, splade, vaswani_docs):
    from pyterrier_lsr import systems
    from pyterrier_lsr.train.domain import DomainConfig
    from pyterrier_lsr.train.domain.teacher import Teacher
    corpus = vaswani_docs[:30]
    capfd.readouterr()
    bm25 = systems.bm25(tmp_path / 'bm25.pisa', corpus, verbose=False, num_results=5)
    assert len(bm25(QUERIES))
    index = systems.sparse_index(tmp_path / 'splade.lsr', splade, corpus, verbose=False)
    assert len((splade.query_encoder() >> index.toks_retriever(5))(QUERIES))
    docs = {d['docno']: d['text'] for d in corpus}  # the BM25 cache inside domain adaptation
    pools, _ = Teacher(docs, tmp_path / 'cache', DomainConfig(teachers=('bm25',))).pools(
        [{'qid': '1', 'query': corpus[1]['text'][:60], 'pos': corpus[0]['docno']}], 5)
    assert len(pools[0]) > 1
    assert capfd.readouterr() == ('', '')
    # the same build by default: our progress bar, not PISA's log (C++ writes) nor the retriever's bar
    assert len(systems.bm25(tmp_path / 'default.pisa', corpus, num_results=5)(QUERIES))
    out, err = capfd.readouterr()
    assert 'BM25 indexing default.pisa' in err and '30/30' in err
    assert out == '' and '[info]' not in err and 'PISA bm25' not in err and 'Storing terms' not in err


def test_quiet_native_with_progress_shows_python_writes_only(capfd):
    """progress=True: what native code writes to the descriptors is captured (shown only if the block fails); what
    Python writes inside the block still reaches the terminal."""
    from pyterrier_lsr.core.quiet import quiet_native
    capfd.readouterr()
    with quiet_native(progress=True):
        os.write(2, b'native log line\n')
        print('python progress', file=sys.stderr)
        print('python result')
    assert capfd.readouterr() == ('python result\n', 'python progress\n')
    try:
        with quiet_native(progress=True):
            os.write(1, b'native detail\n')
            raise RuntimeError('the build failed')
    except RuntimeError:
        pass
    assert 'native detail' in capfd.readouterr().err


def test_use_irds_cache_makes_one_copy_and_removes_it(tmp_path):
    source = tmp_path / 'cache'
    (source / 'vaswani').mkdir(parents=True)
    (source / 'vaswani' / 'docs').write_text('x')
    temp = tmp_path / 'tmp'
    temp.mkdir()
    script = ('import sys; from pyterrier_lsr.core.offline import use_irds_cache\n'
              'first, second = use_irds_cache(sys.argv[1]), use_irds_cache(sys.argv[1])\n'
              'import os; assert first == second and os.listdir(os.path.dirname(first)) == [os.path.basename(first)]\n'
              'assert open(os.path.join(first, "vaswani", "docs")).read() == "x"\n')
    done = subprocess.run([sys.executable, '-c', script, str(source)], capture_output=True, text=True,
                          env={**os.environ, 'TMPDIR': str(temp)})
    assert done.returncode == 0, done.stderr
    assert os.listdir(temp) == []  # the copy went with the process
