"""Atomic training checkpoints: write to a temporary folder, then rename it into place.

Layout of ``<run_dir>/checkpoints/step_000010/``::

    model/              the policy (save_pretrained + tokenizer: a usable Hugging Face model dir;
                        for a LoRA run a peft adapter folder, its base named in adapter_config.json)
    trainer_state.pt    optimizer, scheduler, RNG states, data position, step

A folder only ever appears under its final name complete (``os.replace`` of a finished
temporary folder), so a run killed at any moment leaves either the previous checkpoints or the
new one, never half of one. Leftover ``.tmp-*`` folders are ignored on resume and removed by the next save.
Folders are deleted (an older checkpoint beyond ``keep``, or the same step written again) by
renaming them to a ``.tmp-`` name first, so a kill during a deletion cannot leave a
``step_NNNNNN`` folder that looks complete but has lost files either.

Before the rename every file and folder is flushed to disk (fsync) and ``manifest.json`` (each
file's size and sha256, :mod:`gmts.models.manifest`) is written last, so a power loss cannot
leave a complete-looking folder with short files that nothing detects:
:func:`latest_intact_checkpoint` skips a folder whose files do not match its manifest. A write
that fails (read-only folder, disk full) removes its temporary folder and raises
:class:`CheckpointWriteError`; the checkpoints already written stay.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from gmts._progress import Progress
from gmts.models.loading import CHECKPOINTS_DIR, step_dir_name, step_of
from gmts.models.manifest import fsync_dir, newest_intact, write_manifest


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (the message fits on one line and names the newest
    checkpoint that was)."""


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states (python, torch CPU, CUDA when present, numpy when installed)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the RNG states of :func:`capture_rng_state`."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/checkpoints``."""
    return Path(run_dir) / CHECKPOINTS_DIR


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        step = step_of(p.name)
        if step is not None and p.is_dir() and (p / "trainer_state.pt").is_file():
            found.append((step, p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None (its files are not verified: see
    :func:`latest_intact_checkpoint`)."""
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1][1] if ckpts else None


def latest_intact_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint of a run whose files match its manifest (None: there is none),
    and one line per newer damaged checkpoint skipped (each also warned)."""
    return newest_intact(list_checkpoints(run_dir))


def _remove_temporaries(root: Path) -> None:
    for p in root.glob("*.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    keep: int,
    weights: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and delete all but the newest ``keep``.

    ``trainer_state`` holds everything but the weights (optimizer, scheduler, RNG, data
    position, step); it is saved with ``torch.save``. ``weights``: the whole state dict when
    the model itself holds only a shard (FSDP); None reads the model.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")  # [:-0] would keep everything
    root = checkpoint_dir(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f"{final.name}.tmp-{os.getpid()}"
    # seconds for a real model (weights, optimizer state, fsync, checksums): a bar on a
    # terminal, the parts written so far
    shown = Progress(f"saving {final.name}", 4, "parts")
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_temporaries(root)
        tmp.mkdir()
        weights = _without_tied_copies(model, weights)
        model.save_pretrained(tmp / "model", state_dict=weights, safe_serialization=True)
        _restore_architecture(tmp / "model", model)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        shown.update()
        torch.save(trainer_state, tmp / "trainer_state.pt")
        shown.update()
        _fsync_tree(tmp)
        shown.update()
        write_manifest(tmp)  # last: its presence says the rest is on disk
        shown.update()
    except (OSError, RuntimeError) as exc:  # torch.save reports a full disk as RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        newest = latest_checkpoint(run_dir)
        kept = f"the newest checkpoint is still {newest}" if newest else "no checkpoint was kept"
        reason = _first_line(exc)
        raise CheckpointWriteError(f"cannot write checkpoint {final} ({reason}); {kept}") from exc
    finally:
        shown.close()
    if final.exists():  # a re-run of the same step: replace it
        _discard(final)
    os.replace(tmp, final)
    fsync_dir(root)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        _discard(old)
    return final


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _discard(folder: Path) -> None:
    """Delete a checkpoint folder, first renaming it out of the ``step_NNNNNN`` namespace: a
    kill in the middle of the deletion leaves a ``.tmp-`` folder (ignored, removed by the next
    save), never a ``step_NNNNNN`` folder whose ``trainer_state.pt`` outlived its weights."""
    doomed = folder.with_name(f"{folder.name}.tmp-discard-{os.getpid()}")
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _without_tied_copies(
    model: torch.nn.Module, weights: dict[str, torch.Tensor] | None
) -> dict[str, torch.Tensor] | None:
    """``weights`` less the copies of tied weights (e.g. ``lm_head.weight`` of a model whose
    output layer is its embedding). ``save_pretrained`` drops such a copy only when it shares
    storage with its source, which the tensors of FSDP's gathered state dict do not: without
    this a tied model's FSDP checkpoint held its embedding twice."""
    if weights is None:
        return None
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    copies = {
        target
        for target, source in tied.items()
        if target in weights and source in weights and torch.equal(weights[target], weights[source])
    }
    return {name: tensor for name, tensor in weights.items() if name not in copies}


def _restore_architecture(folder: Path, model: Any) -> None:
    """``save_pretrained`` records the model's class name; FSDP2 renames the class to
    ``FSDP<name>``, which no loader knows. Write the model's own class name back."""
    import json

    from gmts.scale.fsdp import unwrapped_class_name

    name = unwrapped_class_name(model)
    path = folder / "config.json"
    if not path.is_file():  # a LoRA run's adapter folder: adapter_config.json names the base
        return
    config = json.loads(path.read_text())
    if config.get("architectures") != [name]:
        config["architectures"] = [name]
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The ``trainer_state`` saved in checkpoint folder ``path`` (tensors on CPU).

    Raises:
        ValueError: the file cannot be read (one line naming it: a checkpoint without a
            manifest is not verified before this).
    """
    file = Path(path) / "trainer_state.pt"
    try:
        return torch.load(file, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError) as exc:
        raise ValueError(f"--resume: cannot read {file} ({_first_line(exc)})") from exc


def _fsync_tree(path: Path) -> None:
    """Flush every file under ``path`` and every folder's entries, deepest first."""
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    for folder in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(folder)
    fsync_dir(path)
