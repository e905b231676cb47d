import math

import pandas as pd
import pyterrier as pt
import pytest
import torch
from tqdm.auto import tqdm

from pyterrier_lsr import LsrIndex, SpladeIndexer
from pyterrier_lsr.index import quantize
from pyterrier_lsr.kinds.latent_terms import LatentTerms
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder
from pyterrier_lsr.train import build_latent_terms

TEXTS = ['nuclear reactor physics and electron density', 'the cat sat on the mat', 'radio wave noise in circuits',
         'dielectric constant of liquids', 'transistor amplifier measurement']


@pytest.fixture(scope='module')
def latent_terms():
    """MiniLM (offline) + an untrained SAE: encoding is deterministic, which is all these tests need."""
    sae = SparseAutoencoder(SAEConfig(d_in=384, n_latents=256, k=8, seed=1))
    return LatentTerms('all-MiniLM-L6-v2', sae, mode='multi', sqrt_tf=True, batch_size=2)


def test_encoding_is_sum_of_token_latents(latent_terms):
    vecs = latent_terms.encode(TEXTS)
    tokens = latent_terms.tokenizer(TEXTS[1], return_tensors='pt')
    with torch.no_grad():
        hidden = latent_terms.features.dense(**tokens).last_hidden_state[0]
        z = latent_terms.sae.encode(torch.nn.functional.normalize(hidden, dim=-1))
    expected = z.sum(0).sqrt()
    assert {int(t[1:]) for t in vecs[1]} == set(expected.nonzero()[:, 0].tolist())
    for term, weight in vecs[1].items():
        assert math.isclose(weight, expected[int(term[1:])].item(), rel_tol=1e-4)
    assert all(len(v) >= 8 for v in vecs) and all(t.startswith('l') for v in vecs for t in v)


def test_single_mode_is_k_sparse(latent_terms):
    single = LatentTerms('all-MiniLM-L6-v2', latent_terms.sae, mode='single')
    assert [len(v) for v in single.encode(TEXTS)] == [8] * len(TEXTS)


def test_cached_route_matches_encoder(latent_terms):
    texts = TEXTS + ['', None]
    vectors, offsets = latent_terms.embed(texts)
    assert offsets[-1] == len(vectors) and offsets[-1] == offsets[-2] == offsets[-3]  # blanks own no vectors
    for a, b in zip(latent_terms.encode_vectors(vectors, offsets, batch_size=3), latent_terms.encode(texts)):
        assert a.keys() == b.keys() and all(math.isclose(a[t], b[t], rel_tol=1e-4, abs_tol=1e-6) for t in a)


def test_save_load_round_trip(latent_terms, tmp_path):
    latent_terms.save_pretrained(tmp_path / 'lt')
    loaded = LatentTerms.from_pretrained(tmp_path / 'lt', batch_size=4)
    assert (loaded.mode, loaded.sqrt_tf, loaded.dense_name) == ('multi', True, 'all-MiniLM-L6-v2')
    # batch_size differs, so padding does: float sums may differ in the last bits on some CPUs (Intel MKL), not more
    for a, b in zip(loaded.encode(TEXTS), latent_terms.encode(TEXTS), strict=True):
        assert a.keys() == b.keys() and all(math.isclose(a[t], b[t], rel_tol=1e-5, abs_tol=1e-7) for t in a)


@pytest.mark.parametrize('make, inp, out_col', [
    (lambda lt: lt.doc_encoder(), ['docno', 'text'], 'toks'),
    (lambda lt: lt.query_encoder(), ['qid', 'query'], 'query_toks'),
])
def test_empty_frames_missing_columns_blank_text(latent_terms, make, inp, out_col):
    transformer = make(latent_terms)
    out = transformer(pd.DataFrame(columns=inp))
    assert len(out) == 0 and out_col in out.columns
    with pytest.raises(pt.validate.InputValidationError, match=inp[-1]):
        transformer(pd.DataFrame({inp[0]: ['x']}))
    out = transformer(pd.DataFrame({inp[0]: ['1', '2', '3'], inp[-1]: ['  ', TEXTS[0], None]}))
    assert out[out_col][0] == {} and out[out_col][2] == {} and len(out[out_col][1]) > 0


def reference_bm25(docs, query, k1, b):
    """Textbook BM25 as PISA computes it: idf = max(1e-6, log((N - df + .5) / (df + .5))) * (1 + k1), document
    length = sum of the document's TFs; each query term's contribution is multiplied by its weight."""
    n = len(docs)
    avgdl = sum(sum(d.values()) for d in docs.values()) / n
    scores = {}
    for docno, doc in docs.items():
        dl, score = sum(doc.values()), 0.
        for term, weight in query.items():
            if term in doc:
                df = sum(term in d for d in docs.values())
                idf = max(1e-6, math.log((n - df + 0.5) / (df + 0.5))) * (1 + k1)
                score += weight * idf * doc[term] / (doc[term] + k1 * (1 - b + b * dl / avgdl))
        if score:
            scores[docno] = score
    return scores


TOY = {'d0': {'l1': 0.5, 'l2': 1.25}, 'd1': {'l1': 2.0}, 'd2': {'l2': 0.75, 'l3': 3.5}, 'd3': {'l3': 0.25, 'l4': 1.0},
       'd4': {'l4': 0.5, 'l5': 2.5}, 'd5': {'l5': 1.5, 'l6': 0.5}, 'd6': {'l6': 4.0, 'l1': 0.25}}


@pytest.mark.parametrize('scale, k1, b', [(100., 1.5, 0.75), (8., 0.9, 0.4), (3., 1.2, 1.0)])
def test_bm25_matches_hand_computed_after_quantization(tmp_path, scale, k1, b):
    docs = dict(TOY, d7={'l2': 0.33, 'l3': 0.7})  # d7 does not quantize exactly
    index = SpladeIndexer(tmp_path / 'toy', scale=scale, verbose=False,
                          scoring={'kind': 'bm25', 'k1': k1, 'b': b}).index(
        [{'docno': d, 'toks': v} for d, v in docs.items()])
    query = {'l1': 1.0, 'l2': 2.0, 'l3': 0.5}
    res = index.toks_retriever()(pd.DataFrame({'qid': ['q'], 'query_toks': [query]}))
    got = dict(zip(res['docno'], res['score']))
    # PISA sees integer TFs int(w * s), query weights int(w * s) and k1 * s.
    quantized = {d: quantize(v, scale) for d, v in docs.items()}
    expected = reference_bm25(quantized, quantize(query, scale), k1 * scale, b)
    assert got.keys() == expected.keys()
    for docno, score in expected.items():
        assert math.isclose(got[docno], score, rel_tol=1e-4), (docno, got[docno], score)


def test_bm25_k1_is_on_the_float_scale(tmp_path):
    """With exactly quantizable TFs, PISA at k1 * s ranks like float BM25 at k1, scores a constant factor apart."""
    scale, k1, b = 4., 1.5, 0.75
    index = SpladeIndexer(tmp_path / 'toy', scale=scale, verbose=False,
                          scoring={'kind': 'bm25', 'k1': 0.1, 'b': 0.1}).index(
        [{'docno': d, 'toks': v} for d, v in TOY.items()])
    query = {'l1': 1.0, 'l2': 0.5, 'l3': 0.25, 'l5': 1.0}
    res = index.toks_retriever(k1=k1, b=b)(pd.DataFrame({'qid': ['q'], 'query_toks': [query]}))
    float_bm25 = reference_bm25(TOY, query, k1, b)
    ratios = {d: s / float_bm25[d] for d, s in zip(res['docno'], res['score'])}
    assert ratios.keys() == float_bm25.keys()
    factor = scale * (1 + k1 * scale) / (1 + k1)  # query weights x s, idf x (1 + k1 s) / (1 + k1)
    for ratio in ratios.values():
        assert math.isclose(ratio, factor, rel_tol=1e-4)
    # The unscaled k1 would be a different (much more saturated) BM25: it does not give these scores.
    naive = reference_bm25({d: quantize(v, scale) for d, v in TOY.items()}, quantize(query, scale), k1, b)
    assert any(not math.isclose(naive[d] / float_bm25[d], ratios[d], rel_tol=1e-2) for d in naive)


def test_pipeline_caches_embeddings_and_indexes_like_the_encoder(tmp_path, monkeypatch):
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(TEXTS * 4)] + [{'docno': 'blank', 'text': ' '}]
    settings = dict(sae={'n_latents': 64, 'k': 4, 'batch_size': 16, 'epochs': 2}, cache_dir=tmp_path / 'cache',
                    verbose=False, scale=50.)
    from pyterrier_lsr.index import artifact
    totals = []

    def bar(*args, **kwargs):
        totals.append(kwargs.get('total'))
        return tqdm(*args, **kwargs)
    monkeypatch.setattr(artifact, 'tqdm', bar)
    lt, index, log = build_latent_terms(docs, tmp_path / 'a', mode='single', **settings)
    assert index.num_docs() == len(docs) and log[-1]['l0'] <= 4
    assert totals == [len(docs)]  # the indexing bar knows how many documents come (an ETA on a long build)
    expected = {}
    for vec in lt.encode([d['text'] for d in docs]):
        for term in quantize(vec, 50.):
            expected[term] = expected.get(term, 0) + 1
    assert index.document_frequencies() == expected
    res = index.retriever(num_results=5)(pd.DataFrame({'qid': ['1'], 'query': [TEXTS[2]]}))
    assert set(res['docno'][:4]) == {'d2', 'd7', 'd12', 'd17'}  # the four copies of the query's own text
    # Reopened alone (no model passed), the index reloads its Latent Terms copy and scores with its recorded BM25.
    reopened = LsrIndex(tmp_path / 'a')
    assert reopened.scoring == {'kind': 'bm25', 'k1': lt.k1, 'b': lt.b}
    again = reopened.retriever(num_results=5)(pd.DataFrame({'qid': ['1'], 'query': [TEXTS[2]]}))
    pd.testing.assert_frame_equal(again, res)

    def no_embedding(*args, **kwargs):
        raise AssertionError('embedded again')
    monkeypatch.setattr(LatentTerms, 'embed', no_embedding)
    settings['sae']['k'] = 2
    _, index, log = build_latent_terms(docs, tmp_path / 'b', mode='single', **settings)
    assert log[-1]['l0'] <= 2
    assert len(list((tmp_path / 'cache').glob('*.vectors.npy'))) == 1
    with pytest.raises(ValueError, match='SAE'):
        LatentTerms('all-MiniLM-L6-v2').encode(TEXTS)
    with pytest.raises(ValueError, match='384'):
        LatentTerms('all-MiniLM-L6-v2', SparseAutoencoder(SAEConfig(d_in=16, n_latents=8, k=2)))


@pytest.mark.parametrize('batch_topk', [False, True])
def test_pooling_sums_the_dense_activations_of_each_text(monkeypatch, batch_topk):
    # The term frequencies are each text's sum of its token vectors' activations, whether the SAE's k activations per
    # vector are added as such (TopK, over several products of ENCODE_ROWS rows) or densely (BatchTopK's threshold).
    from pyterrier_lsr.models import features
    from pyterrier_lsr.models import sae as sae_module
    monkeypatch.setattr(sae_module, 'ENCODE_ROWS', 7)
    sae = SparseAutoencoder(SAEConfig(d_in=16, n_latents=64, k=4, batch_topk=batch_topk)).eval()
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.5)
        sae.threshold.fill_(0.3)
    vectors, owner = torch.randn(40, 16), torch.tensor([0] * 9 + [2] * 20 + [3] * 11)
    for sqrt_tf in (False, True):
        tf = features.LatentTermsModel(None, sae, sqrt_tf=sqrt_tf).pool(vectors, owner, 5)
        expected = torch.zeros(5, 64).index_add_(0, owner, sae.encode(vectors))
        assert torch.equal(tf, expected.sqrt() if sqrt_tf else expected)
        assert not tf[[1, 4]].any() and tf[0].count_nonzero() > 4


def test_the_one_call_builder_keeps_the_recipe_s_sae_settings_a_user_does_not_name(tmp_path, monkeypatch):
    from pyterrier_lsr.systems import LATENT_TERMS, builders
    calls = []
    monkeypatch.setattr(builders, 'build_latent_terms', lambda *args, **kwargs: calls.append(kwargs) or (0, 'index'))
    corpus = [{'docno': 'd', 'text': 'nuclear physics'}]
    assert builders.latent_terms_index(tmp_path / 'a.lsr', corpus, sae={'n_latents': 256}) == 'index'
    assert calls[0]['sae'] == {**LATENT_TERMS['sae'], 'n_latents': 256} and calls[0]['sae']['epochs'] == 3
    assert calls[0]['max_train_vectors'] == LATENT_TERMS['max_train_vectors']
    builders.latent_terms_index(tmp_path / 'b.lsr', corpus, max_train_vectors=None)
    assert calls[1]['sae'] == LATENT_TERMS['sae'] and calls[1]['max_train_vectors'] is None
    with pytest.raises(TypeError, match='sae must be a dict'):
        builders.latent_terms_index(tmp_path / 'c.lsr', corpus, sae=16384)
