"""The ONNX backend: a SPLADE document encoder exported as one graph, run by onnxruntime behind the same encoding.

A folder written by :func:`~pyterrier_lsr.models.onnx_export.export_onnx` holds ``model.onnx`` (the graph from
``input_ids``, ``attention_mask`` and, for models with segment embeddings, ``token_type_ids`` to the pooled
``batch x vocabulary`` weights, pooling included), the tokenizer's files and ``onnx_config.json``, which records what
the graph computes (inputs, outputs, pooling, activation, truncation, opset, precision, the source model).
:class:`OnnxSparseModule` reads such a folder and maps ``(input_ids, attention_mask)`` to the weights like the torch
module it was exported from, so :func:`~pyterrier_lsr.core.encoding.encode_texts` and every kind's encoders run it
unchanged.  onnxruntime is optional (the ``onnx`` extra); it is imported only here, when a graph is loaded.
"""
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import storage
from .extras import import_extra
from .model_files import REMEDY, ModelLoadError

ONNX_FILE = 'model.onnx'
CONFIG_FILE = 'onnx_config.json'
FORMAT = 'pyterrier-lsr/splade-onnx'
FORMAT_VERSION = 1
# Graph inputs in the order the graph takes them; token_type_ids only where the model has segment embeddings.
INPUTS = ('input_ids', 'attention_mask', 'token_type_ids')
REQUIRED_INPUTS = INPUTS[:2]
OUTPUT = 'weights'
PRECISIONS = ('fp32', 'int8')
BACKENDS = ('torch', 'onnx')

__all__ = ['OnnxSparseModule', 'load_onnx', 'read_onnx_config', 'is_onnx_folder', 'check_backend', 'import_onnxruntime',
           'ONNX_FILE', 'CONFIG_FILE', 'BACKENDS']


def import_onnxruntime():
    """The ``onnxruntime`` module; an ImportError naming the ``onnx`` extra when it is missing."""
    return import_extra('onnx', 'onnxruntime', needed_for='the ONNX backend')


def is_onnx_folder(folder) -> bool:
    """Whether ``folder`` holds an exported graph (its ``onnx_config.json``)."""
    return (Path(folder) / CONFIG_FILE).is_file()


def check_backend(backend, folder) -> str:
    """The backend a folder loads with: ``backend`` checked against the folder (``None``: ``'onnx'`` for a folder
    written by ``export_onnx``, else ``'torch'``).

    Raises:
        ValueError: ``backend`` is not one of :data:`BACKENDS`.
        ModelLoadError: ``'onnx'`` for a folder without a graph, ``'torch'`` for a folder that holds only one.
    """
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f'backend must be one of {list(BACKENDS)} (or None: read from the folder), got {backend!r}')
    exported = is_onnx_folder(folder)
    if backend == 'onnx' and not exported:
        raise ModelLoadError(f"{folder} holds no exported graph ({CONFIG_FILE}): backend='onnx' loads a folder "
                             'written by model.export_onnx(folder); export this model first')
    if backend == 'torch' and exported and not any(Path(folder).glob('*.safetensors')):
        raise ModelLoadError(f"{folder} holds an ONNX graph, not torch weights: load it with backend='onnx' "
                             '(or load the folder it was exported from)')
    return backend or ('onnx' if exported else 'torch')


def _bad(config_file: Path, message: str) -> ModelLoadError:
    return ModelLoadError(f'{config_file}: {message}; {REMEDY} (model.export_onnx(folder) writes it)')


def read_onnx_config(folder) -> dict:
    """``folder/onnx_config.json``, checked: the format, the inputs and output, the vocabulary size, truncation and
    precision the runtime relies on.

    Raises:
        ModelLoadError: a missing or malformed file, naming it and the key.
    """
    config_file = Path(folder) / CONFIG_FILE
    if not config_file.is_file():
        raise ModelLoadError(f'{folder} has no {CONFIG_FILE}: not a folder written by model.export_onnx(folder)')
    try:
        config = storage.read_json(config_file, 'the ONNX configuration')
    except ValueError as ex:
        raise ModelLoadError(str(ex)) from None
    if config.get('format') != FORMAT or config.get('format_version') != FORMAT_VERSION:
        raise _bad(config_file, f'format must be {FORMAT!r} version {FORMAT_VERSION}, got '
                                f'{config.get("format")!r} version {config.get("format_version")!r}')
    inputs = [i.get('name') if isinstance(i, dict) else None for i in config.get('inputs') or []]
    if inputs not in (list(INPUTS[:2]), list(INPUTS)):
        raise _bad(config_file, f'inputs must name {list(INPUTS[:2])} or {list(INPUTS)}, got {inputs}')
    outputs = [o.get('name') if isinstance(o, dict) else None for o in config.get('outputs') or []]
    if outputs != [OUTPUT]:
        raise _bad(config_file, f'outputs must be [{OUTPUT!r}], got {outputs}')
    for key, minimum in (('vocab_size', 1), ('max_length', 3)):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _bad(config_file, f'{key} must be an int >= {minimum}, got {value!r}')
    if config.get('precision') not in PRECISIONS:
        raise _bad(config_file, f'precision must be one of {list(PRECISIONS)}, got {config.get("precision")!r}')
    if not isinstance(config.get('source'), dict) or not isinstance(config['source'].get('lsr', {}), dict):
        raise _bad(config_file, 'source must be an object (with the source model\'s lsr settings)')
    return config


class OnnxSparseModule(nn.Module):
    """An exported graph as a module mapping ``(input_ids, attention_mask)`` to ``batch x vocabulary`` weights.

    ``token_type_ids``, where the graph takes them, are zeros (one segment), as the tokenizer gives a single text.
    onnxruntime runs on the CPU with ``threads`` intra-op threads (default: torch's thread count, so
    ``torch.set_num_threads`` and ``OMP_NUM_THREADS`` apply alike); ``session.run`` is safe to call from several
    threads at once.

    Args:
        folder: a folder written by :func:`~pyterrier_lsr.models.onnx_export.export_onnx`.
        threads: onnxruntime's intra-op threads.

    Raises:
        ImportError: onnxruntime is not installed.
        ModelLoadError: a malformed ``onnx_config.json``, a damaged or missing ``model.onnx``, or a graph whose inputs
            or output differ from what the configuration records.
    """

    def __init__(self, folder, threads: int | None = None):
        super().__init__()
        from .checks import check_int
        self.folder = Path(folder)
        self.config = read_onnx_config(self.folder)
        threads = check_int('threads', threads if threads is not None else torch.get_num_threads(), 1)
        ort = import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3  # errors only: onnxruntime's warnings would break verbose=False's silence
        path = self.folder / ONNX_FILE
        try:
            self.session = ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])
        except Exception as ex:  # onnxruntime raises its own exception types for missing, damaged and foreign files
            line = (str(ex).strip().splitlines() or [type(ex).__name__])[0]
            raise ModelLoadError(f'the ONNX graph {path} does not load ({line:.200}); {REMEDY}') from ex
        self.input_names = [i.name for i in self.session.get_inputs()]
        recorded = [i['name'] for i in self.config['inputs']]
        outputs = self.session.get_outputs()
        if self.input_names != recorded or [o.name for o in outputs] != [OUTPUT]:
            raise ModelLoadError(f'{path} takes {self.input_names} and gives {[o.name for o in outputs]}, but '
                                 f'{self.folder / CONFIG_FILE} records {recorded} and {[OUTPUT]}: the files belong '
                                 f'to different exports; {REMEDY}')
        width = outputs[0].shape[-1] if outputs[0].shape else None
        if isinstance(width, int) and width != self.vocab_size:
            raise ModelLoadError(f'{path} scores {width} terms, {self.folder / CONFIG_FILE} records vocab_size '
                                 f'{self.vocab_size}; {REMEDY}')

    @property
    def vocab_size(self) -> int:
        return self.config['vocab_size']

    @property
    def settings(self) -> dict:
        """The source model's ``lsr`` settings (kind, head scale...), as the torch module reports them."""
        return self.config['source'].get('lsr') or {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        ids = input_ids.detach().cpu().numpy().astype(np.int64, copy=False)
        feeds = {'input_ids': ids, 'attention_mask': attention_mask.detach().cpu().numpy().astype(np.int64)}
        if 'token_type_ids' in self.input_names:
            feeds['token_type_ids'] = np.zeros_like(ids)
        weights = self.session.run([OUTPUT], feeds)[0]
        return torch.from_numpy(weights).to(input_ids.device)

    def save_pretrained(self, folder, **_):
        """Copies the graph and its configuration into ``folder`` (the tokenizer is its owner's to save)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        storage.write_file(folder / ONNX_FILE, lambda tmp: shutil.copyfile(self.folder / ONNX_FILE, tmp))
        storage.write_json(folder / CONFIG_FILE, self.config, indent=2)

    def extra_repr(self) -> str:
        return f'{self.folder}, precision={self.config["precision"]}'


def load_onnx(folder, options: dict) -> tuple[OnnxSparseModule, dict]:
    """The graph of an exported ``folder`` and the runtime options for the model kind that encodes with it: the
    CPU, fp32 (the graph's own precision, int8 included, was fixed at export), and by default the truncation the
    graph was exported with.

    Raises:
        ValueError: a device other than the CPU or a precision other than fp32, naming the option.
    """
    options = dict(options)
    device, precision = options.get('device'), options.get('precision')
    if device is not None and torch.device(device).type != 'cpu':
        raise ValueError(f'device: the ONNX backend runs on the CPU, got {str(device)!r}')
    if precision not in (None, 'fp32'):
        raise ValueError(f"precision: an exported graph runs at the precision it was exported with, got "
                         f"{precision!r}; export an int8 graph with model.export_onnx(folder, precision='int8')")
    module = OnnxSparseModule(folder)
    options.update(device='cpu', precision='fp32')
    if options.get('max_length') is None:
        options['max_length'] = module.config['max_length']
    return module, options
