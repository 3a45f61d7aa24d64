"""``model.dtype: auto``: bf16 compute where this device computes bf16 natively, float32 elsewhere.

bf16 compute (over float32 master weights, :mod:`gmts.scale.precision`) pays where the hardware
has bf16 arithmetic and costs where it is emulated:

- CPU with AVX512-BF16 (AMD EPYC, 2 threads, torch 2.13): a forward + backward of SmolLM2-135M
  over 24 rows x 160 tokens took 13.92 s under ``torch.autocast("cpu", dtype=torch.bfloat16)``
  against 23.65 s in float32 (0.59x, issue 34); AMX-BF16 has wider bf16 units still.
- CPU with AVX2 only: torch emulates bf16, about 4x slower than float32 (docs/results.md
  section 8).
- GPU: bf16 tensor cores from compute capability 8.0 (Ampere); older GPUs emulate it.

:func:`choose_dtype` is the one decision. It reads (:func:`read_bf16_signals`, replaceable in
tests) the CPU's flags (``/proc/cpuinfo``), the kernels torch runs
(``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY`` lowers), whether
oneDNN computes bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``) and the ISA cap of
``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA``; on CUDA the GPU's bf16 support. bf16 on a CPU
needs all of: AVX512-BF16 or AMX-BF16 in the flags, torch's AVX512 kernels, and oneDNN allowed
an ISA with bf16 instructions; so a run forced onto AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2``
or ``ONEDNN_MAX_CPU_ISA=AVX2``, README) stays float32. Arm's bf16 extension is not measured
here: ``auto`` keeps float32 there and says so.

The returned :class:`DtypeChoice` carries what was read and why, as one line for the run's
first lines (:meth:`DtypeChoice.line`, with the key that changes it) and as a record
(:meth:`DtypeChoice.record`) for the run folder.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from gmts.scale.precision import DTYPES

__all__ = [
    "AUTO",
    "BF16_CPU_FLAGS",
    "DTYPE_NAMES",
    "ONEDNN_ISA_ENV",
    "PLANNED_GPU_DTYPE",
    "Bf16Signals",
    "DtypeChoice",
    "bf16_note",
    "choose_dtype",
    "cpu_bf16_support",
    "planned_dtype",
    "read_bf16_signals",
]

AUTO = "auto"
DTYPE_NAMES: tuple[str, ...] = (AUTO, *DTYPES)
"""What ``model.dtype`` accepts: ``auto`` (:func:`choose_dtype`) or a compute dtype."""
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""x86 CPU flags of bf16 dot-product instructions: where ``auto`` takes bf16 on a CPU."""
ONEDNN_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
"""oneDNN's ISA cap, under its two names (the first one set wins, as in oneDNN)."""

# oneDNN's ISA names (dnnl_cpu_isa_t) -> bit masks; an ISA has bf16 dot products when its
# mask holds AVX512_CORE_BF16's bits (0xe7). ALL / DEFAULT: no cap.
_ONEDNN_ISA_BITS = {
    "SSE41": 0x1,
    "AVX": 0x3,
    "AVX2": 0x7,
    "AVX2_VNNI": 0xF,
    "AVX2_VNNI_2": 0x1F,
    "AVX512_CORE": 0x27,
    "AVX512_CORE_VNNI": 0x67,
    "AVX512_CORE_BF16": 0xE7,
    "AVX10_1_512": 0x1EF,
    "AVX512_CORE_FP16": 0x1EF,
    "AVX10_1_512_AMX": 0xFEF,
    "AVX512_CORE_AMX": 0xFEF,
    "AVX10_1_512_AMX_FP16": 0x1FEF,
    "AVX512_CORE_AMX_FP16": 0x1FEF,
    "ALL": -1,
    "DEFAULT": -1,
}
_BF16_BITS = 0xE7


def cpu_bf16_support(cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """The bf16 instructions of this CPU, or None: ``"amx_bf16"``, ``"avx512_bf16"`` (x86) or
    ``"bf16"`` (Arm), read from the flags of ``cpuinfo`` (None where it cannot be read)."""
    try:
        with open(cpuinfo) as handle:
            text = handle.read()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return next((f for f in ("amx_bf16", "avx512_bf16", "bf16") if f in flags), None)


@dataclass(frozen=True)
class Bf16Signals:
    """What decides whether bf16 pays on a device, as read (:func:`read_bf16_signals`).

    Attributes:
        device: ``"cpu"`` or ``"cuda"``.
        cpu_flag: the CPU's bf16 flag (:func:`cpu_bf16_support`), or None.
        torch_kernels: ``torch.backends.cpu.get_cpu_capability()`` (``AVX512``, ``AVX2``, ...).
        onednn_bf16: oneDNN computes bf16 (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``).
        onednn_isa: ``NAME=VALUE`` of oneDNN's ISA cap when set (:data:`ONEDNN_ISA_ENV`).
        aten_env: ``ATEN_CPU_CAPABILITY`` when set.
        gpu: CUDA: the GPU's name and compute capability.
        gpu_bf16: CUDA: the GPU has bf16 arithmetic (not emulated).
    """

    device: str
    cpu_flag: str | None = None
    torch_kernels: str | None = None
    onednn_bf16: bool | None = None
    onednn_isa: str | None = None
    aten_env: str | None = None
    gpu: str | None = None
    gpu_bf16: bool | None = None

    def describe(self) -> str:
        """What was read, in a few words (``cpu flag avx512_bf16, torch kernels AVX512, ...``)."""
        if self.device == "cuda":
            return f"GPU {self.gpu}, bf16 {'native' if self.gpu_bf16 else 'emulated'}"
        parts = [
            f"cpu flag {self.cpu_flag or 'none (no avx512_bf16 / amx_bf16)'}",
            f"torch kernels {self.torch_kernels}",
            f"oneDNN bf16 {'yes' if self.onednn_bf16 else 'no'}",
        ]
        parts += [env for env in (self.aten_env, self.onednn_isa) if env]
        return ", ".join(parts)


def _onednn_isa_env() -> str | None:
    name = next((n for n in ONEDNN_ISA_ENV if os.environ.get(n)), None)
    return None if name is None else f"{name}={os.environ[name]}"


def _onednn_bf16() -> bool:
    """Whether oneDNN computes bf16 in this process (its ISA cap applied); False on a torch
    built without oneDNN."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # no mkldnn ops in this build
        return False


def read_bf16_signals(device: torch.device) -> Bf16Signals:
    """Read what :func:`choose_dtype` decides from, for ``device`` (CPU flags and kernels, or
    the GPU)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        return Bf16Signals(
            device="cuda",
            gpu=f"{name} (compute capability {major}.{minor})",
            gpu_bf16=torch.cuda.is_bf16_supported(including_emulation=False),
        )
    aten = os.environ.get("ATEN_CPU_CAPABILITY")
    return Bf16Signals(
        device=device.type,
        cpu_flag=cpu_bf16_support(),
        torch_kernels=torch.backends.cpu.get_cpu_capability(),
        onednn_bf16=_onednn_bf16(),
        onednn_isa=_onednn_isa_env(),
        aten_env=None if aten is None else f"ATEN_CPU_CAPABILITY={aten}",
    )


@dataclass(frozen=True)
class DtypeChoice:
    """The compute dtype of a run and why.

    Attributes:
        asked: the value given (``auto``, ``float32``, ``bfloat16``).
        dtype: the compute dtype the run uses (``float32`` or ``bfloat16``).
        reason: why, in words (what was read and which rule decided).
        signals: what was read.
    """

    asked: str
    dtype: str
    reason: str
    signals: Bf16Signals

    def line(self, key: str = "model.dtype") -> str:
        """The run's first-lines report: ``model.dtype: auto -> bfloat16 (...); ...``."""
        if self.asked == AUTO:
            other = "float32" if self.dtype == "bfloat16" else "bfloat16"
            return (
                f"{key}: auto -> {self.dtype} ({self.reason}; read: "
                f"{self.signals.describe()}); {key}={other} to change"
            )
        return f"{key}: {self.dtype} (as set; {self.reason}; read: {self.signals.describe()})"

    def record(self) -> dict[str, Any]:
        """The choice as plain JSON types (the run folder's record)."""
        return {
            "asked": self.asked,
            "dtype": self.dtype,
            "reason": self.reason,
            "signals": asdict(self.signals),
        }


def _check_name(asked: str) -> None:
    if asked not in DTYPE_NAMES:
        raise ValueError(f"model.dtype: expected one of {list(DTYPE_NAMES)}, got {asked!r}")


def _bf16_verdict(s: Bf16Signals) -> tuple[bool, str]:
    """(bf16 pays here, why): the rule of the module docstring."""
    if s.device == "cuda":
        if s.gpu_bf16:
            return True, "the GPU has bf16 tensor cores"
        return False, "the GPU has no bf16 arithmetic (compute capability < 8.0): emulated"
    if s.device != "cpu":
        return False, f"auto knows CPUs and CUDA GPUs, not {s.device}"
    if s.cpu_flag == "bf16":
        return False, "Arm's bf16 extension is not measured against float32 here"
    if s.cpu_flag not in BF16_CPU_FLAGS:
        return False, "the CPU has no bf16 instructions: torch emulates bf16 (~4x slower)"
    if not (s.torch_kernels or "").startswith("AVX512"):
        return False, f"torch runs its {s.torch_kernels} kernels, not AVX512"
    if s.onednn_isa is not None:
        value = s.onednn_isa.partition("=")[2].upper()
        bits = _ONEDNN_ISA_BITS.get(value)
        if bits is None:
            return False, f"{s.onednn_isa} is not an ISA name of oneDNN"
        if bits != -1 and bits & _BF16_BITS != _BF16_BITS:
            return False, f"{s.onednn_isa} keeps oneDNN below AVX512_CORE_BF16"
    if not s.onednn_bf16:
        return False, "oneDNN does not compute bf16 in this process"
    return True, "the CPU computes bf16 natively"


def choose_dtype(
    asked: str, device: torch.device, signals: Bf16Signals | None = None
) -> DtypeChoice:
    """The compute dtype for ``model.dtype=asked`` on ``device``.

    ``auto`` takes ``bfloat16`` where bf16 runs natively (module docstring) and ``float32``
    elsewhere; ``float32`` and ``bfloat16`` are taken as given, with a warning in the reason
    when bf16 is asked for where it is emulated. ``signals``: what to decide from (default:
    :func:`read_bf16_signals` of ``device``).

    Raises:
        ValueError: ``asked`` is not one of :data:`DTYPE_NAMES`.
    """
    _check_name(asked)
    signals = read_bf16_signals(device) if signals is None else signals
    native, why = _bf16_verdict(signals)
    if asked == AUTO:
        return DtypeChoice(AUTO, "bfloat16" if native else "float32", why, signals)
    if asked == "bfloat16" and not native:
        why = f"slower than float32 here: {why}"
    elif asked == "float32" and native:
        why = f"{why}: auto would take bfloat16"
    return DtypeChoice(asked, asked, why, signals)


PLANNED_GPU_DTYPE = "bfloat16"
"""What ``auto`` counts as in a plan for GPUs (``gmts plan``): the GPUs it plans for (A100,
H100, H200) have bf16 tensor cores."""


def planned_dtype(asked: str, *, gpu: bool) -> str:
    """``model.dtype`` as a memory plan counts it: ``auto`` is :data:`PLANNED_GPU_DTYPE` in a
    plan for GPUs (made anywhere, for GPUs of compute capability >= 8.0) and what
    :func:`choose_dtype` picks on this machine's CPU otherwise; a dtype name is itself."""
    _check_name(asked)
    if asked != AUTO:
        return asked
    return PLANNED_GPU_DTYPE if gpu else choose_dtype(AUTO, torch.device("cpu")).dtype


def bf16_note(device: torch.device, signals: Bf16Signals | None = None) -> str:
    """Whether bf16 is native on ``device``, why, and what was read, in one clause (for the
    first lines of a command whose dtype is set by hand: ``gmts eval``, ``gmts analyze``)."""
    signals = read_bf16_signals(device) if signals is None else signals
    native, why = _bf16_verdict(signals)
    return f"bf16 {'native' if native else 'not native'} here: {why}; read: {signals.describe()}"
