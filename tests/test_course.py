"""The course kit on a small Vaswani subset: examples/course.py builds every system and prints one table; the notebook
(examples/course.ipynb, its code cells executed in one namespace), run on the same folders, reuses every model and
index."""
import json
import runpy
from dataclasses import asdict
from pathlib import Path

import pytest
from pyterrier.io import ok_filename

ROOT = Path(__file__).resolve().parents[1]
# MiniLM whatever else is installed: the kit's default base (all-mpnet-base-v2 when installed) is 8x slower
SMALL = {'DOCS': 200, 'TOPICS': 5, 'STEPS': 2, 'LATENTS': 512, 'DENSE': 'all-MiniLM-L6-v2'}
# short, stable names: the method, then the model's folder (the query side's own, for adapted queries)
SYSTEMS = ['BM25', 'SPLADE (splade-tiny)', 'IDF queries on splade.lsr', 'Latent Terms (', 'VT-SPLADE',
           'SAE-SPLADE (sae-splade-512)', 'SPLADE']
METRICS = ['nDCG@10', 'AP', 'R@100', 'RR@10']


def files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob('*') if p.is_file()}


def run_notebook(params: dict) -> dict:
    """Executes the notebook's code cells in one namespace, the parameter cell's assignments overridden."""
    cells = json.loads((ROOT / 'examples' / 'course.ipynb').read_text())['cells']
    namespace = {}
    for cell in cells:
        if cell['cell_type'] != 'code':
            continue
        exec(compile(''.join(cell['source']), 'course.ipynb', 'exec'), namespace)
        if 'parameters' in cell['metadata'].get('tags', []):
            namespace.update(params)
    return namespace


def test_course_script_and_notebook_build_once_then_reuse(tmp_path, capfd):
    main = runpy.run_path(str(ROOT / 'examples' / 'course.py'))['main']
    argv = ['--workdir', str(tmp_path / 'course')] + [f'--{k.lower()}={v}' for k, v in SMALL.items()]
    table = main(argv)
    out = capfd.readouterr().out
    # quiet: the printed table and nothing else (no PISA log lines, temporary paths or progress bars)
    assert len(out.strip().splitlines()) == 1 + len(SYSTEMS), out
    names = table['name'].tolist()
    assert len(names) == len(SYSTEMS) and all(expected in name for expected, name in zip(SYSTEMS, names)), names
    assert names[0] == 'BM25' and all(len(n) < 60 and '0x' not in n for n in names), names
    # adapted queries are named by their own folder (the documents are splade-tiny's and VT-SPLADE's)
    assert '(vt-splade-queries)' in names[4] and '(splade-adapted)' in names[6], names
    assert all(ok_filename(n) for n in names), names  # pt.Experiment(save_dir=...) accepts the default names
    for metric in METRICS:
        assert all(0 <= v <= 1 for v in table[metric]), table
    # the subset keeps each topic's relevant documents, so the untrained systems find most of them
    assert table['nDCG@10'].iloc[0] > 0.4 and table['nDCG@10'].iloc[1] > 0.4, table
    assert table['nDCG@10'].min() > 0.1 and (table['mrt'] > 0).all(), table
    built = files(tmp_path / 'course')
    trained = tmp_path / 'course' / 'vaswani-200' / '2-steps'
    for system in ('vt-splade', 'vt-splade-queries', 'sae-splade-512', 'splade-adapted'):
        assert (trained / system / 'domain_adapt.json').is_file()
    assert (trained / 'vt-splade.lsr').is_dir() and not (trained / 'splade-adapted.lsr').exists()

    # the notebook on the script's folders is a re-run: it trains, encodes and writes nothing, and gives the same table
    notebook = run_notebook({**SMALL, 'WORKDIR': str(tmp_path / 'course')})
    assert files(tmp_path / 'course') == built
    assert notebook['table'][METRICS].equals(table[METRICS]) and notebook['table']['name'].tolist() == names


CORPUS = [{'docno': 'd1', 'text': 'nuclear reactor physics'}]


def test_adapted_refuses_a_folder_trained_with_other_settings(tmp_path):
    from pyterrier_lsr.systems import adapted
    from pyterrier_lsr.train import DomainConfig
    folder = tmp_path / 'm'
    folder.mkdir()
    (folder / 'domain_adapt.json').write_text(json.dumps({'config': asdict(DomainConfig(steps=5))}))
    with pytest.raises(ValueError, match='other settings .*steps'):
        adapted(lambda: pytest.fail('must not build a model'), CORPUS, folder, DomainConfig(steps=6))


def test_adapted_refuses_a_run_on_another_corpus_and_a_run_that_records_none(tmp_path):
    from pyterrier_lsr.systems import adapted
    from pyterrier_lsr.systems.builders import SYSTEM_FILE
    from pyterrier_lsr.train import DomainConfig
    from pyterrier_lsr.train.domain import claim_output
    folder = claim_output(tmp_path / 'm')
    (folder / 'domain_adapt.json').write_text(json.dumps({'config': asdict(DomainConfig())}))
    with pytest.raises(ValueError, match='records no system.json'):
        adapted(lambda: pytest.fail('must not build a model'), CORPUS, folder)
    (folder / SYSTEM_FILE).write_text(json.dumps({'corpus': 'another'}))
    with pytest.raises(ValueError, match=r'other settings \(corpus\)'):
        adapted(lambda: pytest.fail('must not build a model'), CORPUS, folder)


def test_subset_keeps_relevant_documents_first():
    from pyterrier_lsr.core.collection import load_collection
    full = load_collection('irds:vaswani')
    small = full.subset(docs=150, topics=4)
    assert len(small.corpus) == 150 and small.topics['qid'].tolist() == full.topics['qid'].head(4).tolist()
    relevant = set(full.qrels[full.qrels['qid'].isin(small.topics['qid']) & (full.qrels['label'] > 0)]['docno'])
    docnos = [d['docno'] for d in small.corpus]
    assert relevant <= set(docnos) and len(relevant) < 150
    order = {d['docno']: i for i, d in enumerate(full.corpus)}
    assert docnos == sorted(docnos, key=order.get)  # collection order
    others = [d for d in docnos if d not in relevant]
    assert others == [d['docno'] for d in full.corpus if d['docno'] not in relevant][:len(others)]
    assert set(small.qrels['docno']) <= set(docnos) and set(small.qrels['qid']) <= set(small.topics['qid'])
    assert len(full.subset().corpus) == len(full.corpus)
    with pytest.raises(ValueError):
        full.subset(docs=0)
