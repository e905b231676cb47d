"""Data-parallel training over processes (``torchrun``) for the bundled loop; every function is a no-op on one process.

The loop's semantics do not depend on the number of processes: ``batch_size`` is the GLOBAL micro-batch. Every rank
walks the same (deterministic) batch order and encodes only its own contiguous slice (:func:`local_slice`); the
query and document vectors of all ranks are gathered (:func:`gather`, differentiable) so that in-batch negatives,
distillation targets and FLOPS are computed over the global batch exactly as one process computes them. Every rank
then holds the same global loss; the gradient of that loss with respect to a rank's own vectors is ``world_size``
times the slice of the (identical) upstream gradient, so :func:`gather` needs no communication in backward, and
averaging parameter gradients across ranks (:func:`average_gradients`, once per optimizer step, after all
``grad_accum`` micro-batches) gives exactly the one-process gradient. This is DDP's arithmetic (averaged gradients,
identical optimizer steps on every rank) without the ``DistributedDataParallel`` wrapper, whose hooks assume one
forward per backward through the wrapped module; the loop encodes queries and documents in separate forwards, through
closures that hold the bare model, and trains parameters outside the model (inference-free query weights).

Launch any script that calls :func:`~pyterrier_lsr.train.train` (or the CLI) with
``torchrun --nproc_per_node N script.py``: :func:`setup` joins the process group that torchrun describes (NCCL on
GPUs, gloo on CPUs) and pins each rank to its GPU.
"""
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ['setup', 'is_distributed', 'world_size', 'rank', 'is_main', 'local_slice', 'gather', 'average_gradients',
           'broadcast_parameters', 'barrier', 'step_seed']


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    return rank() == 0


def setup(backend: str = None) -> bool:
    """Joins the process group described by torchrun's environment (``WORLD_SIZE`` > 1) unless already joined;
    returns whether training is distributed. On GPUs, each rank's default CUDA device becomes ``LOCAL_RANK``, so
    models created afterwards with ``device='cuda'`` land on their own GPU."""
    if dist.is_available() and not dist.is_initialized() and int(os.environ.get('WORLD_SIZE', '1')) > 1:
        backend = backend or ('nccl' if torch.cuda.is_available() else 'gloo')
        if backend == 'nccl':
            torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))
        dist.init_process_group(backend)
    return is_distributed()


def local_slice(batch: Sequence) -> list:
    """This rank's contiguous share of a global batch (the whole batch on one process)."""
    size = world_size()
    if size == 1:
        return list(batch)
    if len(batch) % size:
        raise ValueError(f'the global batch ({len(batch)} examples) must divide evenly over {size} processes')
    share = len(batch) // size
    return list(batch[rank() * share:(rank() + 1) * share])


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        ctx.rows = tensor.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        # Every rank computes the same global loss, so the upstream gradient is the same everywhere and the sum over
        # ranks that an all-reduce would produce is world_size times this rank's slice.
        start = dist.get_rank() * ctx.rows
        return grad[start:start + ctx.rows] * dist.get_world_size()


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """The rows of every rank's ``tensor``, concatenated in rank order (differentiable; see the module notes:
    the loss computed from the result must be the same on every rank)."""
    return _Gather.apply(tensor) if is_distributed() else tensor


def average_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Averages ``.grad`` over ranks in one flat all-reduce (ranks run the same code, so the same parameters have
    gradients everywhere)."""
    if not is_distributed():
        return
    grads: list[torch.Tensor] = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def broadcast_parameters(params: Sequence[torch.Tensor]) -> None:
    """Copies rank 0's values into every rank (models may be initialised differently per process)."""
    if is_distributed():
        for p in params:
            if p.device.type == 'cuda' and p.device.index != torch.cuda.current_device():
                raise ValueError(f'rank {rank()} trains on {p.device} but owns cuda:{torch.cuda.current_device()}: '
                                 'call pyterrier_lsr.train.torchrun.setup() before loading the model')
            dist.broadcast(p.data, src=0)


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def step_seed(seed: int, step: int) -> int:
    """Torch's RNG is reseeded from (seed, step, rank) at every optimizer step: dropout differs across ranks as it
    does across the examples of one process, and a resumed run draws what an uninterrupted one draws on any number
    of processes without saving each rank's generator state."""
    return (seed * 1_000_003 + step) * 4_099 + rank()
