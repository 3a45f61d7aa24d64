"""A checkpoint folder's manifest: every file's size and sha256, written last.

``<checkpoint>/manifest.json``::

    {"version": 1, "block_bytes": 67108864,
     "files": {"model/model.safetensors": {"bytes": 1234, "sha256": ["<block 0>", ...]}, ...}}

A file's sha256 is taken per 64 MiB block, so the blocks of every file hash in parallel
(hashlib releases the GIL): one core hashed 0.4 GB/s on the shared 2-core test machine, and a
7B run's checkpoint (float32 weights + AdamW state, about 84 GB) is one 56 GB file.

The trainer writes it after every other file of the checkpoint is flushed to disk, so a folder
whose manifest is missing or disagrees with its files was not written completely (a power loss
before the data reached the disk) or was damaged later. :func:`newest_intact` is how both
``--resume`` and ``gmts eval --model RUN`` pick a checkpoint: the newest one whose files match
its manifest, with a warning naming the file of each damaged one skipped. A folder without a
manifest (written before manifests existed) is used unverified.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = [
    "MANIFEST_FILE",
    "DamagedCheckpointWarning",
    "fsync_dir",
    "manifest_problem",
    "newest_intact",
    "write_manifest",
]

MANIFEST_FILE = "manifest.json"
_VERSION = 1
_BLOCK = 1 << 26  # 64 MiB: the unit hashed in parallel
_CHUNK = 1 << 22  # 4 MiB reads


class DamagedCheckpointWarning(UserWarning):
    """A checkpoint whose files do not match its manifest was skipped."""


def _block_sha256(path: Path, offset: int, block: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(offset)
        left = block
        while left > 0 and (chunk := fh.read(min(_CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _sha256_blocks(paths: list[Path], block: int = _BLOCK) -> list[list[str]]:
    """Each file's sha256 per ``block`` bytes (an empty file: one digest of nothing), the
    blocks of all files hashed on a thread per CPU."""
    jobs = [
        (i, p, off) for i, p in enumerate(paths) for off in range(0, p.stat().st_size or 1, block)
    ]
    out: list[list[str]] = [[] for _ in paths]
    if not jobs:
        return out
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        digests = pool.map(lambda job: _block_sha256(job[1], job[2], block), jobs)
        for (i, _, _), digest in zip(jobs, digests, strict=True):
            out[i].append(digest)
    return out


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (the names of the files in it) to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: str | Path) -> Path:
    """Write ``folder/manifest.json`` for every other file under ``folder`` and flush it.

    Call it last, after the other files are written and flushed: its presence then says the
    rest reached the disk. Returns its path.
    """
    folder = Path(folder)
    paths = _files(folder)
    files = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": digests}
        for p, digests in zip(paths, _sha256_blocks(paths), strict=True)
    }
    record = {"version": _VERSION, "block_bytes": _BLOCK, "files": files}
    path = folder / MANIFEST_FILE
    with open(path, "w") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(folder)
    return path


def manifest_problem(folder: str | Path, *, under: str = "") -> str | None:
    """What is wrong with ``folder`` against its manifest (one line naming the file), or None
    when every listed file has its size and checksum; None too when there is no manifest.

    Args:
        under: check only the files whose path starts with this (``"model/"``: the weights an
            evaluation reads, not the optimizer state).
    """
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        block = int(record["block_bytes"])
        listed = {k: v for k, v in sorted(record["files"].items()) if k.startswith(under)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{MANIFEST_FILE} is unreadable ({type(exc).__name__})"
    for name, entry in listed.items():  # sizes first: cheap, and most damage shows there
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size} bytes, the manifest says {entry['bytes']}"
    names = list(listed)
    found = _sha256_blocks([folder / n for n in names], block)
    for name, digests in zip(names, found, strict=True):
        if digests != listed[name]["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


def newest_intact(
    candidates: Iterable[tuple[int, Path]], *, under: str = ""
) -> tuple[Path | None, list[str]]:
    """The newest (highest step) checkpoint folder of ``candidates`` that matches its
    manifest, and one line per newer damaged folder skipped (each also warned as a
    :class:`DamagedCheckpointWarning`). (None, lines) when none is intact."""
    skipped: list[str] = []
    for _, folder in sorted(candidates, reverse=True):
        problem = manifest_problem(folder, under=under)
        if problem is None:
            return folder, skipped
        line = f"checkpoint {folder} is damaged ({problem}); skipping it"
        warnings.warn(line, DamagedCheckpointWarning, stacklevel=2)
        skipped.append(line)
    return None, skipped
