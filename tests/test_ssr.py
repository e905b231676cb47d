"""Multi-vector encoder, exact MaxSim, the k-means baseline and SSR (models/multivector.py, multivector.py, ssr.py)."""
import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from pyterrier_lsr import LsrIndex, SpladeIndexer, load_model
from pyterrier_lsr.core import storage
from pyterrier_lsr.index.maxsim import MaxSimIndex
from pyterrier_lsr.index.ssr import SSRIndex, token_postings
from pyterrier_lsr.kinds.multivector import MultiVector, maxsim_rows, segment_max
from pyterrier_lsr.kinds.ssr import SSR, pool_codes, token_codes, train_ssr_sae
from pyterrier_lsr.models.multivector import MultiVectorModel, maxsim, maxsim_infonce
from pyterrier_lsr.models.sae import SAEConfig, SparseAutoencoder

SHORT_DOCS = [
    'the nuclear reactor physics', 'electron density in the ionosphere', 'transistor amplifier circuit noise',
    'dielectric constant of liquids', 'radio wave measurement', 'the cat sat on the dog', 'noise in radio circuit',
    'ionosphere electron measurement', 'reactor noise and physics', 'liquids with a dielectric constant',
]


@pytest.fixture
def tiny_mv(tiny):
    """A MultiVector over a tiny random BERT (the conftest vocabulary), 2-d embeddings."""
    from transformers import BertConfig, BertModel
    _, tokenizer = tiny
    torch.manual_seed(0)
    backbone = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    model = MultiVectorModel(backbone, dim=2, skip_ids=[tokenizer.cls_token_id, tokenizer.sep_token_id])
    return MultiVector(model, tokenizer, device='cpu', batch_size=4)


@pytest.fixture(scope='module')
def minilm():
    return MultiVector.from_backbone('all-MiniLM-L6-v2', device='cpu', batch_size=16)


def test_maxsim_hand_computed():
    q = torch.tensor([[[1., 0.], [0., 1.], [1., 0.]]])          # third query token masked
    q_mask = torch.tensor([[True, True, False]])
    d = torch.tensor([[[1., 0.], [.6, .8], [0., 0.]],
                      [[0., 1.], [1., 0.], [0., 0.]],            # second token masked: its 1.0 for q1 must not count
                      [[1., 0.], [0., 1.], [0., 0.]]])           # no scored token at all
    d_mask = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    scores = maxsim(q, q_mask, d, d_mask)
    # doc 0: q1 -> max(1, .6) = 1, q2 -> max(0, .8) = .8; doc 1: q1 -> 0, q2 -> 1; doc 2: 0.
    assert torch.allclose(scores, torch.tensor([[1.8, 1.0, 0.0]]))
    rows = torch.tensor([[1., 0.], [.6, .8], [0., 1.]])
    assert torch.allclose(maxsim_rows(q[0, :2], rows, torch.tensor([2, 1, 0])), torch.tensor([1.8, 1.0, 0.0]))


def test_maxsim_infonce_targets_positive_first():
    q = torch.tensor([[[1., 0.]], [[0., 1.]]])
    d = torch.tensor([[[1., 0.]], [[0., 1.]], [[0., 1.]], [[1., 0.]]])  # query b's positive is doc 2b
    mask_q, mask_d = torch.ones(2, 1, dtype=torch.bool), torch.ones(4, 1, dtype=torch.bool)
    good = maxsim_infonce(q, mask_q, d, mask_d, candidates=2, temperature=.1)
    bad = maxsim_infonce(q, mask_q, d[[1, 0, 3, 2]], mask_d, candidates=2, temperature=.1)
    # positives score 1, each query has one other doc at 1 and two at 0: -log(e^10 / (2 e^10 + 2))
    assert good.item() == pytest.approx(-np.log(np.exp(10) / (2 * np.exp(10) + 2)), rel=1e-4)
    # each positive now scores 0 against two documents at 1: -log(1 / (2 e^10 + 2))
    assert bad.item() == pytest.approx(np.log(2 * np.exp(10) + 2), rel=1e-4)


def test_pool_codes_max_and_sum():
    indices = torch.tensor([[0, 2], [2, 1], [3, 0]])
    values = torch.tensor([[.5, .25], [.75, .0], [1., .125]])
    owner = torch.tensor([0, 0, 1])
    expected_max = torch.tensor([[.5, 0., .75, 0.], [.125, 0., 0., 1.]])
    expected_sum = torch.tensor([[.5, 0., 1., 0.], [.125, 0., 0., 1.]])
    assert torch.equal(pool_codes(indices, values, owner, 2, 4, 'max'), expected_max)
    assert torch.equal(pool_codes(indices, values, owner, 2, 4, 'sum'), expected_sum)
    with pytest.raises(ValueError):
        pool_codes(indices, values, owner, 2, 4, 'mean')


def _hand_sae():
    """2-d inputs, 4 latents reading +x, +y, -x, -y, k = 1: a token's code is its largest signed coordinate."""
    sae = SparseAutoencoder(SAEConfig(d_in=2, n_latents=4, k=1))
    with torch.no_grad():
        sae.W_enc.copy_(torch.tensor([[1., 0., -1., 0.], [0., 1., 0., -1.]]))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def test_ssr_postings_rule(tiny_mv):
    ssr = SSR(tiny_mv, _hand_sae())
    vectors = np.array([[1., 0.], [.6, .8], [.8, .6], [0., -1.]], dtype=np.float32)
    offsets = np.array([0, 3, 3, 4])  # doc 0: three tokens, doc 1: none, doc 2: one
    docs = ssr.encode_vectors(vectors, offsets)
    queries = ssr.encode_vectors(vectors, offsets, query=True)
    # codes: token 0 -> l0 1.0, token 1 -> l1 .8, token 2 -> l0 .8, token 3 -> l3 1.0
    assert docs == [pytest.approx({'l0': 1.0, 'l1': .8}), {}, pytest.approx({'l3': 1.0})]
    assert queries == [pytest.approx({'l0': 1.8, 'l1': .8}), {}, pytest.approx({'l3': 1.0})]
    with pytest.raises(ValueError):
        SSR(tiny_mv, _hand_sae(), doc_pooling='mean')
    with pytest.raises(ValueError):
        SSR(tiny_mv, SparseAutoencoder(SAEConfig(d_in=3, n_latents=4, k=1)))


def test_embed_masks_and_blank_texts(tiny_mv):
    texts = ['the cat sat', None, '  ', 'radio wave noise circuit']
    vectors, offsets = tiny_mv.embed(texts)
    counts = np.diff(offsets).tolist()
    # [CLS]/[SEP] are not scored; blank texts have no rows
    assert counts == [3, 0, 0, 4]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    alone, _ = tiny_mv.embed(['radio wave noise circuit'])
    assert np.allclose(alone, vectors[3:], atol=1e-5)  # independent of the batch's other texts
    empty, offsets = tiny_mv.embed([])
    assert empty.shape == (0, 2) and offsets.tolist() == [0]


def test_multivector_save_load_round_trip(tiny_mv, tmp_path):
    tiny_mv.save_pretrained(tmp_path / 'mv')
    settings = json.loads((tmp_path / 'mv' / 'multivector.json').read_text())
    assert settings['kind'] == 'multivector' and settings['dim'] == 2
    assert (tmp_path / 'mv' / 'projection.safetensors').exists() and (tmp_path / 'mv' / 'config.json').exists()
    assert not list((tmp_path / 'mv').glob('*.bin')) and not list((tmp_path / 'mv').glob('*.pt'))
    loaded = MultiVector.from_pretrained(tmp_path / 'mv', device='cpu')
    texts = ['the cat sat on the dog', 'electron density']
    assert np.allclose(loaded.embed(texts)[0], tiny_mv.embed(texts)[0], atol=1e-6)


def test_train_projection_only(tiny_mv, tmp_path):
    from pyterrier_lsr.train import Example, TrainConfig
    from pyterrier_lsr.train.multivector import train_multivector
    examples = [Example(d.split()[-1], d, [SHORT_DOCS[(i + 5) % len(SHORT_DOCS)]]) for i, d in enumerate(SHORT_DOCS)]
    model = tiny_mv.model
    before_proj = model.projection.weight.detach().clone()
    before_backbone = [p.detach().clone() for p in model.backbone.parameters()]
    log = train_multivector(model, tiny_mv.tokenizer, examples, tmp_path / 'run',
                            TrainConfig(steps=3, batch_size=4, lr=1e-2, warmup_steps=1, log_every=1),
                            train_backbone=False, verbose=False)
    assert [row['step'] for row in log] == [1, 2, 3] and all(np.isfinite(row['loss']) for row in log)
    assert not torch.equal(model.projection.weight, before_proj)
    assert all(torch.equal(p, b) for p, b in zip(model.backbone.parameters(), before_backbone))
    assert all(p.requires_grad for p in model.backbone.parameters())  # restored after training
    assert (tmp_path / 'run' / 'checkpoint-3' / 'projection.safetensors').exists()


def test_train_multivector_refuses_a_length_past_the_tokenizers_before_any_step(tiny_mv, tmp_path):
    from pyterrier_lsr.train import Example, TrainConfig
    from pyterrier_lsr.train.multivector import train_multivector
    tiny_mv.tokenizer.model_max_length = 64
    examples = [Example('cat', d, [SHORT_DOCS[0]]) for d in SHORT_DOCS[1:5]]
    with pytest.raises(ValueError, match=re.escape('max_length must be >= 3 and <= 64, got 256')):
        train_multivector(tiny_mv.model, tiny_mv.tokenizer, examples, tmp_path / 'run',
                          TrainConfig(steps=1, batch_size=4), verbose=False)  # the default max_length: too long
    assert not (tmp_path / 'run').exists()


def test_maxsim_store_retriever_scorer_and_ivf(minilm, tmp_path):
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(SHORT_DOCS)]
    store = MaxSimIndex(tmp_path / 'store', minilm, verbose=False).indexer().index(docs)
    assert store.num_docs() == len(docs) and store.meta['num_tokens'] == store.vectors().shape[0]
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': [SHORT_DOCS[1], SHORT_DOCS[4]]})
    res = store.retriever(num_results=5)(topics)
    assert len(res) == 10 and {'qid', 'query', 'docno', 'score', 'rank'} <= set(res.columns)
    # a short document queried by its own text matches every token exactly: MaxSim = number of its tokens
    top = res[res['rank'] == 0].set_index('qid')
    assert top.loc['1', 'docno'] == 'd1' and top.loc['2', 'docno'] == 'd4'
    q_vectors, q_offsets = minilm.embed([SHORT_DOCS[1]], query=True)
    assert top.loc['1', 'score'] == pytest.approx(q_offsets[-1], abs=1e-3)

    # the stored-vector scorer and the text scorer agree with the retriever's scores
    rescored = store.scorer()(res[['qid', 'query', 'docno']])
    texts = dict(zip([d['docno'] for d in docs], SHORT_DOCS))
    by_text = minilm.scorer()(res[['qid', 'query', 'docno']].assign(text=res['docno'].map(texts)))
    for frame in (rescored, by_text):
        merged = res.merge(frame, on=['qid', 'docno'], suffixes=('', '_2'))
        assert np.allclose(merged['score'], merged['score_2'], atol=2e-3)  # fp16 storage

    # probing every cell and keeping every candidate reproduces exact search
    assert store.build_ivf(n_centroids=4)['n_centroids'] == 4
    ivf = store.ivf_retriever(ncells=4, ndocs=100, num_results=5)(topics)
    assert ivf[['qid', 'docno']].values.tolist() == res[['qid', 'docno']].values.tolist()
    narrow = store.ivf_retriever(ncells=1, ndocs=2, num_results=5)(topics)
    assert narrow.groupby('qid').size().max() <= 2

    empty = store.retriever()(topics.iloc[:0])
    assert len(empty) == 0 and {'docno', 'score', 'rank'} <= set(empty.columns)
    with pytest.raises(FileExistsError):
        MaxSimIndex(tmp_path / 'store', minilm, verbose=False).indexer().index(docs)
    reopened = MaxSimIndex(tmp_path / 'store', minilm)
    assert reopened.docnos == store.docnos


def test_ssr_end_to_end_and_round_trip(minilm, vaswani_docs, tmp_path):
    docs = vaswani_docs[:30]
    vectors, offsets = minilm.embed([d['text'] for d in docs])
    sae, log = train_ssr_sae(vectors, {'n_latents': 256, 'k': 8, 'epochs': 5, 'batch_size': 256}, device='cpu',
                             verbose=False)
    assert log[-1]['l0'] == 8
    ssr = SSR(minilm, sae)
    index = SpladeIndexer(tmp_path / 'ssr.lsr', ssr, verbose=False).index(docs)
    assert index.num_docs() == 30
    doc_toks = ssr.encode([d['text'] for d in docs])
    assert doc_toks == [pytest.approx(t, abs=1e-5) for t in ssr.encode_vectors(vectors, offsets)]
    # documents hold at most k latents per token, pooled by max
    assert all(0 < len(t) <= 8 * (offsets[i + 1] - offsets[i]) for i, t in enumerate(doc_toks))

    topics = pd.DataFrame({'qid': ['1', '2'], 'query': [docs[3]['text'][:80], 'electron density of the ionosphere']})
    res = index.retriever(num_results=10)(topics)
    assert len(res) == 20
    # PISA's scores are the dot products of the quantized query and document vectors
    queries = dict(zip(topics['qid'], ssr.encode_queries(topics['query'].tolist())))
    by_docno = {d['docno']: t for d, t in zip(docs, doc_toks)}
    for row in res.itertuples():
        expected = sum(int(w * 100) * int(by_docno[row.docno].get(t, 0) * 100) for t, w in queries[row.qid].items())
        assert row.score == pytest.approx(expected, abs=1)

    ssr.save_pretrained(tmp_path / 'model')
    assert json.loads((tmp_path / 'model' / 'config.json').read_text())['lsr']['doc_pooling'] == 'max'
    loaded = load_model(tmp_path / 'model', device='cpu')
    assert isinstance(loaded, SSR)
    assert loaded.encode_queries(topics['query'].tolist()) == [pytest.approx(t, abs=1e-5) for t in queries.values()]
    # The index reopened alone reloads its stored copy of the model and retrieves the same.
    assert LsrIndex(index.path).retriever(num_results=10)(topics)[['qid', 'docno']].values.tolist() == \
        res[['qid', 'docno']].values.tolist()


def brute_force(q_codes: torch.Tensor, d_codes: torch.Tensor, offsets) -> np.ndarray:
    """``sum_i max_{t in d} <z_i, z_t>`` from dense codes (tokens x latents), in float64; 0 for an empty document."""
    sims = d_codes.double() @ q_codes.double().T
    return segment_max(sims, torch.as_tensor(np.diff(offsets))).sum(-1).numpy()


def dense_codes(sae: SparseAutoencoder, vectors: np.ndarray) -> torch.Tensor:
    """The SAE's dense codes (tokens x latents) by its dense path, independent of the index's sparse one."""
    with torch.no_grad():
        return sae.encode(torch.from_numpy(vectors))


@pytest.fixture
def random_ssr(tiny):
    """An SSR over a tiny random 8-d encoder and a random (untrained) 32-latent, k = 3 SAE."""
    from transformers import BertConfig, BertModel
    _, tokenizer = tiny
    torch.manual_seed(0)
    backbone = BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    encoder = MultiVector(MultiVectorModel(backbone, dim=8, skip_ids=[tokenizer.cls_token_id]), tokenizer,
                          device='cpu', batch_size=4)
    return SSR(encoder, SparseAutoencoder(SAEConfig(d_in=8, n_latents=32, k=3, seed=1)))


def test_token_postings_keep_token_identity():
    indices = np.array([[2, 0], [0, 1], [2, 1]])
    values = np.array([[.5, .25], [.75, 0.], [1., .125]], dtype=np.float32)
    indptr, tokens, weights = token_postings(indices, values, 4)
    # latent 0: tokens 0 (.25), 1 (.75); latent 1: token 2 (token 1's zero dropped); latent 2: tokens 0, 2; 3: none
    assert indptr.tolist() == [0, 2, 3, 5, 5]
    assert tokens.tolist() == [0, 1, 2, 0, 2]
    assert weights.tolist() == [.25, .75, .125, .5, 1.]
    empty = token_postings(np.zeros((0, 2), np.int64), np.zeros((0, 2), np.float32), 4)
    assert empty[0].tolist() == [0] * 5 and len(empty[1]) == len(empty[2]) == 0
    with pytest.raises(ValueError, match=r'latent ids in \[0, 4\)'):
        token_postings(indices + 2, values, 4)
    with pytest.raises(ValueError, match='one shape'):
        token_postings(indices, values[:, :1], 4)


def test_token_scores_equal_brute_force_on_random_codes(random_ssr, tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((60, 8)).astype(np.float32)
    offsets = np.array([0, 7, 7, 20, 21, 45, 45, 60])  # two empty documents, one of a single token
    index = SSRIndex.write(tmp_path / 'ssr', [f'd{i}' for i in range(7)], vectors, offsets, random_ssr,
                           save_model=False)
    d_codes = dense_codes(random_ssr.sae, vectors)
    assert (d_codes > 0).sum(1).max() == 3
    queries = rng.standard_normal((12, 8)).astype(np.float32)
    for q in (queries[:1], queries[1:5], queries[5:]):
        expected = brute_force(dense_codes(random_ssr.sae, q), d_codes, offsets)
        assert expected[[1, 5]].tolist() == [0, 0] and expected.max() > 0
        assert np.allclose(index.score_tokens(*random_ssr.token_codes(q)), expected, rtol=1e-5, atol=1e-6)
        # pooled: documents max-pooled, queries summed per latent (the model's pooling) -- a different score
        pooled = segment_max(d_codes, torch.as_tensor(np.diff(offsets))).double().numpy() @ \
            dense_codes(random_ssr.sae, q).sum(0).double().numpy()
        assert np.allclose(index.score_pooled(*random_ssr.token_codes(q)), pooled, rtol=1e-5, atol=1e-6)
    # the search ranks every positive-scoring document, best first, and keeps at most num_results
    (docs, scores), = index.search_embeddings(queries[1:5], np.array([0, 4]), num_results=3, query='codes')
    expected = brute_force(dense_codes(random_ssr.sae, queries[1:5]), d_codes, offsets)
    assert docs.tolist() == np.argsort(-expected, kind='stable')[:3].tolist()
    assert np.allclose(scores, np.sort(expected)[::-1][:3], rtol=1e-5)


def decoder_weights(sae: SparseAutoencoder, vectors: np.ndarray, m: int) -> torch.Tensor:
    """Dense query weights of ``query='decoder'`` in float64: ``relu(<e_i, D_a>)`` on each row's top ``m`` latents."""
    weights = torch.from_numpy(vectors).double() @ sae.W_dec.detach().double().T
    top = weights.topk(m, dim=-1).indices
    return torch.zeros_like(weights).scatter_(1, top, weights.gather(1, top)).relu()


def test_decoder_query_side_equals_brute_force(random_ssr, tmp_path):
    with torch.no_grad():  # untie the encoder from the decoder (a new SAE's W_enc is W_dec^T: codes = the weights)
        random_ssr.sae.W_enc.add_(torch.randn_like(random_ssr.sae.W_enc))
        random_ssr.sae.b_dec.add_(.5)
    rng = np.random.default_rng(2)
    vectors = rng.standard_normal((50, 8)).astype(np.float32)
    offsets = np.array([0, 9, 9, 30, 31, 50])
    index = SSRIndex.write(tmp_path / 'ssr', [f'd{i}' for i in range(5)], vectors, offsets, random_ssr,
                           save_model=False)
    d_codes = dense_codes(random_ssr.sae, vectors)
    queries = rng.standard_normal((6, 8)).astype(np.float32)
    for m in (1, 3, 32):  # 32: every latent, so every document token with a code is reached
        indices, values = random_ssr.query_codes(queries, 'decoder', m)
        assert indices.shape == (6, m) and (values >= 0).all()
        expected = brute_force(decoder_weights(random_ssr.sae, queries, m), d_codes, offsets)
        assert expected[1] == 0 and expected.max() > 0
        assert np.allclose(index.score_tokens(indices, values), expected, rtol=1e-5, atol=1e-6)
    # the default m is twice the SAE's k; the decoder's weights are not the codes' (a different, asymmetric score)
    default = random_ssr.query_codes(queries)
    assert default[0].shape == (6, 6)
    assert not np.allclose(index.score_tokens(*default), index.score_tokens(*random_ssr.token_codes(queries)))
    # query='decoder': the default
    (docs, scores), = index.search_embeddings(queries, np.array([0, 6]), 3, query_latents=32)
    expected = brute_force(decoder_weights(random_ssr.sae, queries, 32), d_codes, offsets)
    assert docs.tolist() == np.argsort(-expected, kind='stable')[:3].tolist()
    assert np.allclose(scores, np.sort(expected)[::-1][:3], rtol=1e-5)


def test_token_codes_keep_the_latents_and_values_of_encode_topk(random_ssr):
    vectors = np.random.default_rng(5).standard_normal((2500, 8)).astype(np.float32)  # several products of 1,024
    for k in (3, 12, 32):
        indices, values = token_codes(random_ssr.sae, vectors, k)
        with torch.no_grad():
            expected_i, expected_v = (t.numpy() for t in random_ssr.sae.encode_topk(torch.from_numpy(vectors), k))
        assert indices.shape == values.shape == (2500, k) and (values > 0).sum() == (expected_v > 0).sum() > 0
        for row in range(len(vectors)):  # the same latents; values to rounding (two products of one formula)
            got = {i: v for i, v in zip(indices[row], values[row]) if v > 0}
            want = {i: v for i, v in zip(expected_i[row], expected_v[row]) if v > 0}
            assert sorted(got) == sorted(want)
            assert np.allclose([got[i] for i in sorted(got)], [want[i] for i in sorted(want)], rtol=1e-6, atol=1e-7)


def test_doc_k_indexes_more_latents_per_document_token_and_round_trips(random_ssr, tmp_path):
    with torch.no_grad():  # untie the encoder from the decoder, so codes differ from the query's decoder weights
        random_ssr.sae.W_enc.add_(torch.randn_like(random_ssr.sae.W_enc))
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((40, 8)).astype(np.float32)
    offsets = np.array([0, 12, 12, 25, 40])
    docnos = [f'd{i}' for i in range(4)]
    wide = SSR(random_ssr.encoder, random_ssr.sae, doc_k=7, name='wide')
    index = SSRIndex.write(tmp_path / 'ssr', docnos, vectors, offsets, wide)
    with torch.no_grad():  # the top 7 pre-activations of each token, relu'd, by the SAE's dense path
        pre = wide.sae.pre_activations(torch.from_numpy(vectors))
        top = pre.topk(7, dim=-1)
        d_codes = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    per_token = np.bincount(index.tokens, minlength=len(vectors))
    assert per_token.tolist() == (d_codes > 0).sum(1).tolist() and per_token.max() == 7
    assert index.meta['k'] == 3 and index.meta['doc_k'] == 7
    queries = rng.standard_normal((5, 8)).astype(np.float32)
    indices, values = wide.query_codes(queries, 'codes')  # the query side keeps the SAE's k
    assert indices.shape == (5, 3)
    assert np.allclose(index.score_tokens(*wide.query_codes(queries, 'decoder', 32)),
                       brute_force(decoder_weights(wide.sae, queries, 32), d_codes, offsets), rtol=1e-5, atol=1e-6)
    # the default is the SAE's k
    narrow = SSRIndex.write(tmp_path / 'narrow', docnos, vectors, offsets, random_ssr)
    assert np.bincount(narrow.tokens).max() == 3 and narrow.meta['doc_k'] == 3
    # doc_k is a setting of the model: it survives the saved folder, the index's copy and load_model
    assert SSRIndex(tmp_path / 'ssr').model().doc_k == 7
    wide.save_pretrained(tmp_path / 'model')
    assert SSR.from_pretrained(tmp_path / 'model').doc_k == 7 and load_model(tmp_path / 'model').doc_k == 7
    assert 'doc_k=7' in repr(wide)
    random_ssr.save_pretrained(tmp_path / 'default')
    assert SSR.from_pretrained(tmp_path / 'default').doc_k is None
    for bad, error in [(0, ValueError), (33, ValueError), (2.5, TypeError), ('8', TypeError)]:
        with pytest.raises(error, match='doc_k'):
            SSR(random_ssr.encoder, random_ssr.sae, doc_k=bad)


def test_decoder_query_side_retriever_reranked_and_checks(random_ssr, tmp_path):
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate(SHORT_DOCS)]
    index = SSRIndex(tmp_path / 'ssr', random_ssr, verbose=False).indexer().index(docs)
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': ['reactor physics noise', 'electron density']})
    res = index.retriever(num_results=4, query='decoder', query_latents=8)(topics)
    q_vectors, q_offsets = random_ssr.encoder.embed(topics['query'].tolist(), query=True)
    vectors, offsets = random_ssr.encoder.embed(SHORT_DOCS)
    d_codes = dense_codes(random_ssr.sae, vectors)
    for i, (qid, ranking) in enumerate(res.groupby('qid', sort=True)):
        q = q_vectors[q_offsets[i]:q_offsets[i + 1]]
        expected = brute_force(decoder_weights(random_ssr.sae, q, 8), d_codes, offsets)
        order = np.argsort(-expected, kind='stable')[:len(ranking)]
        assert ranking['docno'].tolist() == [f'd{j}' for j in order]
        assert np.allclose(ranking['score'], expected[order], rtol=1e-5)
    store = MaxSimIndex.write(tmp_path / 'store', [d['docno'] for d in docs], vectors, offsets, random_ssr.encoder)
    reranked = random_ssr.reranked(index, store, depth=4, query='decoder', query_latents=8)(topics)
    for qid, ranking in reranked.groupby('qid'):
        assert set(ranking['docno']) == set(res[res['qid'] == qid]['docno'])
    # defaults: the decoder's weights with m = 2k = 6 for mode='tokens', the codes for 'pooled'
    assert index.retriever(num_results=4)(topics).equals(index.retriever(4, query='decoder', query_latents=6)(topics))
    assert index.retriever(4, mode='pooled')(topics).equals(index.retriever(4, mode='pooled', query='codes')(topics))
    for kwargs, message in [({'query': 'exact'}, 'query'), ({'query': 'decoder', 'query_latents': 0}, 'query_latents'),
                            ({'query_latents': 33}, 'query_latents'),
                            ({'query': 'codes', 'query_latents': 4}, "query='decoder' only"),
                            ({'query': 'decoder', 'mode': 'pooled'}, "needs mode='tokens'")]:
        with pytest.raises(ValueError, match=message):
            index.retriever(**kwargs)
        with pytest.raises(ValueError, match=message):
            random_ssr.reranked(index, store, **kwargs)
    with pytest.raises(TypeError, match='query_latents'):
        index.retriever(query='decoder', query_latents=2.5)


def rerecord(folder):
    """The marker's file records rewritten to match the files now in ``folder``."""
    marker = storage.read_marker(folder)
    storage.mark(folder, marker['artifact'], build=marker['build'], files=storage.record_files(folder))


def test_token_index_bad_parameters_and_files(random_ssr, tmp_path):
    vectors = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    with pytest.raises(ValueError, match='offsets'):
        SSRIndex.write(tmp_path / 'bad', ['a', 'b'], vectors, np.array([0, 2, 5]), random_ssr)
    with pytest.raises(ValueError, match='duplicate|a'):
        SSRIndex.write(tmp_path / 'bad', ['a', 'a'], vectors, np.array([0, 2, 6]), random_ssr)
    index = SSRIndex.write(tmp_path / 'ssr', ['a', 'b'], vectors, np.array([0, 2, 6]), random_ssr)
    with pytest.raises(ValueError, match='num_results'):
        index.retriever(num_results=0)
    with pytest.raises(TypeError, match='num_results'):
        index.retriever(num_results=2.5)
    with pytest.raises(ValueError, match='mode'):
        index.retriever(mode='max')
    store = MaxSimIndex.write(tmp_path / 'store', ['a', 'b'], vectors, np.array([0, 2, 6]))
    with pytest.raises(ValueError, match='depth'):
        random_ssr.reranked(index, store, depth=0)
    with pytest.raises(ValueError, match='mode'):
        random_ssr.reranked(index, store, mode='dense')
    with pytest.raises(FileExistsError):
        SSRIndex.write(tmp_path / 'ssr', ['a', 'b'], vectors, np.array([0, 2, 6]), random_ssr)
    other = SSR(random_ssr.encoder, SparseAutoencoder(SAEConfig(d_in=8, n_latents=64, k=3)))
    with pytest.raises(ValueError, match='32 latents'):
        SSRIndex(tmp_path / 'ssr', other).retriever()
    with pytest.raises(ValueError, match='finite'):
        SSRIndex.write(tmp_path / 'nan', ['a'], np.full((2, 8), np.nan, np.float32), np.array([0, 2]), random_ssr)
    with pytest.raises(FileNotFoundError, match='no SSR index'):
        SSRIndex(tmp_path / 'store').num_docs()
    # the compiled kernel reads memory at the latent ids it is given: they are checked first
    codes = random_ssr.token_codes(vectors[:2])
    for bad in (codes[0] + 32, -codes[0] - 1):
        with pytest.raises(ValueError, match=r'latent ids in \[0, 32\)'):
            index.score_tokens(bad, codes[1])
    with pytest.raises(ValueError, match='one shape'):
        index.score_tokens(codes[0][:, :2], codes[1])
    with pytest.raises(ValueError, match='integer'):
        index.score_tokens(codes[0].astype(float), codes[1])
    tokens = index.tokens.copy()
    np.save(tmp_path / 'ssr' / 'postings-tokens.npy', tokens.astype(np.float32))
    rerecord(tmp_path / 'ssr')
    with pytest.raises(ValueError, match='types int64 / float32 / float32; rebuild'):
        SSRIndex(tmp_path / 'ssr').num_docs()
    np.save(tmp_path / 'ssr' / 'postings-tokens.npy', np.full(len(tokens), 99, dtype=np.int32))
    with pytest.raises(ValueError, match='postings-tokens.npy .content differs'):
        SSRIndex(tmp_path / 'ssr').num_docs()
    # records rewritten to match: the layout check behind the digests still refuses the postings
    rerecord(tmp_path / 'ssr')
    with pytest.raises(ValueError, match='outside the corpus'):
        SSRIndex(tmp_path / 'ssr').num_docs()


def test_token_level_ssr_on_a_tiny_corpus_and_reranked(minilm, vaswani_docs, tmp_path):
    docs = vaswani_docs[:30]
    vectors, offsets = minilm.embed([d['text'] for d in docs])
    sae, _ = train_ssr_sae(vectors, {'n_latents': 256, 'k': 8, 'epochs': 3, 'batch_size': 256}, device='cpu',
                           verbose=False)
    ssr = SSR(minilm, sae, query_pooling='max')
    index = SSRIndex(tmp_path / 'ssr', ssr, verbose=False).indexer().index(docs)
    topics = pd.DataFrame({'qid': ['1', '2', '3'],
                           'query': [docs[3]['text'][:80], 'electron density of the ionosphere', 'radio waves']})
    res = index.retriever(num_results=10, query='codes')(topics)
    assert list(res.columns) == ['qid', 'query', 'docno', 'score', 'rank']
    assert res.groupby('query', sort=False).size().tolist() == [10, 10, 10]
    assert res['rank'].tolist() == list(range(10)) * 3
    d_codes = dense_codes(sae, vectors)
    q_vectors, q_offsets = minilm.embed(topics['query'].tolist(), query=True)
    for i, (query, ranking) in enumerate(res.groupby('query', sort=False)):
        q_codes = dense_codes(sae, q_vectors[q_offsets[i]:q_offsets[i + 1]])
        expected = brute_force(q_codes, d_codes, offsets)
        order = np.argsort(-expected, kind='stable')[:10]
        assert ranking['docno'].tolist() == [docs[j]['docno'] for j in order]
        assert np.allclose(ranking['score'], expected[order], rtol=1e-5)
    assert res.iloc[0]['docno'] == docs[3]['docno']  # a document's own text finds it

    pooled = index.retriever(num_results=5, mode='pooled')(topics.iloc[:1])
    doc_toks = dict(zip([d['docno'] for d in docs], ssr.encode_vectors(vectors, offsets)))
    (query_toks,) = ssr.encode_vectors(q_vectors[:q_offsets[1]], q_offsets[:2], query=True)
    for row in pooled.itertuples():
        assert row.score == pytest.approx(sum(w * doc_toks[row.docno].get(t, 0) for t, w in query_toks.items()),
                                          rel=1e-5)

    store = MaxSimIndex.write(tmp_path / 'store', [d['docno'] for d in docs], vectors, offsets, minilm)
    reranked = ssr.reranked(index, store, depth=5, query='codes')(topics)
    assert reranked.groupby('query', sort=False).size().tolist() == [5, 5, 5]
    for i, (query, ranking) in enumerate(reranked.groupby('query', sort=False)):
        first = res[res['query'] == query]
        assert set(ranking['docno']) == set(first[first['rank'] < 5]['docno'])
        q = torch.from_numpy(q_vectors[q_offsets[i]:q_offsets[i + 1]])
        exact = store.score_docs(q, np.array([store.docids[d] for d in ranking['docno']])).numpy()
        assert np.allclose(ranking['score'], exact, atol=1e-4)
        assert ranking['rank'].tolist() == list(range(5)) and (np.diff(ranking['score']) <= 0).all()

    empty = index.retriever()(topics.iloc[:0])
    assert list(empty.columns) == ['qid', 'query', 'docno', 'score', 'rank'] and not len(empty)
    assert list(ssr.reranked(index, store)(topics.iloc[:0]).columns) == ['qid', 'query', 'docno', 'score', 'rank']
    # the index reopened alone reloads its stored model and retrieves the same
    again = SSRIndex(index.path).retriever(num_results=10, query='codes')(topics)
    assert again[['qid', 'docno']].values.tolist() == res[['qid', 'docno']].values.tolist()


@pytest.mark.parametrize('kind', ['store', 'ssr'])
def test_token_stores_notice_edited_swapped_and_shortened_files(kind, random_ssr, tmp_path, monkeypatch):
    """Both token stores record every file's size and digest: a same-size edit of a small file, another store's file
    swapped in, or a shortened array is an error naming the file on open, not a silently wrong ranking; a same-size
    edit of a large file is left to verify()."""
    vectors = np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)
    def write(path, docnos, vecs):
        if kind == 'store':
            return MaxSimIndex.write(path, docnos, vecs, np.array([0, 2, 6]), random_ssr.encoder)
        return SSRIndex.write(path, docnos, vecs, np.array([0, 2, 6]), random_ssr)
    def reopen(path):
        store = MaxSimIndex(path, random_ssr.encoder) if kind == 'store' else SSRIndex(path)
        store.num_docs()  # opened
        return store
    a, b = write(tmp_path / 'a', ['a', 'b'], vectors), write(tmp_path / 'b', ['a', 'b'], vectors[::-1].copy())
    array = 'vectors.npy' if kind == 'store' else 'postings-values.npy'
    edits = {
        'docnos.json': lambda path: (path / 'docnos.json').write_text('["b","a"]'),  # same size, docnos swapped
        a.meta_file: lambda path: (path / a.meta_file).write_text(
            (path / a.meta_file).read_text().replace('"num_docs": 2', '"num_docs": 3')),
        array: lambda path: shutil.copyfile(b.path / array, path / array),  # another store's file of the same size
    }
    for name, edit in edits.items():
        shutil.rmtree(tmp_path / 'c', ignore_errors=True)
        shutil.copytree(a.path, tmp_path / 'c')
        edit(tmp_path / 'c')
        with pytest.raises(ValueError, match=f'^the {a.label} at .* is damaged: {re.escape(name)} '
                                             '\\((content differs|[0-9]+ bytes)'):
            reopen(tmp_path / 'c')
    with open(tmp_path / 'c' / 'docnos.json', 'w') as f:  # shortened
        f.write('["a"]')
    with pytest.raises(ValueError, match='docnos.json'):
        reopen(tmp_path / 'c')
    assert reopen(a.path).verify() is not None
    monkeypatch.setattr(storage, 'CHEAP_DIGEST_BYTES', 0)  # every file "large": opening checks sizes only
    edits[array](tmp_path / 'c')
    shutil.copyfile(a.path / 'docnos.json', tmp_path / 'c' / 'docnos.json')
    with pytest.raises(ValueError, match=f'{re.escape(array)} .content differs'):
        reopen(tmp_path / 'c').verify()


def test_the_k_means_cells_are_recorded_and_checked_like_the_store(random_ssr, tmp_path, monkeypatch):
    """An edited centroid or assignment file, or cells copied from another store, is an error naming it when the
    k-means baseline opens (or, for a same-size edit of a large file, on verify()), not a silently other ranking."""
    rng = np.random.default_rng(1)
    stores = [MaxSimIndex.write(tmp_path / name, ['a', 'b', 'c'], rng.standard_normal((12, 8)).astype(np.float32),
                                np.array([0, 4, 8, 12]), random_ssr.encoder) for name in ('a', 'b')]
    for store in stores:
        store.build_ivf(n_centroids=2)
    topics = pd.DataFrame({'qid': ['1'], 'query': ['nuclear reactor']})
    a, cells = stores[0], stores[0].path / 'ivf'
    expected = a.ivf_retriever(ncells=2, num_results=3)(topics)
    assert a.verify() is a
    original = {name: (cells / name).read_bytes() for name in ('centroids.npy', 'codes.npy')}

    def edited(name):
        codes = np.load(cells / 'codes.npy')
        return {'centroids.npy': lambda: np.load(cells / name) * 2,
                'codes.npy': lambda: np.where(codes == 0, 1, 0).astype(codes.dtype)}[name]()
    for name in original:
        storage.write_array(cells / name, edited(name))  # same shape, same size, other cells
        # named as the cells, with their remedy (the message said "the index" for every store)
        damaged = f'^the k-means cell folder at {re.escape(str(cells))} is damaged: {re.escape(name)} ' \
            '\\(content differs.*; rebuild it with build_ivf'
        with pytest.raises(ValueError, match=damaged):
            MaxSimIndex(a.path, random_ssr.encoder).ivf_retriever()
        with monkeypatch.context() as large:  # every file "large": opening checks sizes, verify() the digests
            large.setattr(storage, 'CHEAP_DIGEST_BYTES', 0)
            MaxSimIndex(a.path, random_ssr.encoder).ivf_retriever()
            with pytest.raises(ValueError, match=damaged):
                MaxSimIndex(a.path, random_ssr.encoder).verify()
        (cells / name).write_bytes(original[name])
    shutil.rmtree(cells)
    shutil.copytree(stores[1].path / 'ivf', cells)  # another store's cells, marker and all
    with pytest.raises(ValueError, match='built for other vectors'):
        MaxSimIndex(a.path, random_ssr.encoder).ivf_retriever()
    a.build_ivf(n_centroids=2)
    pd.testing.assert_frame_equal(MaxSimIndex(a.path, random_ssr.encoder).ivf_retriever(ncells=2, num_results=3)(
        topics), expected)


@pytest.mark.parametrize('vectors, kwargs, error, match', [
    (np.full((10, 8), np.nan, np.float32), {}, ValueError, 'finite'),
    (np.zeros(10, np.float32), {}, ValueError, '2-d'),
    (np.zeros((0, 8), np.float32), {}, ValueError, 'no rows'),
    (None, {'max_train_vectors': 0}, ValueError, 'max_train_vectors must be >= 1'),
    (None, {'max_train_vectors': -5}, ValueError, 'max_train_vectors must be >= 1'),
    (None, {'max_train_vectors': 1.5}, TypeError, 'max_train_vectors must be an integer'),
    (None, {'sae': [1]}, TypeError, 'sae must be a dict'),
])
def test_train_ssr_sae_checks_its_inputs_before_training(vectors, kwargs, error, match):
    if vectors is None:
        vectors = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    with pytest.raises(error, match=match):
        train_ssr_sae(vectors, verbose=False, **kwargs)
