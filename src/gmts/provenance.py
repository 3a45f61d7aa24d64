"""Where a recorded result came from: the machine, the code and the load, written into the JSON
records of ``gmts demo --json`` and of ``benchmarks/`` and read back by ``benchmarks/report.py``.

One module writes the keys (:func:`machine_record`, :func:`git_commit`, :func:`utc_now`,
:func:`load`) and one renders them (:func:`describe_run`, :func:`describe_machine`), so a record
and its rendering cannot disagree about a name.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "FLOAT_PATH_ENV",
    "describe_machine",
    "describe_run",
    "git_commit",
    "load",
    "machine_record",
    "utc_now",
]

FLOAT_PATH_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "OMP_NUM_THREADS")
"""Environment variables that change the floating-point path (recorded when set)."""

SIMD_FLAGS = ("avx2", "avx512f", "amx_tile", "avx512_bf16", "amx_bf16")
"""The CPU flags that decide which kernels torch runs and whether bf16 is native (recorded when
present; gmts.scale.auto_dtype)."""


def _run_text(cmd: list[str]) -> str:
    """``cmd``'s standard output, stripped ("" when it cannot run)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def load() -> str:
    """The machine's load now: ``uptime``'s line ("?" where it cannot run)."""
    return _run_text(["uptime"]) or "?"


def utc_now() -> str:
    """The time now, as every record writes it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cpu() -> tuple[str, list[str]]:
    """The CPU's model name and its SIMD flags from ``/proc/cpuinfo`` (Linux)."""
    cpu, flags = platform.processor() or "?", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    return cpu, sorted(f for f in flags if f in SIMD_FLAGS)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_record() -> dict[str, Any]:
    """What a result's arithmetic and speed depend on besides its settings: the CPU and its
    SIMD flags, the kernels torch picked, the GPU, the versions, the environment that changes
    the floating-point path, the memory and the load (``uptime``: call it before the work, and
    :func:`load` after)."""
    import torch

    try:
        import transformers

        transformers_version: str | None = transformers.__version__
    except ImportError:  # pragma: no cover - the train extra requires it
        transformers_version = None
    cpu, simd = _cpu()
    gpu = bool(torch.cuda.is_available())
    return {
        "cpu": cpu,
        "model_name": cpu,
        "nproc": _usable_cpus(),
        "lscpu_head": _run_text(["lscpu"]).splitlines()[:15],
        "simd_flags": simd,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": gpu,
        "gpu_name": torch.cuda.get_device_name(0) if gpu else None,
        "memory": _run_text(["free", "-g"]).splitlines()[:2],
        "torch": torch.__version__,
        "transformers": transformers_version,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "env": {k: os.environ[k] for k in FLOAT_PATH_ENV if k in os.environ},
        "uptime": load(),
    }


def git_commit(where: str | os.PathLike[str], *, changes_in: str | None = None) -> str | None:
    """The short commit of the git checkout holding ``where`` (None outside one), with
    ``-dirty`` when the checkout's ``changes_in`` folder (e.g. "benchmarks") has uncommitted
    changes outside its ``results`` folder."""
    folder = str(Path(where).resolve())
    head = _run_text(["git", "-C", folder, "rev-parse", "--short", "HEAD"])
    if not head:
        return None
    if changes_in is None:
        return head
    status = _run_text(["git", "-C", folder, "status", "--porcelain", "--", changes_in])
    dirty = [ln for ln in status.splitlines() if f"{changes_in}/results" not in ln]
    return head + ("-dirty" if dirty else "")


# ----------------------------------------------------------------------------- rendering


def describe_run(record: dict[str, Any]) -> str:
    """The provenance line of one record (markdown): when, which commit, which command, the
    threads, the wall time and the load before and after."""
    machine = record.get("machine", {})
    return (
        f"_Run finished {record.get('date')}, code at commit `{record.get('commit')}` with "
        f"`{record.get('command')}` ({record.get('threads')} torch thread(s), "
        f"{record.get('wall_s')} s wall). Load before: `{machine.get('uptime', '?')}`; "
        f"after: `{record.get('uptime_after', '?')}`._"
    )


def _load_average(uptime: Any) -> str:
    return "`" + str(uptime).split("load average:")[-1].strip() + "`"


def describe_machine(records: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The machine of the first record (markdown lines) and, per record, the row
    ``[benchmark, finished, wall, load before, load after]``."""
    m = records[0].get("machine", {}) if records else {}
    lines = [
        f"- `nproc`: {m.get('nproc')}; {m.get('platform')}; Python {m.get('python')}, "
        f"torch {m.get('torch')}; GPU: {m.get('gpu_name') or ('yes' if m.get('gpu') else 'none')}.",
        "- `lscpu | head`:",
        "",
        "```",
        *m.get("lscpu_head", []),
        "```",
        "",
        "- `free -g`: `" + " / ".join(" ".join(x.split()) for x in m.get("memory", [])) + "`",
        "- Load (`uptime`) before and after each benchmark:",
        "",
    ]
    rows = [
        [
            r.get("benchmark", "?"),
            r.get("date", "?"),
            f"{r.get('wall_s', '?')} s",
            _load_average(r.get("machine", {}).get("uptime", "?")),
            _load_average(r.get("uptime_after", "?")),
        ]
        for r in records
    ]
    return lines, rows
