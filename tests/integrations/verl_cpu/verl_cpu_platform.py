"""Test scaffolding: a "cpu" platform for verl 0.9.1, so its trainer runs without a GPU.

Loaded in every verl process through verl's own hook ``VERL_USE_EXTERNAL_MODULES`` (and selected
with ``VERL_PLATFORM=cpu``). Not product code: it exists so the GMTS plugin can be tested on
verl's real entry point on a CPU-only CI machine.

- ``PlatformRegistry.register(platform="cpu")``: verl has no CPU platform
  (``plugin/platform/platform_manager.py``) and would reset ``trainer.device=cpu`` to cuda.
- Its device module is ``torch.cpu`` plus the memory and RNG calls verl makes on a device module
  (constants / no-ops on CPU) and ``get_device_name() == "CPU"`` (verl's FLOPs table).
- The Ray resource stays "GPU": verl asks Ray for GPUs unconditionally
  (``single_controller/ray/base.py``), so the run starts Ray with one logical GPU.
- ``initialize_global_process_group_ray`` gets the backend "cpu:gloo" (verl builds
  "cpu:gloo,<device>:<backend>", which is "cpu:gloo,cpu:gloo" here and invalid).
- FSDP2's ``CPUOffloadPolicy`` (verl gives it to forward-only engines: the reference model)
  without pinned memory, which needs an accelerator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import types
from typing import Any

import torch
import torch.distributed.fsdp as torch_fsdp
import verl.utils.distributed as verl_distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

_MEMORY = 64 << 30  # bytes reported as total / free memory


def _device_module() -> types.ModuleType:
    module = types.ModuleType("verl_cpu_device")
    for name in ("Event", "Stream", "current_stream", "stream", "synchronize", "is_available"):
        setattr(module, name, getattr(torch.cpu, name))
    module.device_count = lambda: 1
    module.set_device = lambda *args, **kwargs: None
    module.current_device = lambda: 0
    module.empty_cache = lambda: None
    module.ipc_collect = lambda: None
    module.set_per_process_memory_fraction = lambda *args, **kwargs: None
    module.mem_get_info = lambda *args, **kwargs: (_MEMORY, _MEMORY)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        setattr(module, name, lambda *args, **kwargs: 0)
    module.max_memory_reserved = lambda *args, **kwargs: 0
    module.reset_peak_memory_stats = lambda *args, **kwargs: None
    module.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    module.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_device_name = lambda *args, **kwargs: "CPU"
    return module


_DEVICE = _device_module()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """verl's platform interface on the CPU (one logical device, gloo collectives)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _DEVICE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return torch.device("cpu")  # verl passes it to .to()

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


_init_process_group = verl_distributed.initialize_global_process_group_ray


def _init_process_group_gloo(timeout_second: Any = None, backend: Any = None) -> None:
    _init_process_group(timeout_second=timeout_second, backend="cpu:gloo")


verl_distributed.initialize_global_process_group_ray = _init_process_group_gloo


@dataclasses.dataclass
class CPUOffloadPolicyUnpinned(torch_fsdp.CPUOffloadPolicy):
    """FSDP2's CPU offload policy with ``pin_memory`` forced off (pinning needs a device)."""

    def __post_init__(self) -> None:
        self.pin_memory = False


torch_fsdp.CPUOffloadPolicy = CPUOffloadPolicyUnpinned  # bound by verl.utils.fsdp_utils on import
if "verl.utils.fsdp_utils" in sys.modules:
    sys.modules["verl.utils.fsdp_utils"].CPUOffloadPolicy = CPUOffloadPolicyUnpinned
