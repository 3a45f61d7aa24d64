"""What a run may do with its run folder (``logging.output_dir``) before any model loads.

The rules (docs/training.md, "What happens to your run when ..."):

- ``--resume`` continues from the newest checkpoint whose files match its manifest (damaged
  newer ones are skipped with a warning); with no checkpoint it is an error, except in a
  folder whose run was preempted before its first step (``preempted.json`` with no checkpoint),
  which starts afresh. ``--resume auto`` starts afresh where there is no checkpoint, and says so.
- A run that starts afresh refuses a folder that holds another run's results (metrics rows,
  evaluation rows, checkpoints) unless ``--overwrite`` clears them.
- A resume whose config differs from the run's ``config.yaml`` in a key that changes the
  training (everything but :data:`NOT_TRAINING`) is refused, listing the keys, unless
  ``--allow-config-change``; every resume is appended to ``resumes.jsonl``.
- The folder and its ``checkpoints/`` must take a file (created, written, flushed, removed).
- Every start (fresh or resumed) appends to ``starts.jsonl`` what the run computes in
  (``model.dtype`` asked, the dtype used, why, and the CPU/GPU signals read:
  :mod:`gmts.scale.auto_dtype`); a fresh start begins the file anew. ``config.yaml`` holds the
  dtype used (``auto`` resolved), so a resume on a machine where ``auto`` picks another dtype
  is a config change.

:func:`plan_start` only reads; :func:`prepare_run_folder` also clears (``--overwrite``) and
checks that the folder is writable. Both raise :class:`RunFolderError` (a ``ValueError`` with
a one-line message: ``gmts train`` exits with status 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gmts.configuration import to_dict
from gmts.train.checkpoint import checkpoint_dir, latest_intact_checkpoint, list_checkpoints
from gmts.train.config import TrainConfig, dump_yaml, load_config
from gmts.train.metrics_log import EVAL_FILE, METRICS_FILE, read_metrics
from gmts.train.preemption import MARKER_FILE

__all__ = [
    "CONFIG_FILE",
    "NOT_TRAINING",
    "RESUMES_FILE",
    "STARTS_FILE",
    "ResumeMode",
    "RunFolderError",
    "RunStart",
    "config_changes",
    "plan_start",
    "prepare_run_folder",
    "record_start",
]

CONFIG_FILE = "config.yaml"
RESUMES_FILE = "resumes.jsonl"
STARTS_FILE = "starts.jsonl"
ResumeMode = bool | Literal["auto"]
"""False: a fresh run; True (``--resume``): continue, a checkpoint must exist; ``"auto"``
(``--resume auto``): continue where a checkpoint exists, else start afresh."""

NOT_TRAINING: tuple[str, ...] = (
    "logging.",  # where and how results are reported
    "checkpoint.",  # when state is saved
    "data.eval_",  # held-out evaluation only
    "threads",  # execution knobs from here on: how the same computation is carried out
    "model.device",
    "model.gradient_checkpointing",
    "model.logits_chunk_size",
    "optim.micro_batch_size",
    "rollout.generation_batch_size",
    "distributed.check_memory",
    "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.kv_cache_gib",
    "rollout.vllm.max_num_seqs",
    "rollout.vllm.max_num_batched_tokens",
    "rollout.vllm.max_model_len",
    "rollout.vllm.enforce_eager",
    "rollout.vllm.prefix_caching",
    "rollout.vllm.sleep_mode",
    "rollout.vllm.sleep_level",
    "rollout.vllm.tensor_parallel_size",
)
"""Config keys (prefixes) that a resume may change freely: reporting, saving, evaluation and
execution settings. Every other key changes the training (score, ratio, objective, lr, seed,
data, model, batch sizes, ...); ``optim.steps`` counts only under a cosine schedule (the only
place the total changes a step's update)."""

# What a run writes into its folder: cleared by --overwrite, nothing else is touched.
_RUN_FILES = (METRICS_FILE, EVAL_FILE, CONFIG_FILE, MARKER_FILE, RESUMES_FILE, STARTS_FILE)
_RUN_DIRS = ("checkpoints", "tensorboard")


class RunFolderError(ValueError):
    """The run folder does not allow what was asked (the message fits on one line)."""


@dataclass(frozen=True)
class RunStart:
    """How a run starts in its folder: from ``checkpoint`` (None: afresh)."""

    checkpoint: Path | None
    changed: dict[str, list[Any]] = field(default_factory=dict)  # key -> [run's, this one's]
    skipped: list[str] = field(default_factory=list)  # damaged checkpoints passed over
    note: str | None = None  # said to the user at the start (why it starts afresh)


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def config_changes(saved: TrainConfig, new: TrainConfig) -> dict[str, list[Any]]:
    """The keys that change the training and differ between ``saved`` and ``new``:
    ``{key: [saved value, new value]}`` (a key one of them lacks has None there)."""
    a, b = _flat(to_dict(saved)), _flat(to_dict(new))
    cosine = "cosine" in (saved.optim.schedule, new.optim.schedule)
    changed = {}
    for key in sorted(a.keys() | b.keys()):
        if key.startswith(NOT_TRAINING) or (key == "optim.steps" and not cosine):
            continue
        if a.get(key) != b.get(key):
            changed[key] = [a.get(key), b.get(key)]
    return changed


def results_in(run_dir: Path) -> list[str]:
    """What of a run's results the folder holds (``metrics.jsonl (3 rows)``, ...)."""
    found = []
    for name in (METRICS_FILE, EVAL_FILE):
        rows = len(read_metrics(run_dir, name))
        if rows:
            found.append(f"{name} ({rows} rows)")
    steps = list_checkpoints(run_dir)
    if steps:
        found.append(f"{len(steps)} checkpoint(s) up to step {steps[-1][0]}")
    return found


def _preempted_before_first_step(run_dir: Path) -> bool:
    try:
        marker = json.loads((run_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("checkpoint") is None


def _saved_config(run_dir: Path) -> TrainConfig | None:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        return load_config(path)
    except (OSError, ValueError) as exc:
        raise RunFolderError(
            f"--resume: cannot read the run's {path} to compare configs ({exc}); "
            "pass --allow-config-change to resume without the comparison"
        ) from None


def plan_start(
    cfg: TrainConfig,
    *,
    resume: ResumeMode = False,
    overwrite: bool = False,
    allow_config_change: bool = False,
) -> RunStart:
    """Decide how the run starts in ``cfg.logging.output_dir`` (reads only; module docstring).

    Raises:
        RunFolderError: the combination is refused (one line naming what to do instead).
    """
    run_dir = Path(cfg.logging.output_dir)
    if resume and overwrite:
        raise RunFolderError(
            "--resume continues the run in the folder and --overwrite clears it: give one"
        )
    skipped: list[str] = []
    if resume:
        checkpoint, skipped = latest_intact_checkpoint(run_dir)
        if checkpoint is not None:
            changed = {}
            saved = None if allow_config_change else _saved_config(run_dir)
            if saved is not None:
                changed = config_changes(saved, cfg)
                if changed:
                    keys = ", ".join(f"{k} ({v[0]!r} -> {v[1]!r})" for k, v in changed.items())
                    raise RunFolderError(
                        f"--resume: the config differs from the run's {run_dir / CONFIG_FILE} "
                        f"in {keys}; resume with the run's values, pass --allow-config-change, "
                        "or start a new run in another logging.output_dir"
                    )
            elif allow_config_change and (run_dir / CONFIG_FILE).is_file():
                try:
                    changed = config_changes(load_config(run_dir / CONFIG_FILE), cfg)
                except (OSError, ValueError):
                    changed = {"config.yaml": ["unreadable", None]}
            return RunStart(checkpoint, changed, skipped)
        damaged = f" ({len(skipped)} damaged, skipped)" if skipped else ""
        if resume is True and not _preempted_before_first_step(run_dir):
            raise RunFolderError(
                f"--resume: no checkpoint to continue from in {checkpoint_dir(run_dir)}"
                f"{damaged}; start afresh with --resume auto or --overwrite, or check "
                "logging.output_dir"
            )
        note = f"no checkpoint in {checkpoint_dir(run_dir)}{damaged}: starting afresh"
    else:
        note = None
    found = results_in(run_dir)
    if found and not overwrite and not _preempted_before_first_step(run_dir):
        raise RunFolderError(
            f"{run_dir} already holds a run ({', '.join(found)}): continue it with --resume, "
            "clear it with --overwrite, or pick another logging.output_dir"
        )
    return RunStart(None, {}, skipped, note)


def _check_writable(folder: Path) -> None:
    """Write, flush and remove a file in ``folder`` (RunFolderError if that fails). The folders
    this creates for the check are removed again: a start that fails later leaves no empty
    run folder or ``checkpoints/`` behind (the run creates them when it writes into them)."""
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd, probe = tempfile.mkstemp(prefix=".gmts-write-check-", dir=folder)
            try:
                os.write(fd, b"gmts")
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(probe)
        finally:
            for path in created:  # deepest first; only while still empty
                with contextlib.suppress(OSError):
                    path.rmdir()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RunFolderError(
            f"cannot write into {folder} ({reason}); make it writable or pick another "
            "logging.output_dir"
        ) from None


def _clear(run_dir: Path) -> None:
    """Remove what a run wrote into ``run_dir`` (nothing else in it)."""
    for name in _RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in _RUN_DIRS:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name)


def prepare_run_folder(
    cfg: TrainConfig,
    *,
    resume: ResumeMode = False,
    overwrite: bool = False,
    allow_config_change: bool = False,
) -> RunStart:
    """:func:`plan_start`, then clear the folder (``overwrite``) and check that it and its
    ``checkpoints/`` take a file (creating neither: the run does, when it writes). Rank 0's
    job; nothing is loaded yet."""
    start = plan_start(
        cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change
    )
    run_dir = Path(cfg.logging.output_dir)
    if overwrite and run_dir.is_dir():
        try:
            _clear(run_dir)
        except OSError as exc:
            raise RunFolderError(f"--overwrite: cannot clear {run_dir} ({exc})") from None
    _check_writable(run_dir)
    _check_writable(checkpoint_dir(run_dir))
    return start


def record_start(
    run_dir: Path,
    cfg: TrainConfig,
    start: RunStart,
    step: int,
    precision: dict[str, Any] | None = None,
) -> None:
    """Write the run's ``config.yaml``; for a resume, append its record to ``resumes.jsonl``
    (time, step, checkpoint, config keys changed, damaged checkpoints skipped); append this
    start to ``starts.jsonl`` (time, step, checkpoint, ``precision``: the
    :meth:`gmts.scale.auto_dtype.DtypeChoice.record` of the run), begun anew by a fresh start."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    checkpoint = None if start.checkpoint is None else str(start.checkpoint)
    if start.checkpoint is not None:
        record = {
            "time": now,
            "step": step,
            "checkpoint": checkpoint,
            "changed": start.changed,
            "skipped": start.skipped,
        }
        with open(run_dir / RESUMES_FILE, "a") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
    line = {"time": now, "step": step, "checkpoint": checkpoint, "precision": precision}
    with open(run_dir / STARTS_FILE, "a" if start.checkpoint is not None else "w") as fh:
        fh.write(json.dumps(line, default=str) + "\n")
    (run_dir / CONFIG_FILE).write_text(dump_yaml(cfg))
