"""``gmts eval --benchmarks my.jsonl``: a user's own file, its fields, reward and template named
by options (read as ``data.dataset`` reads a file for training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gmts.cli import main
from gmts.eval.benchmarks import FileFields, get_spec, parse_benchmarks


def _rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_own_file_end_to_end(tiny_task_model_dir: Path, tmp_path: Path, capsys) -> None:
    from gmts.rewards import exact_reward

    rows = [
        {"q": f"0{a}+00{a % 7}=", "a": str(a + a % 7), "key": f"k{a}"} for a in (11, 23, 45, 67)
    ]
    data = _rows(tmp_path / "mine.jsonl", rows)
    out = tmp_path / "res.json"
    rc = main([
        "eval", "--model", str(tiny_task_model_dir), "--benchmarks", str(data),
        "--question-field", "q", "--answer-field", "a", "--id-field", "key",
        "--reward", "exact", "--template", "plain", "--limit", "3", "--n", "2",
        "--max-new-tokens", "4", "--out", str(out), "--device", "cpu", "--no-progress",
    ])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    header = [c.strip() for c in captured.out.splitlines()[0].split("|")[1:-1]]
    assert header == ["Model", "mine.jsonl", "Avg."]
    records = json.loads(out.read_text())["results"][str(data)]
    assert [r["id"] for r in records] == ["k11", "k23", "k45"]
    for record, row in zip(records, rows):
        assert (record["question"], record["answer"]) == (row["q"], row["a"])
        # scored by the exact reward on the gold of its own row
        expected = [exact_reward(c, row["a"]) for c in record["completions"]]
        assert record["rewards"] == expected


def test_own_file_options_and_errors(tiny_task_model_dir: Path, tmp_path: Path, capsys) -> None:
    data = _rows(tmp_path / "cs.jsonl", [{"question": "Is ice cold?", "label": "yes"}])
    fields = FileFields(question_field="question", answer_field="label", reward="yes_no")
    (name,) = parse_benchmarks(str(data), fields)
    spec = get_spec(name)
    assert spec.verifier.name == "yes_no" and spec.template == "auto" and not spec.runs_code
    assert get_spec(parse_benchmarks(str(data), FileFields(reward="code"))[0]).runs_code
    with pytest.raises(ValueError, match="not found"):
        parse_benchmarks(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        FileFields(reward="nope")
    with pytest.raises(ValueError, match=r"or a file ending in \.jsonl"):
        parse_benchmarks("my_benchmark")
    model = str(tiny_task_model_dir)
    rc = main(["eval", "--model", model, "--benchmarks", str(data), "--reward", "nope"])
    assert rc == 2
    assert "unknown reward 'nope'" in capsys.readouterr().err


def test_own_file_of_the_tasks_questions_matches_the_builtin_task(
    tiny_task_model_dir: Path, tmp_path: Path, capsys
) -> None:
    """The built-in task's held-out questions written to a file and scored with the exact
    reward: greedy, the same completions and rewards as ``builtin:addition``."""
    from gmts.embedded.tasks import get_task

    problems = get_task("addition").held_out(4)
    data = _rows(
        tmp_path / "held.jsonl", [{"problem": p.prompt, "answer": p.answer} for p in problems]
    )
    out = tmp_path / "res.json"
    rc = main([
        "eval", "--model", str(tiny_task_model_dir), "--benchmarks", f"{data},builtin:addition",
        "--reward", "exact", "--template", "plain", "--limit", "4", "--temperature", "0",
        "--max-new-tokens", "10", "--out", str(out), "--device", "cpu", "--no-progress",
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    results = json.loads(out.read_text())["results"]
    mine, builtin = results[str(data)], results["builtin:addition"]
    assert [r["question"] for r in mine] == [r["question"] for r in builtin]
    assert [r["completions"] for r in mine] == [r["completions"] for r in builtin]
    assert [r["rewards"] for r in mine] == [r["rewards"] for r in builtin]
