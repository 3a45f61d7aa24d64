"""The harness with fake samplers: accuracy sanity, average@n arithmetic, exact resume."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from gmts.eval.benchmarks import load_eval_benchmark, parse_benchmarks
from gmts.eval.harness import EvalConfig, evaluate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text_sampler import TextSampler  # noqa: E402


class OracleBackend(TextSampler):
    """Answers every prompt with a fixed function of its gold answer (a lookup by prompt)."""

    name = "fake"

    def __init__(self, gold_by_prompt: dict[str, str], answer_fn):
        self.gold_by_prompt = gold_by_prompt
        self.answer_fn = answer_fn
        self.prompts_seen: list[str] = []

    def complete(self, prompts, *, n, temperature, max_new_tokens, seed):
        self.prompts_seen.extend(prompts)
        return [[self.answer_fn(self.gold_by_prompt[p], j) for j in range(n)] for p in prompts]


def _gold_map(names, data_dir, limit=None):
    gold = {}
    for name in names:
        for item in load_eval_benchmark(name, tokenizer=None, data_dir=data_dir, limit=limit).items:
            gold[item.prompt] = item.answer
    return gold


def _int_gold(answer: str) -> int:
    value = float(answer)
    assert value == int(value), answer
    return int(value)


def test_gold_boxed_scores_100_and_off_by_one_scores_0(shared_data):
    names = ["aime24", "amc23"]  # integer answers (AMC's written as 27.0)
    gold = _gold_map(names, shared_data, limit=12)
    config = EvalConfig(n=1, limit=12, data_dir=str(shared_data))

    right = OracleBackend(gold, lambda g, j: f"so the answer is \\boxed{{{_int_gold(g)}}}.")
    report = evaluate(right, names, config, progress=False)
    assert [b.score for b in report.benchmarks] == [1.0, 1.0]
    assert [b.num_questions for b in report.benchmarks] == [12, 12]
    assert report.average == 1.0
    first_gold = _int_gold(gold[right.prompts_seen[0]])
    assert report.benchmarks[0].records[0].extracted == [str(first_gold)]

    wrong = OracleBackend(gold, lambda g, j: f"so the answer is \\boxed{{{_int_gold(g) + 1}}}.")
    report = evaluate(wrong, names, config, progress=False)
    assert [b.score for b in report.benchmarks] == [0.0, 0.0]


def test_average_at_n_is_mean_of_per_question_fractions(shared_data):
    # sample j of question q is right iff j < (q mod 4): per-question fractions 0, 1/4, 2/4, 3/4
    gold = _gold_map(["aime24"], shared_data, limit=8)
    order = {p: i for i, p in enumerate(gold)}
    inverse = {g: p for p, g in gold.items()}

    def answer(g, j):
        q = order[inverse[g]]
        return f"\\boxed{{{g if j < q % 4 else int(g) + 1}}}"

    report = evaluate(
        OracleBackend(gold, answer),
        "aime24",
        EvalConfig(n=4, limit=8, data_dir=str(shared_data)),
        progress=False,
    )
    bench = report.benchmarks[0]
    assert bench.metric == "average@4"
    assert [r.rewards.count(1.0) for r in bench.records] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert bench.score == pytest.approx((0 + 0.25 + 0.5 + 0.75) / 4)


def test_unknown_benchmark_lists_valid_names():
    with pytest.raises(
        ValueError, match=r"unknown benchmark\(s\) 'nope'.*math500.*builtin:addition"
    ):
        parse_benchmarks("math500,nope")
    with pytest.raises(ValueError, match="at least one"):
        parse_benchmarks(" , ")
    assert parse_benchmarks("math500, aime24,math500") == ["math500", "aime24"]


class SeededBackend(TextSampler):
    """Completions that depend only on (prompt, seed, sample index), like a seeded sampler."""

    name = "fake-sampler"

    def __init__(self, fail_after_calls: int | None = None):
        self.calls = 0
        self.prompts_seen: list[str] = []
        self.fail_after_calls = fail_after_calls

    def complete(self, prompts, *, n, temperature, max_new_tokens, seed):
        if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        self.prompts_seen.extend(prompts)
        out = []
        for p in prompts:
            rng = random.Random(f"{seed}/{p}")
            # the built-in task's answer for p would be needed to be right; guess digits instead
            out.append([f"{rng.randint(0, 9)}>{rng.randint(0, 9)}" for _ in range(n)])
        return out


def test_killed_run_resumes_without_recomputing_and_matches_one_shot(tmp_path):
    config = EvalConfig(n=4, limit=10, batch_size=8)  # 2 questions per chunk -> 5 chunks
    names = ["builtin:addition"]
    one_shot = evaluate(SeededBackend(), names, config, progress=False)

    store = tmp_path / "r.partial.jsonl"
    killed = SeededBackend(fail_after_calls=2)
    with pytest.raises(KeyboardInterrupt):
        evaluate(killed, names, config, results_path=store, progress=False)
    assert len(killed.prompts_seen) == 4
    assert len(store.read_text().splitlines()) == 1 + 4  # header + 4 finished questions

    resumed_backend = SeededBackend()
    resumed = evaluate(resumed_backend, names, config, results_path=store, progress=False)
    assert resumed_backend.calls == 3
    assert set(resumed_backend.prompts_seen).isdisjoint(killed.prompts_seen)
    assert len(resumed_backend.prompts_seen) == 6
    assert resumed.benchmarks[0].records == one_shot.benchmarks[0].records
    assert resumed.table() == one_shot.table()

    # a third run recomputes nothing at all
    idle = SeededBackend()
    again = evaluate(idle, names, config, results_path=store, progress=False)
    assert idle.calls == 0 and again.table() == one_shot.table()


def test_raising_limit_reuses_done_questions(tmp_path):
    store = tmp_path / "r.partial.jsonl"
    first = SeededBackend()
    evaluate(
        first,
        "builtin:addition",
        EvalConfig(n=2, limit=3, batch_size=2),
        results_path=store,
        progress=False,
    )
    second = SeededBackend()
    report = evaluate(
        second,
        "builtin:addition",
        EvalConfig(n=2, limit=5, batch_size=2),
        results_path=store,
        progress=False,
    )
    assert len(second.prompts_seen) == 2
    assert report.benchmarks[0].num_questions == 5


def test_builtin_task_gold_scores_100():
    from gmts.embedded.tasks import get_task

    problems = get_task("addition").held_out(6)
    gold = {p.prompt: p.answer for p in problems}
    report = evaluate(
        OracleBackend(gold, lambda g, j: g + "$"),
        "builtin:addition",
        EvalConfig(n=3, limit=6),
        progress=False,
    )
    assert report.benchmarks[0].score == 1.0
    assert report.benchmarks[0].display == "builtin:addition"
    report = evaluate(
        OracleBackend(gold, lambda g, j: "0" + g),
        "builtin:addition",
        EvalConfig(n=3, limit=6),
        progress=False,
    )
    assert report.benchmarks[0].score == 0.0


def test_commonsense_gold_scores_100_and_wrong_scores_0(shared_data):
    names = ["csqa", "csqa2"]
    gold = _gold_map(names, shared_data, limit=5)
    config = EvalConfig(n=2, limit=5, data_dir=str(shared_data))
    right = evaluate(
        OracleBackend(gold, lambda g, j: f"\\boxed{{{g}}}"), names, config, progress=False
    )
    assert [b.score for b in right.benchmarks] == [1.0, 1.0]
    flip = {"yes": "no", "no": "yes", "A": "B", "B": "C", "C": "D", "D": "E", "E": "A"}
    wrong = evaluate(
        OracleBackend(gold, lambda g, j: f"\\boxed{{{flip[g.strip()]}}}"),
        names,
        config,
        progress=False,
    )
    assert [b.score for b in wrong.benchmarks] == [0.0, 0.0]
    # the CS-QA prompt lists the lettered choices
    item = load_eval_benchmark("csqa", tokenizer=None, data_dir=shared_data, limit=1).items[0]
    assert "\nA. " in item.prompt and "\nE. " in item.prompt


def test_code_benchmarks_are_greedy_pass_at_1(shared_data, trusted_code_sandbox):
    import gzip
    import json

    with gzip.open(shared_data / "code" / "HumanEval.jsonl.gz", "rt") as fh:
        rows = [json.loads(line) for line, _ in zip(fh, range(2))]
    solutions = {r["prompt"]: r["prompt"] + r["canonical_solution"] for r in rows}

    class CodeBackend(TextSampler):
        name = "fake-code"

        def __init__(self, broken: bool):
            self.broken = broken
            self.calls = []

        def complete(self, prompts, *, n, temperature, max_new_tokens, seed):
            self.calls.append((n, temperature))
            out = []
            for p in prompts:
                task = next(k for k in solutions if k.strip() in p)
                code = task + "    return None\n" if self.broken else solutions[task]
                out.append([f"Here it is:\n```python\n{code}\n```"] * n)
            return out

    config = EvalConfig(
        n=16, temperature=1.0, limit=2, data_dir=str(shared_data), sandbox=trusted_code_sandbox
    )
    good = CodeBackend(broken=False)
    report = evaluate(good, "humaneval", config, progress=False)
    bench = report.benchmarks[0]
    assert good.calls and all(c == (1, 0.0) for c in good.calls)
    assert bench.metric == "pass@1" and bench.samples_per_question == 1
    assert bench.score == 1.0
    assert report.settings["sandbox"] == trusted_code_sandbox  # recorded with the results
    assert "def " in bench.records[0].extracted[0]
    bad = evaluate(CodeBackend(broken=True), "humaneval", config, progress=False)
    assert bad.benchmarks[0].score == 0.0
