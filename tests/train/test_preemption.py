"""Preemption in one process, signals raised by the process itself at chosen moments: the run
stops at the next step boundary with a checkpoint, and --resume then gives exactly the
uninterrupted run (metrics, evaluations, final weights). The signal arriving during a step,
an evaluation, before the first step, during the last step, during a save (twice) and during
the final evaluation; the config field; the handler's own contract."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
import torch

from gmts.scale.distributed import DistInfo
from gmts.train import checkpoint as ckpt
from gmts.train.config import load_config
from gmts.train.metrics_log import EVAL_FILE, TIMING_KEYS, read_metrics
from gmts.train.preemption import (
    MARKER_FILE,
    PREEMPTED_EXIT_CODE,
    PreemptionGuard,
    TrainingPreempted,
)
from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")

STEPS = 4
RECIPE = [
    "algorithm=dapo",
    "selection.score=gmts",
    f"optim.steps={STEPS}",
    "optim.mini_batch_questions=2",  # two optimizer steps per rollout batch
    "optim.schedule=cosine",
    "optim.warmup_steps=1",
    "data.eval_questions=4",
    "data.eval_samples=2",
    "data.eval_every=2",  # evaluations after steps 0 (before), 2 and 4 (after)
    "checkpoint.save_final=true",
]


class _Trainer(Trainer):
    """The trainer whose evaluations also record a checksum of the weights they evaluated (the
    tiny model's accuracy is 0 whatever its weights: alone it would not tell runs apart)."""

    def evaluate(self):
        result = super().evaluate()
        if result is not None:
            result["params/sum"] = float(_tiny.params_vector(self.model).sum())
        return result


@pytest.fixture(scope="module")
def straight(tiny_dir, tmp_path_factory):
    """The uninterrupted run every preempted-and-resumed run must equal."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    _Trainer(_cfg(tiny_dir, run_dir), reward_fn=_tiny.partial_credit).run()
    return run_dir


@pytest.fixture
def unhandled():
    """Handlers outside the trainer's: a signal that reaches one was not handled by the guard
    (without them it would end the test process)."""
    seen: list[int] = []
    sigs = (signal.SIGTERM, signal.SIGUSR1)
    previous = {s: signal.signal(s, lambda n, f: seen.append(n)) for s in sigs}
    yield seen
    for s, handler in previous.items():
        signal.signal(s, handler)


def _cfg(tiny_dir: Path, run_dir: Path, *extra: str):
    return _tiny.small_config(tiny_dir, run_dir, *RECIPE, *extra)


def _send_at(monkeypatch, owner: object, name: str, call: int, *signals: int) -> list[int]:
    """Send ``signals`` to this process at the start of the ``call``-th (0-based) call of
    ``owner.name``; returns the list that counts the calls."""
    original = getattr(owner, name)
    calls: list[int] = []

    def wrapped(*args, **kwargs):
        if len(calls) == call:
            for sig in signals:
                signal.raise_signal(sig)
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)
    return calls


def _preempted_run(tiny_dir, run_dir, monkeypatch, owner, name, call, *signals, extra=()):
    with monkeypatch.context() as m:
        _send_at(m, owner, name, call, *signals)
        trainer = _Trainer(_cfg(tiny_dir, run_dir, *extra), reward_fn=_tiny.partial_credit)
        with pytest.raises(TrainingPreempted) as info:
            trainer.run()
    assert info.value.code == PREEMPTED_EXIT_CODE
    return info.value


def _resume(tiny_dir, run_dir, monkeypatch, *extra) -> list[int]:
    """Resume the run to its end; returns the calls of train_step it made."""
    with monkeypatch.context() as m:
        steps = _send_at(m, Trainer, "train_step", -1)  # counts only
        _Trainer(_cfg(tiny_dir, run_dir, *extra), resume=True, reward_fn=_tiny.partial_credit).run()
    assert not (run_dir / MARKER_FILE).exists()
    return steps


def _final_params(run_dir: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    path = ckpt.latest_checkpoint(run_dir)
    assert path is not None and ckpt.step_of(path.name) == STEPS
    return _tiny.params_vector(AutoModelForCausalLM.from_pretrained(path / "model"))


def _assert_same_run(a: Path, b: Path) -> None:
    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]

    assert [r["step"] for r in read_metrics(b)] == list(range(1, STEPS + 1))
    assert strip(read_metrics(a)) == strip(read_metrics(b))
    evals = read_metrics(b, EVAL_FILE)
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert len({r["params/sum"] for r in evals}) == 3  # three different policies evaluated
    assert read_metrics(a, EVAL_FILE) == evals
    assert torch.equal(_final_params(a), _final_params(b))


def _steps_of(run_dir: Path) -> list[int]:
    return [s for s, _ in ckpt.list_checkpoints(run_dir)]


@pytest.mark.parametrize(
    ("signals", "extra"),
    [
        ((signal.SIGTERM,), ()),
        ((signal.SIGUSR1,), ("checkpoint.preempt_signal=SIGUSR1",)),
        ((signal.SIGTERM, signal.SIGTERM, signal.SIGTERM), ()),  # repeats change nothing
    ],
    ids=["sigterm", "configured-sigusr1", "sigterm-x3"],
)
def test_signal_during_a_step_stops_after_it_and_resumes_exactly(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled, signals, extra
):
    run_dir = tmp_path / "run"
    # the signal arrives while step 3 runs (call 2 of train_step): step 3 is finished first
    stopped = _preempted_run(
        tiny_dir, run_dir, monkeypatch, Trainer, "train_step", 2, *signals, extra=extra
    )
    assert stopped.step == 3 and stopped.signal_name == signal.Signals(signals[0]).name
    assert stopped.checkpoint == ckpt.checkpoint_dir(run_dir) / "step_000003"
    assert _steps_of(run_dir) == [3]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    marker = json.loads((run_dir / MARKER_FILE).read_text())
    assert marker["step"] == 3 and marker["checkpoint"] == str(stopped.checkpoint)
    assert marker["exit_status"] == PREEMPTED_EXIT_CODE
    assert len(_resume(tiny_dir, run_dir, monkeypatch, *extra)) == STEPS - 3
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_signal_at_a_boundary_with_an_evaluation_due_defers_it_to_the_resumed_run(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled
):
    run_dir = tmp_path / "run"
    stopped = _preempted_run(tiny_dir, run_dir, monkeypatch, Trainer, "train_step", 1, 15)
    assert stopped.step == 2  # the evaluation due after step 2 was not started
    assert [r["step"] for r in read_metrics(run_dir, EVAL_FILE)] == [0]
    _resume(tiny_dir, run_dir, monkeypatch)  # runs it first
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_signal_during_an_evaluation_stops_right_after_it(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled
):
    run_dir = tmp_path / "run"
    # evaluate calls: 0 before training, 1 after step 2, 2 after the last step
    stopped = _preempted_run(tiny_dir, run_dir, monkeypatch, Trainer, "evaluate", 1, 15)
    assert stopped.step == 2 and _steps_of(run_dir) == [2]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]  # no step 3
    assert [r["step"] for r in read_metrics(run_dir, EVAL_FILE)] == [0, 2]
    assert len(_resume(tiny_dir, run_dir, monkeypatch)) == 2  # re-evaluates step 2 once
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_signal_before_the_first_step_saves_nothing_and_resume_starts_afresh(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled
):
    run_dir = tmp_path / "run"
    stopped = _preempted_run(tiny_dir, run_dir, monkeypatch, Trainer, "evaluate", 0, 15)
    assert stopped.step == 0 and stopped.checkpoint is None
    assert _steps_of(run_dir) == [] and read_metrics(run_dir) == []
    assert json.loads((run_dir / MARKER_FILE).read_text())["checkpoint"] is None
    assert len(_resume(tiny_dir, run_dir, monkeypatch)) == STEPS
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_signal_during_the_last_step_saves_it_and_leaves_the_final_evaluation(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled
):
    run_dir = tmp_path / "run"
    stopped = _preempted_run(tiny_dir, run_dir, monkeypatch, Trainer, "train_step", STEPS - 1, 15)
    assert stopped.step == STEPS and _steps_of(run_dir) == [STEPS]
    assert [r["step"] for r in read_metrics(run_dir, EVAL_FILE)] == [0, 2]
    with monkeypatch.context() as m:
        saves = _send_at(m, Trainer, "save", -1)
        assert _resume(tiny_dir, run_dir, monkeypatch) == []  # no step, only the evaluation
    assert saves == []  # the final checkpoint is not written twice
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_signal_during_the_final_evaluation_lets_the_run_finish(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled, capsys
):
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        _send_at(m, Trainer, "evaluate", 2, signal.SIGTERM)
        _Trainer(_cfg(tiny_dir, run_dir), reward_fn=_tiny.partial_credit).run()  # no raise
    assert "the run is complete" in capsys.readouterr().err
    assert not (run_dir / MARKER_FILE).exists()
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_second_signal_during_the_save_leaves_a_complete_checkpoint(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled
):
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        # more signals while the checkpoint is half written (the weights are, the state not)
        _send_at(m, torch, "save", 0, signal.SIGTERM, signal.SIGTERM)
        stopped = _preempted_run(tiny_dir, run_dir, monkeypatch, Trainer, "train_step", 1, 15)
    assert stopped.step == 2 and _steps_of(run_dir) == [2]
    assert not list(ckpt.checkpoint_dir(run_dir).glob("*.tmp-*"))
    _resume(tiny_dir, run_dir, monkeypatch)
    _assert_same_run(straight, run_dir)
    assert unhandled == []


def test_signal_during_a_periodic_save_stops_at_that_step_without_saving_again(
    tiny_dir, straight, tmp_path, monkeypatch, unhandled
):
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        saves = _send_at(m, Trainer, "save", 0, signal.SIGTERM)  # the save after step 1
        stopped = _preempted_run(
            tiny_dir, run_dir, monkeypatch, Trainer, "evaluate", -1, extra=("checkpoint.every=1",)
        )
    assert stopped.step == 1 and len(saves) == 1 and _steps_of(run_dir) == [1]
    _resume(tiny_dir, run_dir, monkeypatch, "checkpoint.every=1")
    _assert_same_run(straight, run_dir)
    assert unhandled == []


# ----------------------------------------------------------------------------- the parts


def test_preempt_signal_is_validated():
    assert load_config(None, ["checkpoint.preempt_signal=SIGUSR1"]).checkpoint.preempt_signal == (
        "SIGUSR1"
    )
    assert load_config(None, []).checkpoint.preempt_signal is None
    for bad in ("SIGKILL", "SIGTERM", "usr1", 10):
        with pytest.raises(ValueError, match="checkpoint.preempt_signal"):
            load_config(None, [f"checkpoint.preempt_signal={bad}"])
    from gmts.train.config import CheckpointConfig

    with pytest.raises(ValueError, match="checkpoint.preempt_signal.*SIGSTOP"):
        CheckpointConfig(preempt_signal="SIGSTOP")  # type: ignore[arg-type]


def test_guard_records_only_its_signals_and_restores_the_handlers(unhandled):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    with PreemptionGuard(None, DistInfo()) as guard:
        assert not guard.stop_requested()
        signal.raise_signal(signal.SIGUSR1)  # not the guard's: reaches the outside handler
        assert unhandled == [signal.SIGUSR1] and not guard.stop_requested()
        signal.raise_signal(signal.SIGTERM)
        assert guard.stop_requested() and guard.signal_name == "SIGTERM"
    with PreemptionGuard("SIGUSR2", DistInfo()) as guard:
        signal.raise_signal(signal.SIGUSR2)
        assert guard.stop_requested() and guard.signal_name == "SIGUSR2"
    assert {s: signal.getsignal(s) for s in before} == before
    assert unhandled == [signal.SIGUSR1]


def test_guard_outside_the_main_thread_warns_and_installs_nothing():
    caught: list[Warning] = []
    before = signal.getsignal(signal.SIGTERM)

    def body():
        import warnings

        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with PreemptionGuard(None, DistInfo()):
                pass
        caught.extend(x.message for x in w)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert any("not in the main thread" in str(m) for m in caught)
    assert signal.getsignal(signal.SIGTERM) is before


def test_trainer_run_restores_the_previous_handlers(tiny_dir, tmp_path, unhandled):
    before = signal.getsignal(signal.SIGTERM)
    cfg = _tiny.small_config(tiny_dir, tmp_path / "run", "optim.steps=1")
    Trainer(cfg, reward_fn=_tiny.partial_credit).run()
    assert signal.getsignal(signal.SIGTERM) is before
