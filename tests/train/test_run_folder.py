"""A run's folder never loses results: --resume with no checkpoint, a fresh run into a run's
folder, a resume with another config, damaged checkpoints (truncated trainer_state.pt and
model.safetensors, a flipped byte), unwritable folders (a read-only mount, a full disk, a
patched writer), the last step's periodic checkpoint, and flags between overrides."""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from gmts.cli import build_parser
from gmts.cli import main as gmts_main
from gmts.models.loading import resolve_model_path
from gmts.models.manifest import (
    MANIFEST_FILE,
    DamagedCheckpointWarning,
    manifest_problem,
    write_manifest,
)
from gmts.train import checkpoint as ckpt
from gmts.train import run_folder
from gmts.train.metrics_log import read_metrics
from gmts.train.run_folder import RESUMES_FILE, config_changes
from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


def _overrides(tiny_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [*_tiny.small_overrides(tiny_dir, run_dir), *extra]


def _trainer(tiny_dir: Path, run_dir: Path, *extra: str, **kwargs) -> Trainer:
    cfg = _tiny.small_config(tiny_dir, run_dir, *extra)
    return Trainer(cfg, reward_fn=_tiny.partial_credit, **kwargs)


def _run(tiny_dir: Path, run_dir: Path, *extra: str, **kwargs) -> Trainer:
    trainer = _trainer(tiny_dir, run_dir, *extra, **kwargs)
    trainer.run()
    return trainer


def _steps(run_dir: Path) -> list[int]:
    return [s for s, _ in ckpt.list_checkpoints(run_dir)]


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    """``gmts train ARGV`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    code = gmts_main(["train", *argv])
    return code, capsys.readouterr().err


def _one_line_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("gmts train: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the trainer gets as far as loading a tokenizer or a model."""
    import gmts.train.run_parts as run_parts

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the run folder was checked")

    monkeypatch.setattr(run_parts, "load_tokenizer", refuse)


# --------------------------------------------------------------------------- checkpoint.every


def test_periodic_checkpoint_also_saves_the_last_step(tiny_dir, tmp_path):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.every=2", "optim.steps=3", "checkpoint.keep=5")
    assert _steps(run) == [2, 3]  # step 3 is not a multiple of 2, save_final is false
    for _, folder in ckpt.list_checkpoints(run):
        assert (folder / MANIFEST_FILE).is_file() and manifest_problem(folder) is None


# --------------------------------------------------------------------------- --resume


def test_resume_without_checkpoint_is_an_error_and_keeps_the_metrics(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = _overrides(tiny_dir, run)
    _run(tiny_dir, run)  # checkpoint.every 0, save_final false: no checkpoint
    rows = read_metrics(run)
    assert len(rows) == 2
    code, err = _cli([*args, "--resume"], capsys)
    assert code == 2 and "no checkpoint to continue from" in _one_line_error(err)
    # --resume auto would start afresh, which would lose the two rows: refused too
    code, err = _cli(["--resume", "auto", *args], capsys)
    assert code == 2 and "already holds a run (metrics.jsonl (2 rows)" in _one_line_error(err)
    assert read_metrics(run) == rows


def test_resume_auto_starts_afresh_in_an_empty_folder_and_says_so(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    trainer = _trainer(tiny_dir, run, resume="auto")
    assert trainer.resume_from is None and trainer.step == 0
    assert "no checkpoint in" in capsys.readouterr().err
    trainer.run()
    assert len(read_metrics(run)) == 2


def test_resume_keeps_metrics_up_to_the_checkpoint_and_records_itself(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.every=1", "optim.steps=3", "checkpoint.keep=5")
    ckpt._discard(run / "checkpoints" / "step_000003")  # as if killed before its save
    capsys.readouterr()
    trainer = _trainer(tiny_dir, run, "checkpoint.every=1", "optim.steps=3", resume=True)
    assert trainer.step == 2
    assert "resumed from step 2" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(run)] == [1, 2]  # step 3 is about to run again
    (record,) = [json.loads(x) for x in (run / RESUMES_FILE).read_text().splitlines()]
    assert record["step"] == 2 and record["checkpoint"].endswith("step_000002")
    assert record["changed"] == {} and record["skipped"] == []
    trainer.run()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


# --------------------------------------------------------------------------- fresh runs


def test_fresh_run_into_a_run_folder_is_refused_and_overwrite_clears_it(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.save_final=true")
    (run / "notes.txt").write_text("mine")
    before = read_metrics(run)
    code, err = _cli(_overrides(tiny_dir, run), capsys)
    line = _one_line_error(err)
    assert code == 2 and "already holds a run" in line and "--overwrite" in line
    assert read_metrics(run) == before and _steps(run) == [2]
    code, err = _cli([*_overrides(tiny_dir, run), "--resume", "--overwrite"], capsys)
    assert code == 2 and "give one" in _one_line_error(err)

    # --overwrite: the old run's checkpoints go before anything else happens
    trainer = _trainer(tiny_dir, run, "optim.steps=1", overwrite=True)
    assert _steps(run) == [] and not (run / "metrics.jsonl").exists()
    trainer.run()
    assert [r["step"] for r in read_metrics(run)] == [1]
    assert (run / "notes.txt").read_text() == "mine"  # only the run's own files are cleared


def test_a_run_preempted_before_its_first_step_may_start_again(tiny_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "preempted.json").write_text(json.dumps({"step": 0, "checkpoint": None}))
    (run / "eval.jsonl").write_text(json.dumps({"step": 0, "average@16": 0.1}) + "\n")
    for resume in (False, True):
        assert _trainer(tiny_dir, run, resume=resume).resume_from is None


# --------------------------------------------------------------------------- config changes


def test_resume_with_a_changed_training_config_is_refused_listing_the_keys(
    tiny_dir, tmp_path, capsys
):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.save_final=true")
    config_before = (run / "config.yaml").read_text()
    changed = ["selection.score=entropy", "optim.lr=0.01"]
    code, err = _cli([*_overrides(tiny_dir, run, *changed), "--resume"], capsys)
    line = _one_line_error(err)
    assert code == 2 and "selection.score ('gmts' -> 'entropy')" in line
    assert "optim.lr (0.001 -> 0.01)" in line and "--allow-config-change" in line
    assert (run / "config.yaml").read_text() == config_before

    # reporting and execution settings are free
    free = ["logging.report_to=none", "optim.micro_batch_size=4", "data.eval_questions=3"]
    assert _trainer(tiny_dir, run, *free, resume=True).step == 2

    trainer = _trainer(tiny_dir, run, *changed, resume=True, allow_config_change=True)
    assert trainer.step == 2
    last = json.loads((run / RESUMES_FILE).read_text().splitlines()[-1])
    assert last["changed"] == {
        "optim.lr": [0.001, 0.01],
        "selection.score": ["gmts", "entropy"],
    }
    assert "score: entropy" in (run / "config.yaml").read_text()


def test_config_changes_counts_steps_only_under_a_cosine_schedule(tiny_dir, tmp_path):
    base = _tiny.small_config(tiny_dir, tmp_path)
    longer = _tiny.small_config(tiny_dir, tmp_path, "optim.steps=9", "logging.progress=true")
    assert config_changes(base, longer) == {}
    cosine = ("optim.schedule=cosine",)
    a = _tiny.small_config(tiny_dir, tmp_path, *cosine)
    b = _tiny.small_config(tiny_dir, tmp_path, *cosine, "optim.steps=9")
    assert config_changes(a, b) == {"optim.steps": [2, 9]}
    seeded = _tiny.small_config(tiny_dir, tmp_path, "seed=1", "selection.ratio=0.5")
    assert set(config_changes(base, seeded)) == {"seed", "selection.ratio"}


# --------------------------------------------------------------------------- damaged checkpoints


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_manifest_names_the_damaged_file(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "w.bin").write_bytes(bytes(range(200)))
    (folder / "state.pt").write_bytes(b"state")
    assert manifest_problem(folder) is None  # no manifest: used unverified
    write_manifest(folder)
    assert manifest_problem(folder) is None
    (folder / "state.pt").write_bytes(b"statf")  # same size, other bytes
    assert "state.pt does not match its sha256" in manifest_problem(folder)
    assert manifest_problem(folder, under="model/") is None  # an evaluation reads model/ only
    _cut(folder / "model" / "w.bin")
    assert manifest_problem(folder) == "model/w.bin has 100 bytes, the manifest says 200"
    (folder / "model" / "w.bin").unlink()
    assert manifest_problem(folder, under="model/") == "model/w.bin is missing"


def test_block_checksums_equal_hashlib_over_each_slice(tmp_path):
    import hashlib

    from gmts.models.manifest import _sha256_blocks

    sizes = [0, 1, 63, 64, 65, 200]
    paths = []
    for n in sizes:
        paths.append(tmp_path / f"f{n}")
        paths[-1].write_bytes(os.urandom(n))
    got = _sha256_blocks(paths, block=64)
    for path, n, digests in zip(paths, sizes, got, strict=True):
        data = path.read_bytes()
        expected = [hashlib.sha256(data[i : i + 64]).hexdigest() for i in range(0, n or 1, 64)]
        assert digests == expected


@pytest.mark.parametrize("damaged", ["trainer_state.pt", "model/model.safetensors"])
def test_resume_and_eval_skip_a_damaged_newest_checkpoint(tiny_dir, tmp_path, capsys, damaged):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.every=1", "checkpoint.keep=2")
    _cut(run / "checkpoints" / "step_000002" / damaged)
    with pytest.warns(DamagedCheckpointWarning, match=f"step_000002 is damaged .{damaged} has"):
        trainer = _trainer(tiny_dir, run, "checkpoint.every=1", resume=True)
    assert trainer.step == 1 and trainer.resume_from.name == "step_000001"
    assert [r["step"] for r in read_metrics(run)] == [1]
    record = json.loads((run / RESUMES_FILE).read_text())
    assert len(record["skipped"]) == 1 and damaged in record["skipped"][0]

    # gmts eval --model RUN: the newest checkpoint whose weights are intact
    expected = "step_000001" if damaged.startswith("model/") else "step_000002"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        path = Path(resolve_model_path(run))
    assert path.parent.name == expected
    assert len(seen) == (expected == "step_000001")


def test_resume_with_every_checkpoint_damaged_is_an_error(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.save_final=true")
    _cut(run / "checkpoints" / "step_000002" / "trainer_state.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedCheckpointWarning)
        code, err = _cli([*_overrides(tiny_dir, run), "--resume"], capsys)
    assert code == 2 and "(1 damaged, skipped)" in _one_line_error(err)


def test_unverified_checkpoint_that_cannot_be_read_is_a_one_line_error(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    _run(tiny_dir, run, "checkpoint.save_final=true")
    folder = run / "checkpoints" / "step_000002"
    (folder / MANIFEST_FILE).unlink()  # as written before manifests existed
    _cut(folder / "trainer_state.pt")
    code, err = _cli([*_overrides(tiny_dir, run), "--resume"], capsys)
    line = _one_line_error(err)
    assert code == 2 and f"cannot read {folder / 'trainer_state.pt'}" in line


# --------------------------------------------------------------------------- write failures


def test_unwritable_folders_fail_before_any_model_loads(
    tiny_dir, tmp_path, capsys, monkeypatch, no_model_load
):
    import tempfile

    real = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if Path(dir).name == "checkpoints":
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(run_folder.tempfile, "mkstemp", read_only)
    code, err = _cli(_overrides(tiny_dir, tmp_path / "run"), capsys)
    line = _one_line_error(err)
    assert code == 2 and "cannot write into" in line and "checkpoints (Permission denied)" in line


def test_failed_final_save_keeps_the_last_periodic_checkpoint(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    real = torch.save
    calls = []

    def disk_full(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the final save
            raise OSError(28, "No space left on device")
        return real(obj, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ckpt.torch, "save", disk_full)
        argv = _overrides(tiny_dir, run, "optim.steps=3", "checkpoint.every=2")
        code, err = _cli([*argv, "checkpoint.save_final=true"], capsys)
    line = _one_line_error(err)
    assert code == 2 and "No space left on device" in line and "step_000002" in line
    assert _steps(run) == [2] and manifest_problem(run / "checkpoints" / "step_000002") is None
    assert not list((run / "checkpoints").glob("*.tmp-*"))  # the half-written one is gone


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")


@pytest.fixture
def mounts():
    mounted: list[Path] = []
    yield mounted
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def test_read_only_mount_and_full_disk_are_one_line_errors(tiny_dir, tmp_path, capsys, mounts):
    ro = tmp_path / "ro"
    _mount_tmpfs(ro, "ro,size=1m")
    mounts.append(ro)
    code, err = _cli(_overrides(tiny_dir, ro / "run"), capsys)
    assert code == 2 and "Read-only file system" in _one_line_error(err)

    full = tmp_path / "full"
    _mount_tmpfs(full, "size=256k")  # metrics fit, a checkpoint (~400 KB) does not
    mounts.append(full)
    code, err = _cli(_overrides(tiny_dir, full / "run", "checkpoint.every=1"), capsys)
    line = _one_line_error(err)
    assert code == 2 and "cannot write checkpoint" in line and "no checkpoint was kept" in line
    assert not list((full / "run" / "checkpoints").iterdir())  # no half-written folder


# --------------------------------------------------------------------------- argument order


@pytest.mark.parametrize(
    ("argv", "resume", "overwrite", "overrides"),
    [
        (["--resume", "logging.output_dir=X"], "on", False, ["logging.output_dir=X"]),
        (["a.b=1", "--resume", "--overwrite", "c.d=2"], "on", True, ["a.b=1", "c.d=2"]),
        (["a.b=1", "--resume", "auto", "c.d=2"], "auto", False, ["a.b=1", "c.d=2"]),
        (["--resume=auto", "a.b=1"], "auto", False, ["a.b=1"]),
        (["a.b=1", "--allow-config-change", "c.d=2"], None, False, ["a.b=1", "c.d=2"]),
    ],
)
def test_flags_and_overrides_parse_in_any_order(argv, resume, overwrite, overrides):
    parser, _ = build_parser(["train", *argv])
    args = parser.parse_args(["train", *argv])
    assert (args.resume, args.overwrite, args.overrides) == (resume, overwrite, overrides)
