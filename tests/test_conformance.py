"""Every public transformer that can be built from the offline models passes :func:`conformance.check_transformer`."""
import copy

import pandas as pd
import pyterrier as pt
import pytest
from conformance import TEXTS, check_transformer

from pyterrier_lsr import (AsymmetricSplade, IDFQueryEncoder, InferenceFreeSplade, Prune, SaeSplade, SaeSpladeModel,
                           Splade, StaticQueryEncoder)
from pyterrier_lsr.latent_terms import LatentTerms
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
from pyterrier_lsr.models.sae_splade import structural_token_ids


def idf(splade):
    return IDFQueryEncoder.from_corpus(splade.tokenizer, TEXTS * 2 + ['nuclear physics'])


def asymmetric(splade):
    return AsymmetricSplade(splade.model, splade.tokenizer, copy.deepcopy(splade.model), batch_size=2)


def sae_splade(tiny):
    mlm, tokenizer = tiny[0].mlm, tiny[1]
    sae = SparseAutoencoder(SAEConfig(d_in=32, n_latents=64, k=4, seed=1))
    return SaeSplade(SaeSpladeModel(mlm.bert, sae, structural_token_ids(tokenizer)), tokenizer, batch_size=2)


def latent_terms():
    return LatentTerms('all-MiniLM-L6-v2', SparseAutoencoder(SAEConfig(d_in=384, n_latents=64, k=4, seed=1)),
                       mode='multi', batch_size=2)


CASES = {  # name -> (fixtures, factory, inputs kind)
    'splade.doc_encoder': ('splade', lambda s: s.doc_encoder(), 'doc'),
    'splade.query_encoder': ('splade', lambda s: s.query_encoder(), 'query'),
    'splade.scorer': ('splade', lambda s: s.scorer(), 'result'),
    'Splade as a query encoder': ('splade', lambda s: s, 'query'),
    'Splade as a doc encoder': ('splade', lambda s: s, 'doc'),
    'random BERT Splade.doc_encoder': ('tiny', lambda t: Splade(*t, batch_size=2).doc_encoder(), 'doc'),
    'IDFQueryEncoder': ('splade', idf, 'query'),
    'StaticQueryEncoder.binary': ('splade', lambda s: StaticQueryEncoder.binary(s.tokenizer), 'query'),
    'InferenceFreeSplade.query_encoder':
        ('splade', lambda s: InferenceFreeSplade(s.model, s.tokenizer, idf(s)).query_encoder(), 'query'),
    'InferenceFreeSplade.doc_encoder':
        ('splade', lambda s: InferenceFreeSplade(s.model, s.tokenizer, idf(s)).doc_encoder(), 'doc'),
    'AsymmetricSplade.query_encoder': ('splade', lambda s: asymmetric(s).query_encoder(), 'query'),
    'AsymmetricSplade.doc_encoder': ('splade', lambda s: asymmetric(s).doc_encoder(), 'doc'),
    'Prune toks': (None, lambda: Prune(top_n=2), 'toks'),
    'Prune query_toks': (None, lambda: Prune(ratio=0.5, threshold=0.2, fields=['query_toks']), 'query_toks'),
    'query_encoder >> Prune': ('splade', lambda s: s.query_encoder() >> Prune(top_n=3), 'query'),
    'SaeSplade.doc_encoder': ('tiny', lambda t: sae_splade(t).doc_encoder(), 'doc'),
    'SaeSplade.query_encoder': ('tiny', lambda t: sae_splade(t).query_encoder(), 'query'),
    'LatentTerms.doc_encoder': (None, lambda: latent_terms().doc_encoder(), 'doc'),
    'LatentTerms.query_encoder': (None, lambda: latent_terms().query_encoder(), 'query'),
}


@pytest.mark.parametrize('case', list(CASES))
def test_conformance(case, request):
    fixture, factory, kind = CASES[case]
    transformer = factory(request.getfixturevalue(fixture)) if fixture else factory()
    check_transformer(transformer, kind)


def test_splade_is_a_transformer_that_encodes_or_scores_by_columns(splade):
    # a result frame with query and text is re-ranked; dropping query leaves a doc frame (encoded), as in pyterrier_dr
    frame = pd.DataFrame({'qid': ['1', '1'], 'query': ['radio waves'] * 2, 'docno': ['a', 'b'],
                          'text': ['radio waves in the ionosphere', 'transistor amplifiers'], 'score': 0., 'rank': 0})
    pd.testing.assert_frame_equal(splade(frame), splade.scorer()(frame))
    assert 'toks' in splade(frame.drop(columns=['query'])).columns
    with pytest.raises(pt.validate.InputValidationError):
        splade(frame.drop(columns=['query', 'text']))
