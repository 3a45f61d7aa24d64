"""``gmts analyze --dataset``: a benchmark's questions as the analysis's task."""

from __future__ import annotations

import random

import pytest

from gmts.cli import main
from gmts.cli.analyze_questions import dataset_questions


def test_dataset_questions_render_distinct_questions_and_score_them():
    task = dataset_questions("addition-2digit", None, template=None, reward=None)
    assert task.name == "addition-2digit" and task.max_new_tokens > 0
    problems = task.sample(5, random.Random(0))
    assert len({p.prompt for p in problems}) == 5
    for problem in problems:
        a, b = (int(x) for x in problem.prompt.split("What is ")[1].split("?")[0].split(" + "))
        assert problem.answer == str(a + b)
        assert task.reward(f"The answer is {a + b}.", problem.answer) == 1.0
        assert task.reward(f"The answer is {a + b + 1}.", problem.answer) == 0.0
    assert problems == task.sample(5, random.Random(0))  # the seed fixes the questions


def test_more_questions_than_the_dataset_holds_gives_all_of_them(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n')
    task = dataset_questions(str(path), None, template=None, reward="math")
    assert sorted(p.answer for p in task.sample(10, random.Random(0))) == ["2", "4"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--dataset needs --model or --run"),
        (["--model", "smollm2-135m-instruct", "--template", "nope"], "template"),
    ],
)
def test_bad_dataset_arguments_are_one_line(capsys, extra, message, monkeypatch, tmp_path):
    if "--model" in extra:  # fail on the template before any model loads
        monkeypatch.setattr(
            "gmts.cli.analyze.resolve_model_dir", lambda args: tmp_path, raising=True
        )
        monkeypatch.setattr("gmts.models.loading.load_tokenizer", lambda *a, **k: None)
    code = main(["analyze", "--dataset", "addition-2digit", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
