"""What a newcomer's run says and fits by itself: the template and the budget fitted to the model
and the data (printed with their keys before any weight is read), the warning when most answers
are cut, the held-out line after a resume, the steps' display, and no empty folder left by a
start that fails."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from gmts.models.context import ContextLimit
from gmts.models.defaults import fit_budget
from gmts.train.collect import CollectedBatch, RolloutStats
from gmts.train.signal_watch import TruncationWarning, TruncationWatch
from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_dataset_run_fits_its_budget_and_says_its_settings(
    tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    """No data.template, no rollout.max_response_length: the embedded tokenizer reads no
    instruction (template plain), and the budget is what the 64-position context leaves after
    the longest prompt, the held-out file's included."""
    train = _jsonl(tmp_path / "train.jsonl", [{"q": f"{x}+3=", "a": str(x + 3)} for x in range(8)])
    held = _jsonl(tmp_path / "held.jsonl", [{"q": "1000+3=", "a": "1003"}])
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        f"data.dataset={train}",
        f"data.eval_dataset={held}",
        "data.eval_questions=1",
        "data.question_field=q",
        "data.answer_field=a",
    )
    trainer = Trainer(cfg)
    expected = fit_budget(longest_answer=4, longest_prompt=7, context=ContextLimit(64, "tiny"))
    assert trainer.parts.data.max_new_tokens == expected.tokens == 57
    held_out = trainer.parts.data.held_out
    assert held_out is not None and held_out.max_new_tokens == 57
    assert trainer.source.problems[0].prompt == "0+3="  # plain: the question as it is
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith("gmts train: template plain (data.template; auto: ")
    assert "temperature 1.0 (rollout.temperature; held-out: 1.0, data.eval_temperature)" in line
    assert line.endswith(f"budget 57 new tokens (rollout.max_response_length; {expected.reason})")


def test_a_task_run_names_the_tasks_prompts_and_budget(
    tiny_dir: Path, tmp_path: Path, capsys
) -> None:
    Trainer(_tiny.small_config(tiny_dir, tmp_path / "run", "rollout.temperature=0.7"))
    line = capsys.readouterr().err.splitlines()[0]
    assert line == (
        "gmts train: template none (data.template; data.task addition's prompts), temperature "
        "0.7 (rollout.temperature), budget 10 new tokens (rollout.max_response_length; the "
        "task's own)"
    )


def test_an_instruction_that_overflows_the_context_names_the_template(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """The embedded tokenizer encodes letters as its unknown token: refused before training,
    with data.template among the settings named."""
    train = _jsonl(tmp_path / "train.jsonl", [{"q": "1+3=", "a": "4"}])
    cfg = _tiny.small_config(
        tiny_dir, tmp_path / "run", f"data.dataset={train}", "data.question_field=q",
        "data.answer_field=a", "data.template=math",
    )  # fmt: skip
    with pytest.raises(ValueError, match="data.template"):
        Trainer(cfg)


def _step(answers: float, truncated: float) -> CollectedBatch:
    stats = RolloutStats(
        answers=answers, reward_sum=0.0, raw_reward_sum=0.0, rewarded=0.0, length_sum=0.0,
        truncated=truncated, reward_errors=0.0, generated_groups=1.0, varied_groups=1.0,
        topped_up_groups=0.0, response_tokens=0.0,
    )  # fmt: skip
    return CollectedBatch(None, stats, 1)  # type: ignore[arg-type]


def test_most_answers_cut_warn_once_with_the_key_to_raise() -> None:
    watch = TruncationWatch(64)
    with pytest.warns(TruncationWarning) as caught:
        message = watch.observe(_step(8, 6))
    assert len(caught) == 1 and message == str(caught[0].message)
    assert message.startswith("6 of 8 answers stopped at the budget of 64 new tokens")
    assert message.endswith("raise rollout.max_response_length")
    assert watch.observe(_step(8, 8)) is None  # once: the first step only
    assert TruncationWatch(64).observe(_step(8, 4)) is None  # half is not most


def test_the_held_out_line_after_a_resume_reads_step_0_back(tmp_path: Path) -> None:
    from gmts.cli.train import _evaluation_before, held_out_line
    from gmts.train.metrics_log import EVAL_FILE, MetricsLogger
    from gmts.train.trainer import TrainResult

    logger = MetricsLogger(tmp_path)
    logger.log(0, {"average@2": 0.109, "pass@2": 0.2, "questions": 64.0}, EVAL_FILE)
    logger.log(4, {"average@2": 0.3, "pass@2": 0.4, "questions": 64.0}, EVAL_FILE)
    after = {"average@2": 0.406, "pass@2": 0.5, "questions": 64.0}
    resumed = TrainResult(run_dir=tmp_path, steps=6, eval_before=None, eval_after=after)
    assert held_out_line(after, _evaluation_before(resumed)) == (
        "held-out: average@2 0.109 -> 0.406, pass@2 0.200 -> 0.500"
    )
    never = TrainResult(run_dir=tmp_path / "other", steps=6, eval_after=after)
    assert held_out_line(after, _evaluation_before(never)) == (
        "held-out: average@2 0.406, pass@2 0.500 (no evaluation before step 1 was recorded)"
    )


def test_a_start_that_fails_leaves_no_empty_folder(tiny_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "mine"
    cfg = _tiny.small_config(tiny_dir, run, f"model.path={tmp_path / 'no-such-model'}")
    with pytest.raises(ValueError, match="does not exist"):
        Trainer(cfg)
    assert not (tmp_path / "runs").exists()
    run.mkdir(parents=True)  # a folder the user made stays, and gets no checkpoints/
    with pytest.raises(ValueError, match="does not exist"):
        Trainer(cfg)
    assert run.is_dir() and list(run.iterdir()) == []


def test_the_steps_display_counts_the_policys_forwards(monkeypatch) -> None:
    """Off a terminal: one line per step that took long enough (0 s here), with the rollout's
    and the update's seconds; the phases count the policy's forward passes."""
    import gmts.train.run_progress as run_progress

    monkeypatch.setattr(run_progress, "LOG_AFTER_S", 0.0)
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    model = torch.nn.Linear(2, 2)
    display = run_progress.RunProgress(
        "run", steps=3, initial=0, enabled=True, model=model, rollout_positions=10
    )
    texts = []
    for step in (1, 2):
        with display.rollout():
            for _ in range(4):
                model(torch.zeros(1, 2))
            texts.append(display.bar.stage_text())
        for _ in range(3):
            model(torch.zeros(1, 2))
        texts.append(display.bar.stage_text())
        display.step_done(step, {"reward/mean": 0.5, "reward/accuracy": 0.25})
    display.close()
    assert texts[0].startswith("rollout 4/10") and texts[1].startswith("update 3,")
    assert texts[3] == "update 3/3"  # the first step taught the update's size
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("run: step 1/3: reward 0.500, accuracy 0.25; ")
    assert "(rollout " in lines[0] and len(lines) == 2
