import math

import pandas as pd
import pyterrier as pt
import pytest
import torch

from pyterrier_lsr import SparseScorer, Splade


def reference_encode(splade: Splade, texts):
    """Plain SPLADE: full logits, log(1 + relu), max over non-padding positions, special tokens dropped."""
    inputs = splade.tokenizer(texts, truncation=True, max_length=splade.max_length, padding=True, return_tensors='pt')
    with torch.no_grad():
        logits = splade.model.mlm(**inputs).logits
    weights = (torch.log1p(torch.relu(logits)) * inputs['attention_mask'][..., None]).amax(dim=1)
    weights[:, splade.tokenizer.all_special_ids] = 0
    return weights


def to_dense(splade: Splade, vecs):
    index = {t: i for i, t in enumerate(splade.terms)}
    out = torch.zeros(len(vecs), len(splade.terms))
    for row, vec in enumerate(vecs):
        for term, weight in vec.items():
            out[row, index[term]] = weight
    return out


def test_pooling_matches_reference(splade, texts):
    ours = to_dense(splade, splade.encode(texts))
    ref = reference_encode(splade, texts)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert (ours > 0).sum(1).min() > 10  # real text activates many terms


def test_chunked_pooling_matches_unchunked():
    from pyterrier_lsr.models import max_pooled_logits

    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(3, 7, 5), torch.randn(11, 5), torch.randn(11)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])
    full = (hidden @ weight.T + bias).masked_fill(~mask.bool()[..., None], float('-inf')).amax(1)
    for chunk in (1, 11, 40, 10**6):
        torch.testing.assert_close(max_pooled_logits(hidden, mask, weight, bias, chunk_elements=chunk), full)


def test_bf16_pooling_matches_unchunked():
    # bf16 on CPU takes positions x vocabulary tiles, the maximum across rows (another layout than fp32's).
    from pyterrier_lsr.models import max_pooled_logits

    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(3, 7, 5), torch.randn(11, 5), torch.randn(11)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])
    h, w = hidden.bfloat16(), weight.bfloat16()
    full = (h.float() @ w.float().T).masked_fill(~mask.bool()[..., None], float('-inf')).amax(1) + bias
    for chunk in (1, 11, 40, 10**6):
        ours = max_pooled_logits(h, mask, w, bias.bfloat16(), chunk_elements=chunk)
        assert ours.dtype == torch.bfloat16
        torch.testing.assert_close(ours.float(), full, atol=0.05, rtol=0.02)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            assert torch.equal(max_pooled_logits(hidden, mask, weight, bias, chunk_elements=chunk), ours)


def test_training_pooling_gradients_match_reference():
    from pyterrier_lsr.models import log_saturation, max_pooled_logits

    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 5, requires_grad=True)
    weight, bias = torch.randn(1100, 5, requires_grad=True), torch.randn(1100, requires_grad=True)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] + [0] * 6])
    coef = torch.randn(3, 1100)

    def grads(pool):
        loss = (log_saturation(pool(hidden, weight, bias)) * coef).sum()
        return torch.autograd.grad(loss, [hidden, weight, bias])

    ours = grads(lambda h, w, b: max_pooled_logits(h, mask, w, b))
    ref = grads(lambda h, w, b: (h @ w.T + b).masked_fill(~mask.bool()[..., None], float('-inf')).amax(1))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)
    assert (ours[0][1, 4:] == 0).all()  # padding positions get no gradient


def test_batch_composition_does_not_change_output(splade, texts):
    alone = to_dense(splade, [splade.encode([t])[0] for t in texts[:6]])
    for batch_size in (2, 5, 32):
        mixed = to_dense(splade, splade.encode(texts, batch_size=batch_size)[:6])
        torch.testing.assert_close(mixed, alone, atol=1e-5, rtol=1e-5)
    shuffled = list(reversed(texts))
    torch.testing.assert_close(
        to_dense(splade, splade.encode(shuffled)[::-1]), to_dense(splade, splade.encode(texts)), atol=1e-5, rtol=1e-5
    )


def test_no_special_tokens_and_positive_weights(splade, texts):
    special = set(splade.tokenizer.all_special_tokens)
    for vec in splade.encode(texts):
        assert not special & vec.keys()
        assert all(w > 0 for w in vec.values())


@pytest.mark.parametrize('blank', [None, float('nan'), '', '   \n'])
def test_blank_text_gives_empty_vector(splade, blank):
    assert splade.encode([blank, 'nuclear physics', blank])[0] == {}
    assert splade.encode([blank])[1 - 1] == {}


def test_long_text_is_truncated_at_max_length(texts):
    from pyterrier_lsr.core.names import resolve_model

    short = Splade.from_pretrained(resolve_model('splade-tiny'), max_length=16)
    long_text = texts[-1]
    assert len(short.tokenizer(long_text)['input_ids']) > 16
    assert short.encode([long_text]) == short.encode([long_text + ' superconductivity in rare earth magnets'])


def test_non_ascii_text(splade):
    vec = splade.encode(['Über die Quantenmechanik: naïve café, 東京'])[0]
    assert vec and all(isinstance(t, str) for t in vec)


def test_bf16_close_to_fp32(texts):
    from pyterrier_lsr.core.names import resolve_model

    path = resolve_model('splade-tiny')
    texts = texts[:10] + texts[-2:]  # without bf16 kernels (most CPUs) bf16 runs ~10x slower: a sample suffices
    fp32 = Splade.from_pretrained(path, device='cpu').encode(texts)
    bf16 = Splade.from_pretrained(path, device='cpu', precision='bf16').encode(texts)
    for a, b in zip(fp32, bf16):
        top = sorted(a, key=a.get, reverse=True)[:10]
        assert len(set(top) & set(b)) >= 9
        assert max(abs(a[t] - b.get(t, 0.0)) for t in top) < 0.1


def test_doc_and_query_encoders(splade):
    docs = pd.DataFrame({'docno': ['d1', 'd2'], 'text': ['nuclear reactor physics', None]})
    out = splade.doc_encoder().transform(docs)
    assert list(out.columns) == ['docno', 'text', 'toks'] and out['toks'][1] == {}
    assert out['toks'][0] == splade.encode(['nuclear reactor physics'])[0]
    queries = pd.DataFrame({'qid': ['1'], 'query': ['NUCLEAR REACTOR']})
    out = splade.query_encoder().transform(queries)
    assert 'query_toks' in out.columns and 'nuclear' in out['query_toks'][0]


@pytest.mark.parametrize(
    'make,inp,out_col',
    [
        (lambda s: s.doc_encoder(), ['docno', 'text'], 'toks'),
        (lambda s: s.query_encoder(), ['qid', 'query'], 'query_toks'),
        (lambda s: s.scorer(), ['qid', 'query', 'docno', 'text'], 'score'),
    ],
)
def test_empty_frames_missing_columns_and_inspect(splade, make, inp, out_col):
    transformer = make(splade)
    out = transformer(pd.DataFrame(columns=inp))
    assert len(out) == 0 and out_col in out.columns
    assert out_col in pt.inspect.transformer_outputs(transformer, inp)
    missing = inp[-1]
    with pytest.raises(pt.validate.InputValidationError, match=missing):
        transformer(pd.DataFrame({c: ['x'] for c in inp if c != missing}))


def test_scorer_is_exact_dot_product(splade, vaswani_docs):
    docs = vaswani_docs[:20]
    frame = pd.DataFrame(
        {
            'qid': '1',
            'query': 'MEASUREMENT OF DIELECTRIC CONSTANT OF LIQUIDS',
            'docno': [d['docno'] for d in docs],
            'text': [d['text'] for d in docs],
        }
    )
    out = splade.scorer()(frame)
    q = splade.encode([frame['query'][0]])[0]
    for (_, row), vec in zip(
        out.sort_values('docno').iterrows(), splade.encode(frame.sort_values('docno')['text'].tolist())
    ):
        expected = sum(w * vec.get(t, 0.0) for t, w in q.items())
        assert math.isclose(row['score'], expected, rel_tol=1e-6, abs_tol=1e-6)
    assert list(out.sort_values('rank')['score']) == sorted(out['score'], reverse=True)
    assert isinstance(splade.scorer(), SparseScorer)
    missing = splade.scorer()(frame.iloc[:2].assign(text=[None, float('nan')]))
    assert list(missing['score']) == [0.0, 0.0]


def test_save_load_round_trip(splade, texts, tmp_path):
    splade.save_pretrained(tmp_path)
    again = Splade.from_pretrained(str(tmp_path), device='cpu')
    assert again.encode(texts[:5]) == splade.encode(texts[:5])
