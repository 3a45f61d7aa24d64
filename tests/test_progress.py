"""gmts._progress: a bar with counts and the time left on a terminal, one line per long phase in
a log, nothing when disabled; forward passes counted exactly."""

from __future__ import annotations

import io
import time

import pytest
import torch

from gmts._progress import Progress, count_forwards, is_terminal


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_counts_the_time_left_and_the_stage() -> None:
    out = _Terminal()
    with Progress("evaluating", 10, "questions", stream=out) as shown:
        assert shown.on_terminal
        shown.update(3)
        shown.stage("sampling", 64)
        for _ in range(16):
            shown.advance_stage()
        time.sleep(0.05)
        text = shown.stage_text()
        shown.set_postfix("reward=0.5")
        time.sleep(1.2)  # the redraw thread moves the bar while nothing is counted
    screen = out.getvalue()
    assert "3/10" in screen and "<" in screen  # tqdm's count and its "elapsed<left"
    assert "sampling 16/64" in text and "left" in text  # a quarter done: an estimate
    assert "reward=0.5" in screen and "sampling 16/64" in screen
    assert "evaluating: 3/10 questions in" not in screen


def test_a_log_gets_one_line_for_a_long_phase_and_none_for_a_short_one() -> None:
    log = io.StringIO()
    assert not is_terminal(log)
    with Progress("evaluating", 10, "questions", stream=log, log_after_s=0.0) as shown:
        shown.update(4)
        shown.log("a line of the caller")
    lines = log.getvalue().splitlines()
    assert lines[0] == "a line of the caller"
    assert len(lines) == 2 and lines[1].startswith("evaluating: 4/10 questions in 0 s")
    quick = io.StringIO()
    with Progress("quick", 10, stream=quick, log_after_s=60.0) as shown:
        shown.update(10)
    assert quick.getvalue() == ""  # a phase under log_after_s adds nothing to a log


def test_disabled_shows_and_writes_nothing() -> None:
    for stream in (_Terminal(), io.StringIO()):
        with Progress("x", 5, stream=stream, enabled=False, log_after_s=0.0) as shown:
            shown.update(5)
            shown.log("nothing")
        assert stream.getvalue() == ""


def test_a_summary_and_an_unknown_total() -> None:
    log = io.StringIO()
    shown = Progress("held-out evaluation", stream=log, log_after_s=0.0)
    shown.close("average@2 0.250")
    shown.close("twice")  # closing again writes nothing more
    assert log.getvalue() == "held-out evaluation: 0 s; average@2 0.250\n"


def test_a_stage_grows_by_its_first_total_when_counted_past_it() -> None:
    shown = Progress("x", enabled=False)
    shown.stage("rollout", 10)
    for _ in range(23):  # a third round of sampling
        shown.advance_stage()
    assert shown.stage_text().startswith("rollout 23/30")


@pytest.mark.parametrize("calls", [0, 1, 7])
def test_count_forwards_counts_every_forward_inside_the_block_only(calls: int) -> None:
    model = torch.nn.Linear(2, 2)
    seen = []
    with count_forwards(model, lambda: seen.append(1)):
        for _ in range(calls):
            model(torch.zeros(1, 2))
    model(torch.zeros(1, 2))  # after the block: not counted (the hook is gone)
    assert len(seen) == calls
    with count_forwards(None, lambda: seen.append(1)):  # no module: nothing counted
        pass
    assert len(seen) == calls
