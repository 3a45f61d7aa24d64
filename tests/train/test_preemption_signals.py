"""Real signals from outside, one process and two under torchrun (gloo): a run stopped by
SIGTERM (or the configured extra signal) at a step boundary exits with status 75, and
--resume then gives exactly the uninterrupted run: every non-timing metric, every evaluation
and the final weights, bit for bit (same thread count). More signals during the save, SIGKILL
during a save, torchrun forwarding SIGTERM to every rank and a signal reaching one rank only;
the ``gmts train`` command's own exit status."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gmts.train.checkpoint import checkpoint_dir, list_checkpoints
from gmts.train.metrics_log import EVAL_FILE, TIMING_KEYS, read_metrics
from gmts.train.preemption import MARKER_FILE, PREEMPTED_EXIT_CODE

from file_modules import load_module

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "_preempt_script.py")
STEPS = 6  # optim.steps of _preempt_script.py
_tiny = load_module(HERE / "_tiny.py", "_tiny")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
TIMEOUT = 300

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(model_dir: Path, run_dir: Path, *args: str, ranks: int = 1) -> list[str]:
    launcher = [sys.executable]
    if ranks > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={ranks}",
            f"--master_port={_free_port()}",
        ]
    return [*launcher, SCRIPT, str(model_dir), str(run_dir), *args]


def _run(model_dir: Path, run_dir: Path, *args: str, ranks: int = 1) -> None:
    subprocess.run(
        _command(model_dir, run_dir, *args, ranks=ranks), check=True, env=ENV, timeout=TIMEOUT
    )


_STARTED: list[tuple[subprocess.Popen, Path]] = []


def _start(model_dir: Path, run_dir: Path, *args: str, ranks: int = 1, **hooks: str):
    """Start a run in the background; its processes write their pids to <run_dir>-pids/."""
    pid_dir = run_dir.with_name(run_dir.name + "-pids")
    pid_dir.mkdir(parents=True)
    env = {**ENV, "PREEMPT_TEST_PID_DIR": str(pid_dir), **hooks}
    proc = subprocess.Popen(_command(model_dir, run_dir, *args, ranks=ranks), env=env)
    _STARTED.append((proc, pid_dir))
    return proc


def _pid(run_dir: Path, rank: int) -> int:
    return int((run_dir.with_name(run_dir.name + "-pids") / f"rank{rank}").read_text())


@pytest.fixture(autouse=True)
def _reap():
    """After each test, SIGKILL whatever it started that still runs (torchrun's workers are in
    sessions of their own: killing the launcher would not end them)."""
    yield
    while _STARTED:
        proc, pid_dir = _STARTED.pop()
        if proc.poll() is not None:
            continue
        for pid_file in pid_dir.glob("rank*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        proc.kill()
        proc.wait()


def _wait_for(condition, proc, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _rows_logged(run_dir: Path, n: int):
    return lambda: len(read_metrics(run_dir)) >= n


def _final_params(run_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    (step, path), *_ = reversed(list_checkpoints(run_dir))
    assert step == STEPS
    return _tiny.params_vector(AutoModelForCausalLM.from_pretrained(path / "model"))


def _assert_same_run(a: Path, b: Path) -> None:
    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]

    assert [r["step"] for r in read_metrics(b)] == list(range(1, STEPS + 1))
    assert strip(read_metrics(a)) == strip(read_metrics(b))
    assert [r["step"] for r in read_metrics(b, EVAL_FILE)] == [0, 2, 4, 6]
    assert read_metrics(a, EVAL_FILE) == read_metrics(b, EVAL_FILE)
    assert torch.equal(_final_params(a), _final_params(b))


def _assert_preempted_at_a_boundary(run_dir: Path) -> int:
    """The marker names the step the run stopped after; its checkpoint is complete and the
    metrics stop there. Returns that step."""
    marker = json.loads((run_dir / MARKER_FILE).read_text())
    stopped = marker["step"]
    assert 2 <= stopped < STEPS, marker
    assert marker["checkpoint"] == str(checkpoint_dir(run_dir) / f"step_{stopped:06d}")
    assert max(s for s, _ in list_checkpoints(run_dir)) == stopped
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, stopped + 1))
    return stopped


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _tiny.save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def straight(model_dir, tmp_path_factory):
    """The uninterrupted one-process run."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    _run(model_dir, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def straight_two(model_dir, tmp_path_factory):
    """The uninterrupted two-process run."""
    run_dir = tmp_path_factory.mktemp("straight2") / "run"
    _run(model_dir, run_dir, ranks=2)
    return run_dir


def test_sigterm_then_resume_equals_the_uninterrupted_run(model_dir, straight, tmp_path):
    # (the configured extra signal: test_preemption.py in one process, and the one-rank
    # torchrun test below with SIGUSR1)
    run_dir = tmp_path / "run"
    proc = _start(model_dir, run_dir, PREEMPT_TEST_STEP_S="0.5")
    _wait_for(_rows_logged(run_dir, 2), proc, "step 2")
    proc.send_signal(signal.SIGTERM)  # arrives during step 3
    assert proc.wait(TIMEOUT) == PREEMPTED_EXIT_CODE
    _assert_preempted_at_a_boundary(run_dir)
    assert json.loads((run_dir / MARKER_FILE).read_text())["signal"] == "SIGTERM"
    _run(model_dir, run_dir, "--resume")
    assert not (run_dir / MARKER_FILE).exists()
    _assert_same_run(straight, run_dir)


def test_more_signals_during_the_save_leave_a_complete_checkpoint(model_dir, straight, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(model_dir, run_dir, PREEMPT_TEST_STEP_S="0.5", PREEMPT_TEST_SLOW_SAVE="2")
    _wait_for(_rows_logged(run_dir, 2), proc, "step 2")
    proc.send_signal(signal.SIGTERM)
    saving = run_dir / "saving.txt"
    _wait_for(saving.is_file, proc, "the save")  # the weights are written, the state is not
    for _ in range(2):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    assert proc.poll() is None, "a signal during the save ended the process"
    assert proc.wait(TIMEOUT) == PREEMPTED_EXIT_CODE
    stopped = _assert_preempted_at_a_boundary(run_dir)
    assert saving.read_text().startswith(f"step_{stopped:06d}.tmp-")
    assert not list(checkpoint_dir(run_dir).glob("*.tmp-*"))
    _run(model_dir, run_dir, "--resume")
    _assert_same_run(straight, run_dir)


def test_sigkill_during_a_save_resumes_from_the_previous_checkpoint(model_dir, straight, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(model_dir, run_dir, "checkpoint.every=2", PREEMPT_TEST_SLOW_SAVE="2")
    saving = run_dir / "saving.txt"
    _wait_for(
        lambda: saving.is_file() and saving.read_text().startswith("step_000004.tmp-"),
        proc,
        "the save of step 4",
    )
    proc.kill()
    proc.wait(TIMEOUT)
    half = checkpoint_dir(run_dir) / saving.read_text()
    assert (half / "model").is_dir() and not (half / "trainer_state.pt").exists()
    assert [s for s, _ in list_checkpoints(run_dir)] == [2]  # the half-written one is ignored
    _run(model_dir, run_dir, "checkpoint.every=2", "--resume")
    assert not half.exists()  # removed by the next save
    _assert_same_run(straight, run_dir)


def test_torchrun_forwarding_sigterm_to_every_rank(model_dir, straight_two, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(model_dir, run_dir, ranks=2, PREEMPT_TEST_STEP_S="0.5")
    _wait_for(_rows_logged(run_dir, 2), proc, "step 2")
    proc.send_signal(signal.SIGTERM)  # to torchrun, which sends SIGTERM to both workers
    assert proc.wait(TIMEOUT) == 1  # torchrun's own status; the marker tells
    _assert_preempted_at_a_boundary(run_dir)
    _run(model_dir, run_dir, "--resume", ranks=2)
    _assert_same_run(straight_two, run_dir)


def test_a_signal_reaching_one_rank_stops_every_rank_at_the_same_step(
    model_dir, straight_two, tmp_path
):
    run_dir = tmp_path / "run"
    extra = ("checkpoint.preempt_signal=SIGUSR1",)
    proc = _start(model_dir, run_dir, *extra, ranks=2, PREEMPT_TEST_STEP_S="0.5")
    _wait_for(_rows_logged(run_dir, 2), proc, "step 2")
    os.kill(_pid(run_dir, 1), signal.SIGUSR1)  # rank 1 only; rank 0 is the one that saves
    assert proc.wait(TIMEOUT) != 0
    marker = json.loads((run_dir / MARKER_FILE).read_text())
    assert marker["signal"] == "SIGUSR1"
    _assert_preempted_at_a_boundary(run_dir)
    _run(model_dir, run_dir, *extra, "--resume", ranks=2)
    _assert_same_run(straight_two, run_dir)


def test_gmts_train_exits_75_on_sigterm_and_resume_finishes(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "gmts",
        "train",
        f"model.path={model_dir}",
        f"logging.output_dir={run_dir}",
        "logging.progress=false",
        "data.eval_questions=0",
        "rollout.questions_per_batch=2",
        "rollout.group_size=2",
        "algorithm=grpo",
        "optim.steps=120",
        "optim.micro_batch_size=4",
    ]
    proc = subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE, text=True)
    _STARTED.append((proc, tmp_path / "no-pids"))
    _wait_for(_rows_logged(run_dir, 1), proc, "step 1")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err
    stopped = json.loads((run_dir / MARKER_FILE).read_text())["step"]
    assert stopped < 120, "the run finished before the signal"
    assert f"stopped by SIGTERM after step {stopped}" in err and "--resume" in err
    done = subprocess.run([*command, "--resume"], env=ENV, timeout=TIMEOUT)
    assert done.returncode == 0
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 121))
    assert not (run_dir / MARKER_FILE).exists()
