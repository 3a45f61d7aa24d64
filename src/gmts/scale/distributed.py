"""Process-group plumbing for ``torchrun --nproc_per_node N`` (gloo on CPU, NCCL on GPU).

The trainer does not wrap the model in DDP: each rank accumulates the gradient of its share
of a loss whose denominators are already global (``LossConfig.denominators`` of the
mini-batch's ``TokenSums`` reduced over ranks), so the gradients are summed over ranks once
per optimizer step (:func:`all_reduce_gradients`).
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the process group (the defaults: one process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def group(self) -> Any:
        """The process group for the core's ``process_group=`` arguments (None: one process)."""
        return dist.group.WORLD if self.world_size > 1 else None


# torch modules whose signatures default a group argument to ``dist.group.WORLD``: imported
# after the default group exists, they keep it in their ``__defaults__`` for the life of the
# process. transformers imports ``torch.distributed.nn`` while it builds a model.
_WORLD_DEFAULT_MODULES = (
    "torch.distributed.nn.functional",
    "torch.distributed.fsdp.sharded_grad_scaler",
    "torch.distributed.optim.zero_redundancy_optimizer",
)


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group`` that leaves no hidden reference to the group.

    A module that evaluates ``group=dist.group.WORLD`` in a signature keeps the default group
    alive after ``destroy_process_group``; the group's gloo threads then end during interpreter
    finalization, where taking the GIL aborts the process ("terminate called without an active
    exception": 7 of 40 two-process runs with torch 2.13, against 0 of 40 with these modules
    imported first). Importing them before the group exists makes their defaults ``None``
    (which torch reads as the default group at call time).
    """
    import importlib

    for name in _WORLD_DEFAULT_MODULES:
        importlib.import_module(name)
    dist.init_process_group(*args, **kwargs)


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment (if any)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        use_nccl = device != "cpu" and torch.cuda.is_available()
        if use_nccl:
            torch.cuda.set_device(local_rank)
        init_process_group(backend="nccl" if use_nccl else "gloo")
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank)


def all_reduce_gradients(parameters: list[torch.nn.Parameter], info: DistInfo) -> None:
    """Sum ``.grad`` over ranks, flattened into one buffer per dtype/device."""
    if info.world_size <= 1:
        return
    buckets: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # every rank must send the same layout
        buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for params in buckets.values():
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op with one process)."""
    if info.world_size > 1:
        dist.barrier()


def shutdown(info: DistInfo | None = None, *, drain: bool = False) -> None:
    """Leave the process group if one was joined (call once, when the process is done).

    drain: every rank reached this call on its normal path (the run ended, or all ranks agreed
    to stop), so wait at a barrier first: no rank tears its group down while another still
    sends to it. Never drain on an error path: a rank that failed would leave the others
    waiting at the barrier. The group is freed here, before interpreter finalization, only if
    nothing else holds it (see :func:`init_process_group` and :func:`_drop_dtensor_caches`);
    a trainer that is already garbage (a reference cycle) is collected here, so its group goes
    with it.
    """
    if (info is None or info.world_size > 1) and dist.is_initialized():
        if drain:
            dist.barrier()
        _drop_dtensor_caches()
        dist.destroy_process_group()
        gc.collect()


def _drop_dtensor_caches() -> None:
    """Empty DTensor's sharding-propagation caches, which hold the default group.

    FSDP2 (``fully_shard``) runs DTensor ops; torch caches their output shardings (in C++ as
    well as in Python), and each holds the DeviceMesh and through it the default process group
    for the life of the process: the group then ends in interpreter finalization like the one
    :func:`init_process_group` guards against (with torch 2.13, one reference left after
    ``fully_shard`` of a single layer, none once these caches are emptied).
    """
    if "torch.distributed.tensor" not in sys.modules:
        return  # no DTensor op ran
    from torch.distributed.tensor import debug

    # torch's own helper for emptying both caches (private: looked up, not assumed)
    clear = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear is not None:
        clear()
