"""Helpers shared by every benchmark: timing, machine description, peak memory, result files.

Every benchmark module exposes ``run(options: BenchOptions) -> dict`` and returns a result
record (plain JSON types) with at least ``rows`` (one dict per measured configuration) and
``goals`` (one dict per goal of issue 7: name, target, measured, met). ``run.py`` adds the
machine description, the command line and the date, and writes ``results/<name>.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmts.provenance import git_commit as provenance_commit
from gmts.provenance import machine_record
from gmts.provenance import utc_now as utc_now  # re-exported for the benchmarks

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"

# Hard cap on what one benchmark process may allocate (bytes). The machine is shared; a
# variant that would need more is skipped and the skip is recorded, never silently dropped.
MEMORY_CAP_BYTES = 12 * 1024**3


@dataclass(frozen=True)
class BenchOptions:
    """What every benchmark receives from ``run.py``.

    quick: tiny shapes and few repeats (smoke test / CI); the figures are not meaningful.
    threads: torch intra-op threads in every benchmark process (1 keeps a shared box fair).
    device: "cpu" or "cuda[:N]" for the selection, log-prob and overhead benchmarks (item 6);
        on CUDA every timing ends with a device synchronisation and peak memory is the CUDA
        allocator's high-water mark.
    out_dir: where result JSON (and any figure) is written.
    extra: benchmark-specific options parsed by run.py (e.g. the learning-sweep subset).
    """

    quick: bool = False
    threads: int = 1
    out_dir: Path = DEFAULT_RESULTS_DIR
    extra: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        check_device(self.device)


def check_device(device: str) -> str:
    """``device`` if it is "cpu", "cuda" or "cuda:N" and usable here; else ValueError."""
    if device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if device != "cpu":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device")
    return device


def synchronizer(device: str) -> Callable[[], None]:
    """A function that waits for queued work on ``device`` (a no-op on the CPU)."""
    if device == "cpu":
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(device)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> dict[str, Any]:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; return seconds.

    Returns ``{"median_s", "min_s", "max_s", "times_s"}``; every repeat is kept so the spread
    can be judged from the JSON.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return summarize_times(times)


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Time several functions round-robin (A B C A B C ...) so that load changes on a shared
    machine hit every variant alike; a variant that raises is recorded as failed. ``sync``
    (e.g. ``torch.cuda.synchronize``) runs before the clock starts and before it stops.

    Returns ``{name: {"ok": True, "median_s", ...}}`` or ``{name: {"ok": False, "error"}}``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sync = sync or (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in fns}
    failed: dict[str, str] = {}
    for round_index in range(warmup + repeats):
        for name, fn in fns.items():
            if name in failed:
                continue
            sync()
            start = time.perf_counter()
            try:
                fn()
                sync()
            except (RuntimeError, ValueError, MemoryError) as error:
                failed[name] = f"{type(error).__name__}: {error}"
                continue
            if round_index >= warmup:
                times[name].append(time.perf_counter() - start)
    out: dict[str, dict[str, Any]] = {}
    for name in fns:
        if name in failed:
            out[name] = {"ok": False, "error": failed[name]}
        else:
            out[name] = {"ok": True, **summarize_times(times[name])}
    return out


def summarize_times(times: list[float]) -> dict[str, Any]:
    """Median, min, max and the raw list of a list of durations (seconds)."""
    if not times:
        raise ValueError("times must not be empty")
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "times_s": [round(t, 6) for t in times],
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None where either side is missing or zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def goal(name: str, target: str, measured: str, met: bool | None) -> dict[str, Any]:
    """One goal of the issue: ``met`` is None where it could not be measured in this run."""
    return {"name": name, "target": target, "measured": measured, "met": met}


# --------------------------------------------------------------------------------------
# memory


def proc_status_kib(key: str) -> int | None:
    """A ``kB`` field of /proc/self/status (e.g. "VmHWM", "VmRSS") in KiB, None if absent."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: write 5 to clear_refs).

    Returns False where the kernel refuses; callers then fall back to a delta of the
    lifetime peak, which over-counts anything that was freed before the measurement.
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None off Linux)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------------------
# machine and provenance


def machine_description() -> dict[str, Any]:
    """The machine, its versions and its load now (:func:`gmts.provenance.machine_record`)."""
    return machine_record()


def git_commit() -> str:
    """The commit of the code that ran (with ``-dirty`` where the benchmarks differ from it)."""
    return provenance_commit(REPO_ROOT, changes_in="benchmarks") or ""


def write_result(out_dir: Path, name: str, record: dict[str, Any]) -> Path:
    """Write ``record`` as ``out_dir/<name>.json`` (indented, sorted keys) and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def python_env() -> dict[str, str]:
    """Environment for benchmark subprocesses: offline Hugging Face, src on the path."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


TRL_ON_CPU: dict[str, Any] = dict(
    use_cpu=True,
    bf16=False,
    gradient_checkpointing=False,
    disable_dropout=True,
    shuffle_dataset=False,
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    dataloader_num_workers=0,
)
"""``GRPOConfig`` settings of every TRL contender: float32 on the CPU, no gradient
checkpointing or dropout, the dataset in its order, a log row every step, nothing saved or
reported, no data-loading workers."""


def child_env(threads: int) -> dict[str, str]:
    """:func:`python_env` for a measuring child process: ``OMP_NUM_THREADS`` = ``threads`` and
    an in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: its worker, and so its
    weights, reachable from the caller)."""
    env = python_env()
    env["OMP_NUM_THREADS"] = str(threads)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def standalone_record(
    name: str,
    *,
    quick: bool,
    commit: str,
    machine_before: dict[str, Any],
    load_before: tuple[float, float, float],
    started: float,
    argv: list[str],
    executable: str,
) -> dict[str, Any]:
    """The provenance of a standalone benchmark's record (one not run through ``run.py``): its
    name, the quick flag, the date, the commit, the command, the machine and its load
    (``uptime``) before and after, and the wall time since ``started`` (``perf_counter``)."""
    return {
        "name": name,
        "quick": quick,
        "date": utc_now(),
        "commit": commit,
        "command": " ".join([Path(executable).name, *argv]),
        "machine": machine_before,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "uptime_after": machine_description()["uptime"],
        "wall_s": time.perf_counter() - started,
    }


def core_api(name: str) -> Any:
    """``gmts.<name>`` (the public core API); falls back to ``gmts.core.<module>.<name>`` so the
    benchmarks also run on a checkout where the top-level re-exports have not landed yet."""
    import importlib

    import gmts

    if hasattr(gmts, name):
        return getattr(gmts, name)
    for module in ("selection", "logprobs", "objectives", "scores", "step", "advantages", "config"):
        try:
            mod = importlib.import_module(f"gmts.core.{module}")
        except ImportError:
            continue
        if hasattr(mod, name):
            return getattr(mod, name)
    raise ImportError(f"gmts has no {name!r} (is the core installed?)")
