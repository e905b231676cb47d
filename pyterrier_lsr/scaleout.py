"""Encoding a large corpus on a pool of model replicas (Ray actors) into a vector folder, and indexing it from there.

``encode(corpus, model, folder)`` cuts the corpus into shards of ``shard_size`` documents in corpus order; shard ``i``
is encoded by one of ``num_workers`` actors (each loads the model once from a folder with
:func:`~pyterrier_lsr.load_model`: one replica per GPU, or per ``threads_per_worker`` CPUs) and written as
``part-<i>.parquet`` (see :mod:`pyterrier_lsr.index.vectors`) plus ``part-<i>.json``: its manifest entry and a digest
of its docnos and texts. A re-run skips every shard whose ``.json``, digest and file size check out, so an interrupted
job resumes where it stopped, and a longer corpus that starts with the same documents reuses their shards (a shorter
one leaves the longer one's other shards in place, for the next time it is encoded). ``vectors.json``, written last,
joins the shards of the corpus encoded last, in corpus order. ``encode.json`` keeps the job's settings (the
model's weights, its precision, the shard size): resuming with other settings is refused, so shards encoded
differently never mix.

Each shard's texts go through ``model.encode_docs`` in one call, as :meth:`LsrIndex.index
<pyterrier_lsr.LsrIndex.index>` encodes each of its shards: with the same ``shard_size``, settings and device, the
vectors are bit-identical to a single process's. ``num_workers=0`` runs the same shards in this process, without Ray.

The folder is our artifact (marked ``encoded_vectors``, see :mod:`pyterrier_lsr.core.storage`): a new or empty folder is
marked when a job starts, and a folder holding anything else is refused, so no user file is overwritten or removed;
the shards a job wrote are the ones its ``part-<i>.json`` records name. The folder must be visible to every worker
(one machine, or a shared filesystem on a cluster); so must the model folder (a model object is saved into
``<folder>/model`` first, replaced only when the model's weights or configuration changed). Actors are restarted and
their shard retried up to ``max_retries`` times when their process dies; after that, or on an error inside
``encode``, the job stops with an error naming the shard, and a re-run resumes from the shards already written.
"""
import hashlib
import json
import os
import re
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from glob import glob
from pathlib import Path

from tqdm.auto import tqdm

from .core import storage
from .core.checks import UniqueDocnos, check_float, check_int, check_vector, is_missing
from .core.collection import json_records
from .core.extras import import_extra
from .core.folders import local_folder
from .index.vectors import VectorStore, shard_name, write_manifest, write_shard
from .kinds.loading import load_model

JOB_FILE = 'encode.json'
MODEL_FOLDER = 'model'
VECTORS_KIND = 'encoded_vectors'
MODEL_KIND = 'encoded_vectors.model'
SHARD_RECORD = re.compile(r'part-(\d{5})\.json')

__all__ = ['encode', 'index', 'read_corpus']


def read_corpus(corpus, text_field: str = 'text') -> tuple[Iterable[dict], int | None]:
    """Documents (dicts with ``docno`` and ``text_field``) in corpus order, and their number when known, from an
    iterable of dicts, a DataFrame, an ``irds:`` id, or Parquet/JSONL files (a path, a glob, or a list of paths)."""
    import pandas as pd
    if isinstance(corpus, pd.DataFrame):
        return corpus.to_dict('records'), len(corpus)
    if isinstance(corpus, (str, Path)) and str(corpus).startswith('irds:'):
        import pyterrier as pt
        dataset = pt.get_dataset(str(corpus))
        return dataset.get_corpus_iter(verbose=False), dataset.irds_ref().docs_count()
    if isinstance(corpus, (str, Path)) or (isinstance(corpus, (list, tuple)) and corpus
                                           and isinstance(corpus[0], (str, Path))):
        paths = [corpus] if isinstance(corpus, (str, Path)) else list(corpus)
        files = [f for p in paths for f in (sorted(glob(str(p))) if any(c in str(p) for c in '*?[') else [str(p)])]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing or not files:
            raise FileNotFoundError(f'no corpus files at {missing or paths}')
        return _read_files(files, text_field), None
    return corpus, (len(corpus) if hasattr(corpus, '__len__') else None)


def _read_files(files: Sequence[str], text_field: str) -> Iterator[dict]:
    import pyarrow.parquet as pq
    for file in files:
        if file.endswith('.parquet'):
            for batch in pq.ParquetFile(file).iter_batches(columns=['docno', text_field]):
                yield from batch.to_pylist()
        elif file.endswith(('.jsonl', '.jsonl.gz')):
            # the strict reader of every corpus file: a BOM, bad UTF-8 or an unreadable line is named, not a raw error
            yield from (record for _, record in json_records(file, f'"docno" and "{text_field}"'))
        else:
            raise ValueError(f'{file}: corpus files must be .parquet, .jsonl or .jsonl.gz')


def _shards(docs: Iterable[dict], text_field: str, shard_size: int) -> Iterator[tuple[int, list[str], list]]:
    number, docnos, texts = 0, [], []
    unique = UniqueDocnos('the corpus')
    for position, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise TypeError(f'document {position} is a {type(doc).__name__}, not a dict with "docno" and '
                            f'"{text_field}"')
        missing = [c for c in ('docno', text_field) if c not in doc]
        if missing:
            raise KeyError(f'documents must have columns {missing}; document {position} has {sorted(doc)}')
        docnos.append(unique.add(doc['docno']))
        texts.append(doc[text_field])
        if len(docnos) == shard_size:
            yield number, docnos, texts
            number, docnos, texts = number + 1, [], []
    if docnos:
        yield number, docnos, texts


def _digest(docnos: Sequence[str], texts: Sequence) -> str:
    """The key of a shard's documents: one JSON pair a document, a missing text (None, NaN) as ``null``, so that it
    never collides with the strings ``"None"`` or ``"nan"`` (a text that changed from missing to such a string must
    be encoded again), nor a separator inside a text with the next document."""
    h = hashlib.sha256()
    for docno, text in zip(docnos, texts):
        text = None if is_missing(text) else text if isinstance(text, str) else {type(text).__name__: repr(text)}
        h.update(json.dumps([docno, text]).encode() + b'\n')
    return h.hexdigest()


def _shard_record(folder: Path, number: int) -> Path:
    return folder / shard_name(number).replace('.parquet', '.json')


def _written(folder: Path, number: int, digest: str) -> dict | None:
    """The manifest entry of shard ``number`` if it is complete and holds these documents."""
    record = _shard_record(folder, number)
    if not record.is_file():
        return None
    try:
        saved = storage.read_json(record, 'shard record')
    except ValueError:  # cut short or edited: the shard is encoded again
        return None
    entry = saved.get('entry')
    if not isinstance(entry, dict) or entry.get('file') != shard_name(number) or saved.get('digest') != digest:
        return None
    path = folder / entry['file']
    if not path.is_file() or path.stat().st_size != entry.get('bytes'):
        return None
    return entry


class ShardEncoder:
    """Encodes and writes shards: the body of each Ray actor, and of ``num_workers=0``."""

    def __init__(self, model, folder, threads: int | None = None, model_kwargs: dict = None):
        if threads:
            import torch
            torch.set_num_threads(threads)
        self.model = load_model(model, **(model_kwargs or {})) if isinstance(model, (str, Path)) else model
        self.folder = Path(folder)

    def encode(self, number: int, docnos: list[str], texts: list, digest: str) -> dict:
        start, cpu = time.perf_counter(), time.process_time()
        vectors = [check_vector(v, f'document {d!r}') for d, v in zip(docnos, self.model.encode_docs(texts))]
        entry = write_shard(self.folder, shard_name(number), docnos, vectors)
        storage.write_json(_shard_record(self.folder, number), {
            'entry': entry, 'digest': digest, 'seconds': time.perf_counter() - start,
            'cpu_seconds': time.process_time() - cpu, 'pid': os.getpid()})
        return entry


def _model_folder(model, folder: Path) -> Path:
    """A folder the workers load the model from: the model's own for a name/path, else a copy saved in ``folder``
    (kept when the model's weights and configuration are those saved before, so a resumed job's fingerprint holds)."""
    if isinstance(model, (str, Path)):
        return local_folder(model).absolute()
    target = folder / MODEL_FOLDER
    tmp = storage.temporary_sibling(target, 'saving')
    try:
        model.save_pretrained(str(tmp))
        if not (storage.is_artifact(target, MODEL_KIND) and storage.model_digest(target) == storage.model_digest(tmp)):
            storage.replace_folder(tmp, target, MODEL_KIND)
    finally:
        storage.remove_temporary(tmp)
    return target.absolute()


def _check_job(folder: Path, job: dict) -> None:
    """A folder holds the shards of one job: resuming with another model or other shard settings is an error."""
    path = folder / JOB_FILE
    if path.is_file():
        before = storage.read_json(path, 'encoding job settings')
        if before != job:
            changed = sorted(k for k in set(before) | set(job) if before.get(k) != job.get(k))
            raise ValueError(f'{folder} holds shards encoded with other settings ({", ".join(changed)} differ); '
                             'remove it or choose another folder')
    else:
        storage.write_json(path, job)


def _model_kwargs(model, model_kwargs: dict | None, device: str) -> dict:
    """The settings a worker loads the model with: a given model's batch and length limits (so workers encode as it
    does), its precision when the worker runs on the same kind of device (int8 or bf16 weights give other vectors than
    fp32 ones; on another device the worker's default applies), the worker's device, and ``model_kwargs`` over all."""
    kwargs = {k: getattr(model, k) for k in ('batch_size', 'max_length') if hasattr(model, k)}
    if hasattr(model, 'precision') and getattr(getattr(model, 'device', None), 'type', None) == device:
        kwargs['precision'] = model.precision
    return {**kwargs, 'device': device, **(model_kwargs or {})}


class _Pool:
    """``num_workers`` Ray actors fed shards, at most ``in_flight`` queued per actor, the least busy first; ``started``:
    the Ray session is this job's, shut down on :meth:`close`."""

    def __init__(self, ray, num_workers, threads, gpus, max_retries, in_flight, args, started):
        self.ray, self.in_flight, self.started = ray, in_flight, started
        remote = ray.remote(num_cpus=threads, num_gpus=gpus, max_restarts=max_retries,
                            max_task_retries=max_retries)(ShardEncoder)
        self.actors = [remote.remote(*args) for _ in range(num_workers)]
        self.busy = {i: 0 for i in range(num_workers)}
        self.pending = {}  # future -> (actor index, shard number, documents)

    def submit(self, number, docnos, texts, digest):
        actor = min(self.busy, key=self.busy.get)
        future = self.actors[actor].encode.remote(number, docnos, texts, digest)
        self.busy[actor] += 1
        self.pending[future] = (actor, number, len(docnos))

    def full(self) -> bool:
        return len(self.pending) >= self.in_flight * len(self.actors)

    def next_done(self) -> tuple[int, int, dict]:
        """Waits for a shard; returns ``(number, documents, manifest entry)``."""
        [future], _ = self.ray.wait(list(self.pending), num_returns=1)
        actor, number, count = self.pending.pop(future)
        self.busy[actor] -= 1
        try:
            return number, count, self.ray.get(future)
        except self.ray.exceptions.RayActorError as ex:
            raise RuntimeError(f'the worker encoding shard {number} died and was restarted and retried as often as '
                               f'allowed (max_retries); the shards written so far are kept: re-run to resume. '
                               f'Cause: {ex}') from None
        except self.ray.exceptions.RayTaskError as ex:
            raise RuntimeError(f'encoding shard {number} failed in its worker; the shards written so far are kept: '
                               f're-run to resume. Cause: {ex.cause!r}') from ex.cause

    def close(self):
        for actor in self.actors:
            self.ray.kill(actor)
        if self.started:
            self.ray.shutdown()


class _InProcess:
    """:class:`_Pool`'s interface for ``num_workers=0``: each shard is encoded here when submitted."""

    def __init__(self, encoder: ShardEncoder):
        self.encoder, self.pending = encoder, {}

    def submit(self, number, docnos, texts, digest):
        self.pending[number] = (number, len(docnos), self.encoder.encode(number, docnos, texts, digest))

    def full(self) -> bool:
        return bool(self.pending)

    def next_done(self) -> tuple[int, int, dict]:
        return self.pending.pop(next(iter(self.pending)))

    def close(self):
        pass


def _ray_pool(model, model_path: Path, folder: Path, num_workers, ray_address, gpus_per_worker,
              threads_per_worker, model_kwargs, max_retries, in_flight, verbose) -> tuple[_Pool, dict]:
    """Joins or starts Ray and starts the workers; returns the pool and the settings each worker loads the model with
    (default worker count and GPUs from the cluster's resources)."""
    ray = import_extra('scaleout', 'ray', needed_for='scaleout.encode')
    started = not ray.is_initialized()
    if started:
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=verbose)
    try:
        resources = ray.cluster_resources()
        if gpus_per_worker is None:
            gpus_per_worker = 1 if resources.get('GPU', 0) > 0 else 0
        if num_workers is None:
            num_workers = max(1, int(resources.get('GPU', 0) // gpus_per_worker if gpus_per_worker
                                     else resources.get('CPU', 1) // threads_per_worker))
        if num_workers * threads_per_worker > resources.get('CPU', 0):
            warnings.warn(f'{num_workers} workers x {threads_per_worker} CPUs exceed the cluster\'s '
                          f'{resources.get("CPU", 0):g} CPUs: some workers wait for resources')
        kwargs = _model_kwargs(model, model_kwargs, 'cuda' if gpus_per_worker else 'cpu')
        return _Pool(ray, num_workers, threads_per_worker, gpus_per_worker, max_retries, in_flight,
                     (str(model_path), str(folder), threads_per_worker, kwargs), started), kwargs
    except BaseException:
        if started:
            ray.shutdown()
        raise


def _encode_shards(docs: Iterable[dict], total: int | None, folder: Path, text_field: str, shard_size: int, pool,
                   verbose: bool) -> dict[int, dict]:
    """Feeds the shards not written yet to ``pool``; returns every shard's manifest entry by number."""
    entries, counts, start = {}, {'encoded': 0, 'skipped': 0}, time.perf_counter()
    with tqdm(total=total, desc=f'encoding {folder.name}', unit='doc', disable=not verbose) as pbar:
        def finished(number, count, entry, how='encoded'):
            entries[number] = entry
            counts[how] += count
            pbar.update(count)
            pbar.set_postfix({'docs/s': f'{counts["encoded"] / (time.perf_counter() - start):.1f}',
                              'skipped': counts['skipped']})

        for number, docnos, texts in _shards(docs, text_field, shard_size):
            digest = _digest(docnos, texts)
            entry = _written(folder, number, digest)
            if entry is not None:
                finished(number, len(docnos), entry, 'skipped')
                continue
            while pool.full():
                finished(*pool.next_done())
            pool.submit(number, docnos, texts, digest)
        while pool.pending:
            finished(*pool.next_done())
    return entries


def _check_settings(num_workers, gpus_per_worker, threads_per_worker, max_retries, in_flight, model_kwargs,
                    shard_size) -> None:
    """Every setting checked before the folder is claimed or Ray is started (a bad one would fail inside a worker)."""
    if num_workers is not None:
        check_int('num_workers', num_workers, 0)
    if gpus_per_worker is not None:
        check_float('gpus_per_worker', gpus_per_worker, 0)
    check_int('threads_per_worker', threads_per_worker, 1)
    check_int('max_retries', max_retries, 0)
    check_int('in_flight', in_flight, 1)
    if model_kwargs is not None and not isinstance(model_kwargs, dict):
        raise TypeError(f'model_kwargs must be a dict of loading settings, got {type(model_kwargs).__name__}')
    check_int('shard_size', shard_size, 1)


def encode(corpus, model, folder, *, num_workers: int | None = None, shard_size: int = 16_384,
           text_field: str = 'text', ray_address: str | None = None,
           gpus_per_worker: float | None = None, threads_per_worker: int = 1, model_kwargs: dict | None = None,
           max_retries: int = 2, in_flight: int = 2, verbose: bool = True) -> VectorStore:
    """Encodes ``corpus`` into the vector folder ``folder`` on Ray workers; returns its :class:`VectorStore`.

    Args:
        corpus: an iterable of ``{docno, text}`` dicts, a DataFrame, an ``irds:`` id, or Parquet/JSONL files (a path,
            a glob or a list of paths; columns ``docno`` and ``text_field``).
        model: a model of the project (saved into ``folder/model`` for the workers) or its folder / name.
        num_workers: model replicas; default one per GPU of the cluster, or one per ``threads_per_worker`` CPUs.
            ``0``: encode in this process (same shards, no Ray).
        shard_size: documents per shard, encoded in one ``model.encode_docs`` call: the unit of work, of retry and of
            resume (as :class:`~pyterrier_lsr.LsrIndex`'s ``shard_size``).
        ray_address: the cluster to join (``'auto'``, ``'ray://host:10001'``); default: the running Ray session, or a
            new local one (shut down at the end).
        gpus_per_worker: GPUs per replica; default 1 when the cluster has GPUs, else 0 (CPU workers).
        threads_per_worker: CPUs (torch threads) per replica.
        model_kwargs: settings for loading the model in each worker (``precision``, ``batch_size``...); by default the
            given model's ``batch_size``/``max_length``, its precision on workers of its kind of device, and the
            worker's device.
        max_retries: restarts of a dead worker (and retries of its shard) before the job fails.
        in_flight: shards queued per worker (2 keeps each busy while the next shard is shipped).
    """
    _check_settings(num_workers, gpus_per_worker, threads_per_worker, max_retries, in_flight, model_kwargs,
                    shard_size)
    folder = Path(folder).absolute()
    docs, total = read_corpus(corpus, text_field)
    storage.claim_folder(folder, VECTORS_KIND, 'vector folder')
    model_path = _model_folder(model, folder)
    if num_workers == 0:
        by_name = isinstance(model, (str, Path))
        encoder = ShardEncoder(model_path if by_name else model, folder, model_kwargs=model_kwargs)
        pool, precision = _InProcess(encoder), getattr(encoder.model, 'precision', None)
    else:
        pool, kwargs = _ray_pool(model, model_path, folder, num_workers, ray_address, gpus_per_worker,
                                 threads_per_worker, model_kwargs, max_retries, in_flight, verbose)
        # a worker's default precision depends on its device (fp32 on CPU, bf16 or fp16 on GPU)
        precision = kwargs.get('precision') or f'the default on {kwargs["device"]}'
    try:
        # The precision is part of a job: shards of fp32, bf16 and int8 weights differ and must not mix in a folder.
        _check_job(folder, {'model': storage.model_digest(model_path), 'precision': precision,
                            'shard_size': shard_size, 'text_field': text_field})
        entries = _encode_shards(docs, total, folder, text_field, shard_size, pool, verbose)
    finally:
        pool.close()
    if not entries:
        raise ValueError('cannot encode an empty corpus')
    # Shards past this corpus (a longer one encoded here before) stay, unnamed by the manifest: encoding the longer
    # corpus again reuses them (each is checked against its documents' digest), where removing them lost hours of work.
    return write_manifest(folder, [entries[i] for i in range(len(entries))])


def index(corpus, model, index_path, *, scale: float = 100., engines: Sequence[str] = ('pisa',),
          overwrite: bool = False, keep_vectors: bool = False, **encode_kwargs):
    """Encodes ``corpus`` with :func:`encode` into ``<index_path>.vectors`` (resumable), then builds the
    :class:`~pyterrier_lsr.LsrIndex` at ``index_path`` from those vectors; the index records ``model``. The vector
    folder is removed once the index is built unless ``keep_vectors``."""
    from .index import LsrIndex
    from .index.artifact import INDEX_KIND
    # The index's settings and its target are checked before the encoding, which may take hours and leaves
    # <index_path>.vectors behind: a bad scale or a folder that may not be replaced is refused before any work.
    built = LsrIndex(index_path, load_model(model, device='cpu') if isinstance(model, (str, Path)) else model,
                     scale=scale, engines=engines, overwrite=overwrite, verbose=encode_kwargs.get('verbose', True))
    storage.check_replaceable(built.path, INDEX_KIND, overwrite, 'index')
    vectors = Path(f'{built.path.absolute()}.vectors')
    store = encode(corpus, model, vectors, **encode_kwargs)
    built.index(_Toks(store))
    if not keep_vectors:
        storage.remove_artifact(vectors, VECTORS_KIND)
    return built


class _Toks:
    """A vector folder as ``{docno, toks}`` documents, with a length (for the indexer's progress bar)."""

    def __init__(self, store: VectorStore):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __iter__(self):
        return ({'docno': docno, 'toks': toks} for docno, toks in self.store)
