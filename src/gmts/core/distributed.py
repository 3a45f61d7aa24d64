"""Small helpers around ``torch.distributed`` that are no-ops without a process group.

Every helper is a collective when a process group is given: all ranks must call it in the
same order with tensors of the same shape and dtype. ``process_group=None`` means "no
communication" (single process), even if a default group is initialised; pass
``torch.distributed.group.WORLD`` to use the default group.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "is_distributed",
    "get_rank",
    "get_world_size",
    "all_reduce_sum",
    "all_reduce_max",
    "all_reduce_min",
    "all_gather_stack",
]


def is_distributed(process_group: Any) -> bool:
    """True when ``process_group`` is given and torch.distributed is initialised."""
    if process_group is None:
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "process_group was given but torch.distributed is not initialised "
            "(call torch.distributed.init_process_group first, or pass process_group=None)"
        )
    return True


def get_rank(process_group: Any) -> int:
    """Rank inside ``process_group`` (0 without one)."""
    if not is_distributed(process_group):
        return 0
    import torch.distributed as dist

    return dist.get_rank(group=process_group)


def get_world_size(process_group: Any) -> int:
    """Number of ranks in ``process_group`` (1 without one)."""
    if not is_distributed(process_group):
        return 1
    import torch.distributed as dist

    return dist.get_world_size(group=process_group)


def _all_reduce(tensor: torch.Tensor, process_group: Any, op_name: str) -> torch.Tensor:
    if not is_distributed(process_group):
        return tensor
    import torch.distributed as dist

    out = tensor.clone()
    dist.all_reduce(out, op=getattr(dist.ReduceOp, op_name), group=process_group)
    return out


def all_reduce_sum(tensor: torch.Tensor, process_group: Any) -> torch.Tensor:
    """Element-wise sum over ranks (a new tensor; the input is not modified)."""
    return _all_reduce(tensor, process_group, "SUM")


def all_reduce_max(tensor: torch.Tensor, process_group: Any) -> torch.Tensor:
    """Element-wise maximum over ranks."""
    return _all_reduce(tensor, process_group, "MAX")


def all_reduce_min(tensor: torch.Tensor, process_group: Any) -> torch.Tensor:
    """Element-wise minimum over ranks."""
    return _all_reduce(tensor, process_group, "MIN")


def all_gather_stack(tensor: torch.Tensor, process_group: Any) -> torch.Tensor:
    """Stack ``tensor`` (same shape on every rank) from all ranks: ``(world_size, *shape)``."""
    if not is_distributed(process_group):
        return tensor.unsqueeze(0)
    import torch.distributed as dist

    world = dist.get_world_size(group=process_group)
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor.contiguous(), group=process_group)
    return torch.stack(parts)
