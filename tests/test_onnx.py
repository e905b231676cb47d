"""ONNX export with the pooling inside, and the onnxruntime backend: the graph's weights are torch's, for texts
over the truncation length, queries and documents, at any batch size and length; the folder says what the graph
computes; the inputs and output are the documented ones; bad folders and arguments are refused by name.

On the offline SPLADE-tiny checkpoint (a BERT masked LM with ``token_type_ids``)."""
import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from pyterrier_lsr import AsymmetricSplade, InferenceFreeSplade, SaeSplade, Splade, SpladeIndexer, load_model
from pyterrier_lsr.core.model_files import ModelLoadError
from pyterrier_lsr.core.onnx_runtime import CONFIG_FILE, ONNX_FILE, OnnxSparseModule, import_onnxruntime

TOLERANCE = 1e-4


@pytest.fixture(scope='module')
def exported(splade, tmp_path_factory):
    return splade.export_onnx(tmp_path_factory.mktemp('onnx') / 'splade-tiny.onnx')


@pytest.fixture(scope='module')
def onnx_splade(exported):
    return Splade.from_pretrained(exported, backend='onnx', batch_size=8)


@pytest.fixture(scope='module')
def queries(vaswani):
    return vaswani.get_topics()['query'].tolist()[:30]


@pytest.fixture(scope='module')
def long_texts(vaswani_docs):
    """Documents far over 256 tokens (truncated alike by both backends), one per batch size of interest."""
    return [' '.join(d['text'] for d in vaswani_docs[i:i + 10]) for i in range(0, 60, 10)]


def assert_same_vectors(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.keys() == w.keys(), f'text {i}: terms differ ({sorted(g.keys() ^ w.keys())[:5]})'
        diff = max((abs(g[t] - w[t]) for t in w), default=0.0)
        assert diff <= TOLERANCE, f'text {i}: max |diff| {diff}'


def session_of(folder):
    ort = import_onnxruntime()
    return ort.InferenceSession(str(folder / ONNX_FILE), providers=['CPUExecutionProvider'])


def test_the_onnx_backend_gives_torchs_document_and_query_vectors(splade, onnx_splade, texts, long_texts, queries):
    assert isinstance(onnx_splade.model, OnnxSparseModule)
    assert max(len(splade.tokenizer(t)['input_ids']) for t in long_texts) > 2 * splade.max_length
    docs = texts + long_texts + ['', '   ', None]
    assert_same_vectors(onnx_splade.encode_docs(docs), splade.encode_docs(docs))
    assert_same_vectors(onnx_splade.encode_queries(queries), splade.encode_queries(queries))
    # the same through the PyTerrier transformers
    topics = pd.DataFrame({'qid': ['1', '2'], 'query': queries[:2]})
    frame = onnx_splade.query_encoder()(splade.query_encoder()(topics).rename(columns={'query_toks': 'torch_toks'}))
    assert_same_vectors(frame['query_toks'].tolist(), frame['torch_toks'].tolist())


def test_the_folder_records_what_the_graph_computes(exported, splade):
    config = json.loads((exported / CONFIG_FILE).read_text())
    assert [i['name'] for i in config['inputs']] == ['input_ids', 'attention_mask', 'token_type_ids']
    assert all(i['dtype'] == 'int64' and i['shape'] == ['batch', 'length'] for i in config['inputs'])
    assert config['outputs'] == [{'name': 'weights', 'dtype': 'float32', 'shape': ['batch', 'vocabulary']}]
    assert config['vocab_size'] == splade.model.vocab_size == 30522
    assert (config['pooling'], config['activation'], config['head_scale']) == ('max', 'log(1 + relu(x))', 1.0)
    assert 'attention_mask' in config['computation'] and 'special tokens' in config['computation']
    assert config['special_token_ids'] == sorted(splade.tokenizer.all_special_ids)
    assert (config['max_length'], config['opset'], config['precision']) == (256, 17, 'fp32')
    assert config['quantization'] is None and config['encodes'] == 'documents and queries'
    assert config['source']['kind'] == 'splade' and config['source']['model'] == splade.name
    assert config['source']['architecture'] == 'BertForMaskedLM'
    assert config['exporter']['torch'] == torch.__version__
    assert {'tokenizer.json', ONNX_FILE, CONFIG_FILE} <= {p.name for p in exported.iterdir()}


def test_the_graphs_inputs_and_output_are_the_documented_ones(exported, splade, long_texts):
    """What a consumer (OpenSearch, Vespa, FastEmbed) sees: int64 inputs of dynamic batch and length, the tokenizer's
    own outputs fed as they are, one float output of batch x vocabulary weights."""
    import onnx
    graph = onnx.load(str(exported / ONNX_FILE)).graph
    inputs = {i.name: i.type.tensor_type for i in graph.input}
    assert list(inputs) == ['input_ids', 'attention_mask', 'token_type_ids']
    for tensor in inputs.values():
        assert tensor.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in tensor.shape.dim] == ['batch', 'length']
    (output,) = graph.output
    assert output.name == 'weights' and output.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ['batch', 30522]
    batch = splade.tokenizer(long_texts[:3] + ['radio waves'], padding=True, truncation=True, max_length=256,
                             return_tensors='np')
    (weights,) = session_of(exported).run(None, {k: batch[k].astype(np.int64) for k in inputs})
    with torch.inference_mode():
        want = splade.model(torch.from_numpy(batch['input_ids']), torch.from_numpy(batch['attention_mask']))
    assert weights.shape == (4, 30522) and np.abs(weights - want.numpy()).max() <= TOLERANCE
    assert (weights[:, splade.tokenizer.all_special_ids] == 0).all() and (weights >= 0).all()


@pytest.mark.parametrize('batch_size,max_length', [(1, 3), (3, 40), (17, 256), (5, 512)])
def test_any_batch_size_and_length_give_each_texts_own_vector(exported, splade, texts, long_texts, batch_size,
                                                              max_length):
    """A text's weights do not depend on the batch it is padded into, nor on the lengths the graph was traced at."""
    session = session_of(exported)
    chosen = (long_texts + texts)[:batch_size]
    batch = splade.tokenizer(chosen, padding=True, truncation=True, max_length=max_length, return_tensors='np')
    feeds = {k: batch[k].astype(np.int64) for k in ('input_ids', 'attention_mask', 'token_type_ids')}
    (weights,) = session.run(None, feeds)
    assert weights.shape == (len(chosen), 30522)
    for row, text in zip(weights, chosen):
        alone = splade.tokenizer([text], truncation=True, max_length=max_length, return_tensors='np')
        (own,) = session.run(None, {k: alone[k].astype(np.int64) for k in feeds})
        assert np.abs(row - own[0]).max() <= TOLERANCE
        with torch.inference_mode():
            want = splade.model(torch.from_numpy(alone['input_ids']), torch.from_numpy(alone['attention_mask']))
        assert np.abs(own[0] - want[0].numpy()).max() <= TOLERANCE


def test_load_model_and_the_backend_switch(exported, splade, tmp_path, texts):
    model = load_model(exported)
    assert isinstance(model, Splade) and isinstance(model.model, OnnxSparseModule)
    assert (model.max_length, model.precision, model.device.type) == (256, 'fp32', 'cpu')
    assert isinstance(Splade.from_pretrained(exported).model, OnnxSparseModule)  # the folder says its backend
    assert isinstance(load_model(exported, backend='onnx').model, OnnxSparseModule)
    assert Splade.from_pretrained(exported, max_length=64).max_length == 64
    with pytest.raises(ModelLoadError, match="backend='onnx'"):
        Splade.from_pretrained(exported, backend='torch')
    torch_folder = splade.save_pretrained(tmp_path / 'torch')
    with pytest.raises(ModelLoadError, match=r'export_onnx'):
        Splade.from_pretrained(torch_folder, backend='onnx')
    assert not isinstance(Splade.from_pretrained(torch_folder, backend='torch').model, OnnxSparseModule)
    with pytest.raises(ValueError, match=r"backend must be one of \['torch', 'onnx'\].*'tensorrt'"):
        Splade.from_pretrained(exported, backend='tensorrt')
    with pytest.raises(ValueError, match=r"precision: .*export_onnx\(folder, precision='int8'\)"):
        Splade.from_pretrained(exported, precision='int8')
    with pytest.raises(ValueError, match='device: the ONNX backend runs on the CPU'):
        Splade.from_pretrained(exported, device='cuda')


def test_an_onnx_model_indexes_and_saves_as_itself(onnx_splade, splade, tmp_path, texts):
    index = SpladeIndexer(tmp_path / 'index.lsr', model=onnx_splade, verbose=False).index(
        [{'docno': str(i), 'text': t} for i, t in enumerate(texts)])
    stored = index.model()
    assert isinstance(stored.model, OnnxSparseModule)
    assert_same_vectors(stored.encode_docs(texts[:6]), splade.encode_docs(texts[:6]))
    saved = onnx_splade.save_pretrained(tmp_path / 'copy')
    assert_same_vectors(load_model(saved).encode_docs(texts[:6]), splade.encode_docs(texts[:6]))


def test_bad_folders_are_refused_naming_the_file(exported, tmp_path):
    import shutil

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(exported, folder)
        return folder

    damaged = copy('damaged')
    (damaged / ONNX_FILE).write_bytes(b'not a graph')
    with pytest.raises(ModelLoadError, match=r'model\.onnx does not load'):
        load_model(damaged)
    missing = copy('missing')
    (missing / ONNX_FILE).unlink()
    with pytest.raises(ModelLoadError, match=r'model\.onnx does not load'):
        Splade.from_pretrained(missing, backend='onnx')
    for key, value, message in [('format', 'other', 'format must be'), ('vocab_size', -1, 'vocab_size must be'),
                                ('precision', 'fp8', 'precision must be'),
                                ('inputs', [{'name': 'ids'}], 'inputs must name'),
                                ('outputs', [{'name': 'logits'}], "outputs must be \\['weights'\\]")]:
        folder = copy(f'bad-{key}')
        config = json.loads((folder / CONFIG_FILE).read_text())
        config[key] = value
        (folder / CONFIG_FILE).write_text(json.dumps(config))
        with pytest.raises(ModelLoadError, match=f'{CONFIG_FILE}: {message}'):
            Splade.from_pretrained(folder)
    # a configuration of another export (inputs the graph does not take)
    other = copy('other')
    config = json.loads((other / CONFIG_FILE).read_text())
    config['inputs'] = config['inputs'][:2]
    (other / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match='belong to different exports'):
        Splade.from_pretrained(other)
    (other / CONFIG_FILE).write_text('{not json')
    with pytest.raises(ModelLoadError, match='not valid JSON'):
        Splade.from_pretrained(other, backend='onnx')


def test_export_refuses_bad_arguments_and_user_folders(splade, tmp_path):
    with pytest.raises(ValueError, match='precision'):
        splade.export_onnx(tmp_path / 'a', precision='bf16')
    with pytest.raises(ValueError, match='opset'):
        splade.export_onnx(tmp_path / 'b', opset=9)
    user = tmp_path / 'mine'
    user.mkdir()
    (user / 'notes.txt').write_text('keep me')
    with pytest.raises(FileExistsError, match='not ours to replace'):
        splade.export_onnx(user)
    assert [p.name for p in user.iterdir()] == ['notes.txt']
    assert not (tmp_path / 'a').exists() and not (tmp_path / 'b').exists()
    with pytest.raises(TypeError, match='SpladeModel.*SaeSpladeModel'):
        SaeSplade.example().export_onnx(tmp_path / 'sae')


def test_export_replaces_its_own_folder_and_leaves_the_model_as_it_was(splade, tmp_path, capfd):
    splade.model.train()
    try:
        folder = splade.export_onnx(tmp_path / 'x', opset=14)
        assert splade.model.training
        assert json.loads((folder / CONFIG_FILE).read_text())['opset'] == 14
        splade.export_onnx(folder, opset=18)  # our own model folder: replaced
        assert json.loads((folder / CONFIG_FILE).read_text())['opset'] == 18
    finally:
        splade.model.eval()
    out, err = capfd.readouterr()
    assert out == '' and err == ''  # the exporter's and quantizer's notices are not the user's concern


def test_the_document_side_of_inference_free_and_asymmetric_models(tmp_path, texts, long_texts):
    for model in (InferenceFreeSplade.example(), AsymmetricSplade.example()):
        folder = model.export_onnx(tmp_path / model.kind)
        config = json.loads((folder / CONFIG_FILE).read_text())
        assert config['source']['kind'] == model.kind and config['encodes'] == 'documents'
        docs = texts[:8] + long_texts[:2]
        assert_same_vectors(load_model(folder).encode_docs(docs), model.encode_docs(docs))


def test_an_int8_torch_model_exports_its_fp32_weights(splade, tmp_path, texts):
    int8 = Splade.from_pretrained('splade-tiny', precision='int8')
    folder = int8.export_onnx(tmp_path / 'from-int8')
    assert_same_vectors(load_model(folder).encode_docs(texts[:8]), splade.encode_docs(texts[:8]))


def test_an_int8_graph_is_quantized_and_keeps_the_top_terms(splade, tmp_path, texts):
    import onnx
    folder = splade.export_onnx(tmp_path / 'int8', precision='int8')
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert config['precision'] == 'int8'
    assert config['quantization']['method'] == 'onnxruntime.quantization.quantize_dynamic'
    ops = {node.op_type for node in onnx.load(str(folder / ONNX_FILE)).graph.node}
    assert {'DynamicQuantizeLinear', 'MatMulInteger'} <= ops
    fp32 = splade.export_onnx(tmp_path / 'fp32')
    assert (folder / ONNX_FILE).stat().st_size < 0.5 * (fp32 / ONNX_FILE).stat().st_size
    got, want = load_model(folder).encode_docs(texts), splade.encode_docs(texts)
    top = [max(w, key=w.get) in g and sorted(g, key=g.get)[-1] == max(w, key=w.get) for g, w in zip(got, want) if w]
    assert sum(top) >= 0.9 * len(top)  # measured: nDCG@10 in docs/results.md


def test_without_onnxruntime_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)
    with pytest.raises(ImportError, match=r"pyterrier-lsr\[onnx\]"):
        import_onnxruntime()


@pytest.mark.parametrize('split_head', [True, False])
def test_a_rescaled_head_without_segment_inputs_exports_faithfully(tmp_path, split_head):
    """The head scale is inside the graph; a tokenizer that gives no token_type_ids makes a two-input graph; a head
    layout SpladeModel cannot split runs whole in the graph as in torch."""
    from conftest import make_tiny
    module, tokenizer = make_tiny(dropout=0.0)
    tokenizer.model_input_names = ['input_ids', 'attention_mask']
    module.settings['head_scale'] = 2.0
    if not split_head:
        module._head_layout = None
    model = Splade(module, tokenizer, device='cpu', max_length=64)
    folder = model.export_onnx(tmp_path / 'tiny')
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert [i['name'] for i in config['inputs']] == ['input_ids', 'attention_mask'] and config['head_scale'] == 2.0
    texts = ['the cat sat on the reactor', 'radio wave noise in the ionosphere ' * 20, 'dog']
    assert_same_vectors(load_model(folder).encode_docs(texts), model.encode_docs(texts))
    assert sum(map(len, model.encode_docs(texts))) > 0
