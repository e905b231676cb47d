"""Effectiveness on real data: the offline SPLADE checkpoint on Vaswani reproduces the reference numbers."""

import importlib.util
from pathlib import Path

import pytest


@pytest.mark.slow
def test_vaswani_experiment_reproduces_reference(tmp_path):
    spec = importlib.util.spec_from_file_location(
        'vaswani_example', Path(__file__).parents[1] / 'examples' / 'vaswani.py'
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    table = example.experiment(workdir=str(tmp_path)).set_index('name')['nDCG@10']
    assert table['BM25 (PISA)'] == pytest.approx(0.467, abs=0.01)
    assert table['SPLADE splade-tiny'] == pytest.approx(0.372, abs=0.01)
    assert table['SPLADE docs + IDF queries (index df)'] == pytest.approx(0.378, abs=0.01)
    assert table['SPLADE docs + IDF queries (corpus df)'] == pytest.approx(0.378, abs=0.01)
