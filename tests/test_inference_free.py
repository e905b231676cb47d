import pandas as pd
import pytest
import torch
from test_train import examples

from pyterrier_lsr import (
    IDFQueryEncoder,
    InferenceFreeSplade,
    LsrIndex,
    Splade,
    SpladeIndexer,
    StaticQueryEncoder,
    load_model,
)
from pyterrier_lsr.stages.query import StaticQueryWeights
from pyterrier_lsr.train import TrainConfig, batch_loss, flops, train_inference_free


def test_static_query_weights_are_learned(tiny, tmp_path):
    model, tokenizer = tiny
    splade = Splade(model, tokenizer)
    weights = StaticQueryWeights(tokenizer)
    before = weights.weight.detach().clone()
    data = examples(64)
    config = TrainConfig(steps=40, batch_size=16, lr=1e-2, warmup_steps=0, lambda_d=0)

    def total_loss():
        return sum(
            batch_loss(model, tokenizer, data[i : i + 16], config, 0, weights)[1]['loss'] for i in range(0, 64, 16)
        )

    start = total_loss()
    trained = train_inference_free(splade, data, tmp_path, config, weights, verbose=False)
    assert total_loss() < 0.8 * start
    assert not torch.equal(weights.weight.detach(), before)
    assert isinstance(trained.query_side, StaticQueryEncoder)
    vec = trained.query_encoder()(pd.DataFrame({'qid': ['1'], 'query': ['nuclear reactor']}))['query_toks'][0]
    assert set(vec) == {'nuclear', 'reactor'} and vec['nuclear'] == pytest.approx(
        torch.relu(weights.weight)[tokenizer.convert_tokens_to_ids('nuclear')].item()
    )


def test_fixed_idf_side_stays_fixed(tiny, tmp_path):
    model, tokenizer = tiny
    idf = IDFQueryEncoder.from_corpus(tokenizer, [ex.positive for ex in examples(32)])
    weights = StaticQueryWeights(tokenizer, idf.weights)
    before = weights.weight.detach().clone()
    trained = train_inference_free(
        Splade(model, tokenizer),
        examples(32),
        tmp_path,
        TrainConfig(steps=2, batch_size=8),
        weights,
        learn_query_weights=False,
        verbose=False,
    )
    assert torch.equal(weights.weight.detach(), before)
    assert trained.query_encoder().encode(['cat dog'])[0] == pytest.approx(idf.encode(['cat dog'])[0])  # float32 table


def test_model_folder_round_trip_and_index(splade, vaswani_docs, tmp_path):
    idf = IDFQueryEncoder.from_corpus(splade.tokenizer, [d['text'] for d in vaswani_docs[:200]])
    model = InferenceFreeSplade(splade.model, splade.tokenizer, idf)
    model.save_pretrained(str(tmp_path / 'doc-only'))
    again = load_model(str(tmp_path / 'doc-only'))
    assert isinstance(again, InferenceFreeSplade)
    texts = [d['text'] for d in vaswani_docs[:5]]
    assert again.encode(texts) == model.encode(texts)
    queries = ['electron density', 'zzzz qqqq', '']
    assert again.query_encoder().encode(queries) == idf.encode(queries)
    assert again.query_encoder().encode(queries)[2] == {}

    index = SpladeIndexer(tmp_path / 'idx.lsr', again, verbose=False).index(vaswani_docs[:100])
    res = LsrIndex(index.path).retriever()(pd.DataFrame({'qid': ['1', '2'], 'query': ['electron density', 'qqqq']}))
    assert len(res) > 0 and set(res.qid) == {'1'}  # the unknown query retrieves no rows, without error


def test_reads_sentence_transformers_layout(splade, tmp_path):
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sentence_transformer.modules import Router
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SparseStaticEmbedding, SpladePooling

    mlm = MLMTransformer(splade.name)
    weight = torch.rand(mlm.tokenizer.vocab_size, generator=torch.Generator().manual_seed(0))
    router = Router.for_query_document(
        query_modules=[SparseStaticEmbedding(tokenizer=mlm.tokenizer, weight=weight)],
        document_modules=[mlm, SpladePooling('max')],
    )
    SparseEncoder(modules=[router]).save(str(tmp_path / 'st'))
    ours = load_model(str(tmp_path / 'st'))
    assert isinstance(ours, InferenceFreeSplade)
    query = ours.query_encoder().encode(['electron density of the ionosphere'])[0]
    ids = splade.tokenizer('electron density of the ionosphere', add_special_tokens=False)['input_ids']
    assert query == {splade.tokenizer.convert_ids_to_tokens(i): pytest.approx(weight[i].item()) for i in ids}
    assert ours.encode(['nuclear physics']) == splade.encode(['nuclear physics'])


def test_binary_query_side(splade):
    binary = StaticQueryEncoder.binary(splade.tokenizer)
    assert binary.encode(['Nuclear nuclear physics [SEP]']) == [{'nuclear': 1.0, 'physics': 1.0}]


def test_flops_threshold_regularizes_only_long_documents():
    reps = torch.tensor([[1.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    assert flops(reps, min_nnz=1).item() == pytest.approx(
        flops(torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])).item()
    )
    assert flops(reps, min_nnz=3).item() == 0.0
