"""``gmts eval`` on a user's file with the defaults: the template and budget fitted to the model,
said before any model loads with the flags that change them, the template named when its text
overflows the context, and the warnings on results that mislead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmts.cli import main
from gmts.eval.benchmarks import parse_benchmarks
from gmts.eval.harness import EvalConfig
from gmts.eval.report import BenchmarkResult, EvalReport
from gmts.eval.results_store import QuestionRecord
from gmts.eval.settings import misleading_results
from gmts.models.context import ContextLimit
from gmts.models.defaults import BUDGET_MIN, fit_budget


def _file(path: Path) -> Path:
    rows = [{"problem": q, "answer": a} for q, a in (("1+2=", "3"), ("120+33=", "153"))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _no_model(monkeypatch) -> None:
    import gmts.eval.backends as backends

    monkeypatch.setattr(backends, "make_backend", lambda *a, **k: pytest.fail("model loaded"))


def test_a_chat_model_gets_its_chat_template_and_a_fitted_budget_before_loading(
    tiny_chat_model_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    _no_model(monkeypatch)
    data = _file(tmp_path / "mine.jsonl")
    with pytest.raises(pytest.fail.Exception, match="model loaded"):
        main([
            "eval", "--model", str(tiny_chat_model_dir), "--benchmarks", str(data), "--n", "3",
            "--out", str(tmp_path / "res.json"),
        ])  # fmt: skip
    (line, loading) = capsys.readouterr().err.splitlines()[:2]
    assert line == (
        "gmts eval: mine.jsonl: template plain (--template; auto: the question in the model's "
        "chat template), temperature 1.0 (--temperature), budget 128 new tokens "
        "(--max-new-tokens; fitted: 4 x the longest gold answer (3 tokens), at least 128); "
        "2 questions x 3 samples x up to 128 new tokens = 768 at most (--limit, --n, "
        "--max-new-tokens make it shorter)"
    )
    assert loading.startswith("loading ")


def test_the_embedded_model_reads_the_question_as_is_within_its_context(
    tiny_task_model_dir: Path, tmp_path: Path, capsys
) -> None:
    data = _file(tmp_path / "mine.jsonl")
    out = tmp_path / "res.json"
    rc = main([
        "eval", "--model", str(tiny_task_model_dir), "--benchmarks", str(data), "--n", "2",
        "--temperature", "0", "--out", str(out), "--device", "cpu", "--no-progress",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 0, err
    budget = fit_budget(longest_answer=3, longest_prompt=7, context=ContextLimit(64, "tiny"))
    assert budget.tokens == 57 < BUDGET_MIN  # the context, not the floor, decides
    assert "template plain (--template; auto: " in err
    assert f"budget 57 new tokens (--max-new-tokens; {budget.reason})" in err
    saved = json.loads(out.read_text())
    records = saved["results"][str(data)]
    assert [r["question"] for r in records] == ["1+2=", "120+33="]
    assert saved["settings"]["file_fields"]["max_new_tokens"] == 57  # the resume key has it


def test_a_template_too_long_for_the_context_is_named(
    tiny_task_model_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    _no_model(monkeypatch)
    data = _file(tmp_path / "mine.jsonl")
    rc = main([
        "eval", "--model", str(tiny_task_model_dir), "--benchmarks", str(data),
        "--template", "math", "--max-new-tokens", "8", "--out", str(tmp_path / "res.json"),
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    assert "(template math): the longest prompt" in err and "change --template (now math)" in err


def _report(completions: list[str], rewards: list[float]) -> EvalReport:
    parse_benchmarks("builtin:addition")
    record = QuestionRecord(
        benchmark="builtin:addition", id="0", question="1+2=", answer="3>3",
        completions=completions, rewards=rewards, extracted=[None] * len(completions),
    )  # fmt: skip
    result = BenchmarkResult(
        name="builtin:addition", display="builtin:addition", metric="average@2",
        score=sum(rewards) / len(rewards), num_questions=1, samples_per_question=2,
        records=[record],
    )  # fmt: skip
    return EvalReport(model="m", benchmarks=[result], settings={})


def test_answers_at_the_budget_and_a_score_of_zero_are_said(tiny_task_model_dir: Path) -> None:
    from gmts.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tiny_task_model_dir, pad_token=False)  # one token a character
    config = EvalConfig(n=2, max_new_tokens=10)
    cut, short = "1234567890", "12"
    (budget_line, zero_line) = misleading_results(_report([cut, cut], [0, 0]), tokenizer, config)
    assert budget_line.startswith("builtin:addition: 2 of 2 answers used at least 90% of the ")
    assert budget_line.endswith("raise --max-new-tokens")
    assert zero_line.startswith("builtin:addition: every answer scored 0 (2 answers; e.g. ")
    assert "--temperature" in zero_line
    assert misleading_results(_report([cut, short], [1, 0]), tokenizer, config) == []
