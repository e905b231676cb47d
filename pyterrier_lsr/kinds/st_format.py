"""sentence-transformers' folder format for sparse models, written and read without importing sentence-transformers.

A ``SparseEncoder`` folder lists its modules in ``modules.json``; ``config_sentence_transformers.json`` says
``"model_type": "SparseEncoder"``.  The layouts of our kinds (as sentence-transformers 6.2 writes them itself):

* SPLADE: a fill-mask ``Transformer`` (the masked LM's folder, here the root; ``sentence_bert_config.json`` holds
  ``transformer_task`` and ``max_seq_length``, the truncation) and ``SpladePooling`` (``1_SpladePooling/config.json``:
  ``pooling_strategy`` max or sum, ``activation_function`` relu or log1p_relu).
* inference-free: a ``Router`` (``router_config.json``) whose ``query`` route is a ``SparseStaticEmbedding`` (one
  weight per token id, ``model.safetensors`` + tokenizer, truncating at the tokenizer's ``model_max_length``) and
  whose ``document`` route is ``Transformer`` + ``SpladePooling``; asymmetric: a ``Router`` of two such encoders.

The legacy module names (``sentence_transformers.sparse_encoder.models.MLMTransformer``, ``...models.Router``) read
alike.  :func:`read_layout` describes a folder; the kinds build their torch modules from it.
"""
from pathlib import Path
from typing import NamedTuple

from ..core import storage
from ..core.checks import check_int
from ..core.model_files import ModelLoadError

MODULES_FILE = 'modules.json'
MODULE_CONFIG = 'sentence_bert_config.json'
MODEL_CONFIG = 'config_sentence_transformers.json'
ROUTER_CONFIG = 'router_config.json'
TRANSFORMER = 'sentence_transformers.base.modules.transformer.Transformer'
POOLING = 'sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling'
STATIC = 'sentence_transformers.sparse_encoder.modules.sparse_static_embedding.SparseStaticEmbedding'
ROUTER = 'sentence_transformers.base.modules.router.Router'
FILL_MASK = {'transformer_task': 'fill-mask',
             'modality_config': {'text': {'method': 'forward', 'method_output_name': 'logits'}},
             'module_output_name': 'token_embeddings'}
# SpladePooling's options (ours: SpladeModel's ``pooling`` and ``activation`` settings, the same names)
POOLINGS = ('max', 'sum')
ACTIVATIONS = ('relu', 'log1p_relu')

__all__ = ['Encoder', 'Static', 'Layout', 'read_layout', 'declared_length', 'folded_head', 'write_modules',
           'write_router', 'encoder_modules', 'static_module']


class Encoder(NamedTuple):
    """A route computed by a masked LM: its folder, SpladePooling's options and the declared truncation (``None``:
    the tokenizer's ``model_max_length``, as sentence-transformers reads it)."""
    path: Path
    pooling: str = 'max'
    activation: str = 'relu'
    max_length: int | None = None


class Static(NamedTuple):
    """A ``SparseStaticEmbedding`` route: its folder (tokenizer + one weight per token id)."""
    path: Path


class Layout(NamedTuple):
    """A sparse sentence-transformers folder: the documents' encoder and the queries' route (``None``: the same
    encoder)."""
    document: Encoder
    query: Encoder | Static | None = None


def _module_kind(type_name: str) -> str:
    return str(type_name).rsplit('.', 1)[-1]


def _transformer(folder: Path, kind: str, where: Path) -> Encoder:
    config_file = folder / MODULE_CONFIG
    config = storage.read_json(config_file, 'the sentence-transformers settings') if config_file.is_file() else {}
    # sentence-transformers' defaults: a (legacy) MLMTransformer is fill-mask, a Transformer feature-extraction
    task = config.get('transformer_task', 'fill-mask' if kind == 'MLMTransformer' else 'feature-extraction')
    if task != 'fill-mask':
        raise ModelLoadError(f'{config_file}: transformer_task {task!r} is not a sparse (fill-mask) encoder: '
                             f'{where} is not a SPLADE-like sentence-transformers model')
    value = config.get('max_seq_length')
    max_length = None if value is None else check_int(f'max_seq_length in {config_file}', value, 3)
    return Encoder(folder, max_length=max_length)


def _pooling(folder: Path) -> dict:
    config_file = folder / 'config.json'
    config = storage.read_json(config_file, 'the SpladePooling settings') if config_file.is_file() else {}
    pooling, activation = config.get('pooling_strategy', 'max'), config.get('activation_function', 'relu')
    if pooling not in POOLINGS or activation not in ACTIVATIONS:
        raise ModelLoadError(f'{config_file}: pooling_strategy {pooling!r} / activation_function {activation!r}; '
                             f'supported: {list(POOLINGS)} / {list(ACTIVATIONS)}')
    return {'pooling': pooling, 'activation': activation}


def _route(folder: Path, modules: list[tuple[str, str]], where: Path) -> Encoder | Static:
    kinds = [_module_kind(t) for t, _ in modules]
    if kinds == ['SparseStaticEmbedding']:
        return Static(folder / modules[0][1])
    if kinds in (['Transformer', 'SpladePooling'], ['MLMTransformer', 'SpladePooling']):
        return _transformer(folder / modules[0][1], kinds[0], where)._replace(**_pooling(folder / modules[1][1]))
    raise ModelLoadError(f'{where}: modules {kinds} are not a layout read here (a fill-mask Transformer and '
                         'SpladePooling, a SparseStaticEmbedding, or a Router of those)')


def read_layout(folder: str | Path) -> Layout | None:
    """The sparse sentence-transformers layout of ``folder``, or ``None`` when it is no ``SparseEncoder`` folder (no
    ``modules.json``, or a dense model's: its masked LM, if any, is read as an HF folder).

    Raises:
        ModelLoadError: modules of another kind of model (a dense Pooling, a SparseAutoEncoder...) or settings read
            differently here, naming the file.
    """
    folder = Path(folder)
    modules_file, model_file = folder / MODULES_FILE, folder / MODEL_CONFIG
    if not modules_file.is_file() or not model_file.is_file():
        return None
    model_config = storage.read_json(model_file, 'the sentence-transformers settings')
    if model_config.get('model_type') != 'SparseEncoder':
        return None
    prompts = {k: v for k, v in (model_config.get('prompts') or {}).items() if v}
    if prompts or model_config.get('default_prompt_name'):
        # sentence-transformers prepends them to the texts; encoding without them would give other vectors silently
        raise ModelLoadError(f'{model_file}: prompts {prompts} (default {model_config.get("default_prompt_name")!r}) '
                             'are not applied here; read here: SparseEncoder folders without prompts')
    listed = storage.read_json(modules_file, 'the sentence-transformers modules', expect=list)
    if not all(isinstance(m, dict) for m in listed):
        raise ModelLoadError(f'{modules_file}: not a list of modules')
    modules = [(str(m.get('type', '')), str(m.get('path', ''))) for m in sorted(listed, key=lambda m: m.get('idx', 0))]
    if [_module_kind(t) for t, _ in modules] != ['Router']:
        route = _route(folder, modules, modules_file)
        if isinstance(route, Static):
            raise ModelLoadError(f'{modules_file}: a SparseStaticEmbedding alone encodes no documents')
        return Layout(route)
    router = folder / modules[0][1]
    config_file = router / ROUTER_CONFIG
    config = storage.read_json(config_file, 'the Router settings')
    types, structure = config.get('types') or {}, config.get('structure') or {}
    if set(structure) != {'query', 'document'}:
        raise ModelLoadError(f'{config_file}: routes {sorted(structure)}; read here: a query and a document route')
    routes = {name: _route(router, [(types.get(m, ''), m) for m in names], config_file)
              for name, names in structure.items()}
    if isinstance(routes['document'], Static):
        raise ModelLoadError(f'{config_file}: the document route is a SparseStaticEmbedding; read here: documents '
                             'through a fill-mask Transformer and SpladePooling')
    return Layout(routes['document'], routes['query'])


def declared_length(encoder: Encoder, tokenizer) -> int | None:
    """The truncation sentence-transformers applies to ``encoder``: its ``max_seq_length``, else its tokenizer's
    ``model_max_length`` (``None`` where the tokenizer sets no limit)."""
    limit = tokenizer.model_max_length
    return encoder.max_length or (limit if isinstance(limit, int) and limit < 1_000_000 else None)


def folded_head(model):
    """A copy of a SPLADE module's masked LM whose logits are already divided by its ``head_scale`` (the decoder's
    weight and bias divided, untied from the input embeddings): what sentence-transformers, which has no such
    setting, computes our vectors with."""
    import copy

    import torch
    mlm = copy.deepcopy(model.mlm)
    scale = float(model.settings['head_scale'])
    decoder = mlm.get_output_embeddings()
    with torch.no_grad():
        if decoder.weight is mlm.get_input_embeddings().weight:
            decoder.weight = torch.nn.Parameter(decoder.weight.detach().clone())
            mlm.config.tie_word_embeddings = False
        decoder.weight.div_(scale)
        if decoder.bias is not None:
            # untied, transformers ties none of the head's parameters: the bias (shared with the head's own in
            # BERT) must be saved as the decoder's
            decoder.bias.div_(scale)
            decoder.bias = torch.nn.Parameter(decoder.bias.detach().clone())
    setattr(mlm.config, 'lsr', dict(model.settings, head_scale=1.0))
    return mlm


# -- writing --------------------------------------------------------------------------------------------------------
def _model_config(folder: Path) -> None:
    storage.write_json(folder / MODEL_CONFIG, {'model_type': 'SparseEncoder', 'prompts': {'query': '', 'document': ''},
                                               'default_prompt_name': None, 'similarity_fn_name': 'dot'}, indent=2)


def _write_pooling(folder: Path, pooling: str, activation: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    storage.write_json(folder / 'config.json', {'pooling_strategy': pooling, 'activation_function': activation,
                                                'embedding_dimension': None}, indent=2)


def encoder_modules(folder: Path, transformer: str, pooling_folder: str, max_length: int, pooling: str = 'max',
                    activation: str = 'relu') -> list[tuple[str, str]]:
    """Writes the sentence-transformers files of an encoder whose masked LM is in ``folder / transformer`` (already
    written): its ``sentence_bert_config.json`` and a SpladePooling module in ``folder / pooling_folder``.  Returns
    the two modules as ``(type, path)``."""
    storage.write_json(folder / transformer / MODULE_CONFIG, dict(FILL_MASK, max_seq_length=max_length), indent=2)
    _write_pooling(folder / pooling_folder, pooling, activation)
    return [(TRANSFORMER, transformer), (POOLING, pooling_folder)]


def static_module(folder: Path, tokenizer, weight, max_length: int) -> tuple[str, str]:
    """Writes a SparseStaticEmbedding module into ``folder`` (new): ``weight`` (one per token id), the tokenizer
    saved with ``model_max_length = max_length`` (the module's truncation), ``config.json``.  Returns
    ``(type, folder name)``."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    limit = tokenizer.model_max_length
    tokenizer.model_max_length = max_length
    try:
        tokenizer.save_pretrained(str(folder))
    finally:
        tokenizer.model_max_length = limit
    # float64, so that our weights read back exactly (sentence-transformers loads them into its float32 parameter)
    save_file({'weight': weight.detach().double().cpu().contiguous()}, str(folder / 'model.safetensors'),
              metadata={'format': 'pt'})
    storage.write_json(folder / 'config.json', {'frozen': False}, indent=2)
    return STATIC, folder.name


def write_modules(folder: Path, modules: list[tuple[str, str]]) -> None:
    """``modules.json`` listing ``modules`` (``(type, path)``, written already) and the model's
    ``config_sentence_transformers.json``."""
    storage.write_json(Path(folder) / MODULES_FILE, [{'idx': i, 'name': str(i), 'path': path, 'type': kind}
                                                     for i, (kind, path) in enumerate(modules)], indent=2)
    _model_config(Path(folder))


def write_router(folder: Path, query: list[tuple[str, str]], document: list[tuple[str, str]]) -> None:
    """A ``Router`` at the root of ``folder`` over modules already written in its subfolders (``(type, path)``)."""
    folder = Path(folder)
    storage.write_json(folder / ROUTER_CONFIG, {
        'types': {path: kind for kind, path in query + document},
        'structure': {'query': [p for _, p in query], 'document': [p for _, p in document]},
        'parameters': {'default_route': 'document', 'allow_empty_key': True, 'route_mappings': {}}}, indent=2)
    write_modules(folder, [(ROUTER, '')])
