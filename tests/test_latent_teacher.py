"""Latent Terms as a teacher of domain adaptation (beside BM25 and the dense bi-encoder)."""
import random

import pytest

from pyterrier_lsr.train import DomainConfig
from pyterrier_lsr.train.domain import cache as domain_cache
from pyterrier_lsr.train.domain.config import config_from_overrides
from pyterrier_lsr.train.domain.teacher import Teacher

WORDS = ('nuclear reactor physics electron density ionosphere transistor amplifier measurement dielectric constant '
         'liquids radio wave noise circuit').split()


@pytest.fixture(scope='module')
def docs():
    rng = random.Random(0)
    return {f'd{i}': ' '.join(rng.sample(WORDS, 6)) + '.' for i in range(30)}


def test_latent_teacher_scores_every_candidate_and_is_built_once(docs, tmp_path, monkeypatch):
    from pyterrier_lsr.train import sae
    # the recipe's floor of updates over 16,384 latents would take minutes; the teacher's plumbing is what is tested
    monkeypatch.setattr(sae, 'LATENT_TERMS', {**sae.LATENT_TERMS, 'sae': {**sae.LATENT_TERMS['sae'], 'n_latents': 256}})
    config = DomainConfig(teachers=('bm25', 'latent'), candidates='bm25')
    queries = [{'qid': 'q0', 'query': docs['d3'], 'pos': 'd3'}, {'qid': 'q1', 'query': docs['d17'], 'pos': 'd17'}]
    pools, _ = Teacher(docs, tmp_path, config).pools(queries, depth=5)
    for pool, q in zip(pools, queries):
        assert all(set(scores) == {'bm25', 'latent'} for scores in pool.values())
        # a query that is a document's whole text: Latent Terms ranks that document first
        assert max(pool, key=lambda d: pool[d]['latent']) == q['pos']
        assert sum(scores['latent'] > 0 for scores in pool.values()) == 5

    def no_build(*args, **kwargs):
        raise AssertionError('built again')
    monkeypatch.setattr(sae, 'build_latent_terms', no_build)
    again, _ = Teacher(docs, tmp_path, config).pools(queries, depth=5)
    assert again == pools


def test_latent_teacher_base_is_a_data_setting_only_when_used(docs, tmp_path, monkeypatch):
    config = config_from_overrides({'teachers': 'bm25+latent', 'latent_teacher': 'all-mpnet-base-v2'})
    assert config.teachers == ('bm25', 'latent') and config.latent_teacher == 'all-mpnet-base-v2'
    seen = []
    monkeypatch.setattr(domain_cache, 'read_json', lambda path, what: seen.append(path.name) or {})
    monkeypatch.setattr(domain_cache.Path, 'exists', lambda self: True)
    monkeypatch.setattr(domain_cache, 'check_cached_data', lambda data, *args: data)  # no file: only its name
    for teachers, base in ((('bm25',), 'a'), (('bm25',), 'b'), (('bm25', 'latent'), 'a'), (('bm25', 'latent'), 'b')):
        domain_cache.build_data(docs, tmp_path, DomainConfig(teachers=teachers, latent_teacher=base))
    # the base changes the cached data's key only for a run taught by Latent Terms (older caches keep their keys)
    assert seen[0] == seen[1] and len({seen[0], seen[2], seen[3]}) == 3
