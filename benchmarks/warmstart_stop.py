"""How far the warm start's early stop overshoots its target, on several floating-point paths.

The supervised warm start (``gmts.embedded.warmstart``) stops at the first check whose greedy
accuracy on a fixed set of training questions reaches ``stop_at_greedy``. The warm-up's
accuracy jumps steeply, so a coarse check can stop well past the target, and where the jump
falls depends on the seed and on the CPU's floating-point path (SIMD width of PyTorch's own
kernels and oneDNN's, thread count). This script traces the real warm-start loop
(``warmstart._train`` with an observer: the same steps, the same data) and records, at every
step near the jump (every 10 steps before it), the greedy accuracy on the first 100 and on all
``--check-questions`` of the check set (the set is a fixed stream, so its first 100 questions
are the old check set) and on the 200 held-out questions. It then replays stopping rules on
each trace: where each would have stopped, the check accuracy there (overshoot = that minus
the target) and the held-out greedy accuracy of the model it would have kept.

Each trace runs in its own process, because the floating-point path is chosen when torch
loads (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``)::

    python benchmarks/warmstart_stop.py --seeds 0,1,2 --paths default,avx2 --out DIR

writes ``DIR/trace-<path>-seed<S>-t<threads>.json`` (resumable: a trace present is reused) and
``DIR/warmstart_stop.json`` (the rules replayed on every trace), and prints a table.
``--quick`` (seed 0, 5 steps, every one traced) runs in CI (tests/benchmarks/test_bench_smoke.py)
on both paths and only checks that the tracing path works. A trace costs a few minutes
(136-910 s each for seeds 0-2 on 2 cores at load average 7-10: seed 0's rise comes after a long
plateau traced step by step); docs/training.md has the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

PATHS: dict[str, dict[str, str]] = {
    "default": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
}
"""Floating-point paths one machine can take (environment set before torch loads): its own
SIMD kernels; PyTorch's and oneDNN's limited to AVX2, as on an AVX2-only CPU; no SIMD in
PyTorch's own kernels."""

DENSE_FROM = 0.08
"""Check accuracy (first 100 questions) from which every step is traced."""


def rule_name(config: Any) -> str:
    """A stopping rule (a ``WarmStartConfig``) in words."""
    fine = (
        f", every step from {config.fine_check_from:g}"
        if config.fine_check_from is not None
        else ""
    )
    mean = f", mean of the last {config.stop_window}" if config.stop_window > 1 else ""
    return f"every {config.check_every} steps, {config.check_questions} questions{fine}{mean}"


def replay(config: Any, trace: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where the warm start's own stop (``warmstart.StopCheck`` with ``config``) stops on
    ``trace`` (rows ``step``, ``check@N``, ``held_out``): the step, the accuracy it stopped on,
    the overshoot and the held-out greedy accuracy (at the step, and averaged over the step +-2);
    None when the trace lacks a row the rule would check, or never gets there."""
    from gmts.embedded.warmstart import StopCheck

    rows = {r["step"]: r for r in trace}
    key = f"check@{config.check_questions}"
    # before the first row traced densely, only every 10th step was traced, all of them below
    # DENSE_FROM: a step in between counts as below the target (and below fine_check_from)
    dense = min((r["step"] for r in trace if "held_out" in r), default=max(rows) + 1)
    stop = StopCheck(config)
    for step in range(1, max(rows) + 1):
        if not stop.due(step):
            continue
        row = rows.get(step)
        if row is None and step < dense:
            continue
        if row is None or key not in row:
            return None
        if stop.record(step, row[key]):
            near = [
                rows[t]["held_out"]
                for t in range(step - 2, step + 3)
                if "held_out" in rows.get(t, {})
            ]
            return {
                "step": step,
                "check": stop.smoothed,
                "overshoot": stop.smoothed - config.stop_at_greedy,
                "held_out": row.get("held_out"),
                "held_out_near": statistics.fmean(near) if near else None,
            }
    return None


class _Done(Exception):
    pass


def trace_one(
    seed: int, check_questions: int, until: float, max_steps: int, dense_from: float = DENSE_FROM
) -> dict[str, Any]:
    """The real warm-start loop, observed; stops once the first-100 check reaches ``until``.
    Every step is traced (with the held-out accuracy) from the first check at ``dense_from``
    on, every 10th step before."""
    import random

    import torch

    from gmts.embedded import warmstart
    from gmts.embedded.evaluation import evaluate_task
    from gmts.embedded.tasks import get_task
    from gmts.embedded.tokenizer import build_char_tokenizer

    config = warmstart.WarmStartConfig(steps=max_steps, stop_at_greedy=None)
    task = get_task("addition")
    tokenizer = build_char_tokenizer()
    check = task.sample(check_questions, random.Random("warmstart-check/addition"))
    held_out = task.held_out(config.eval_questions)
    rows: list[dict[str, Any]] = []
    best = 0.0
    start = time.perf_counter()

    def greedy(model: Any, problems: list[Any]) -> list[float]:
        model.eval()
        result = evaluate_task(model, tokenizer, task, problems, n=1, temperature=0.0)
        model.train()
        return list(result.per_question)

    def observe(steps_done: int, model: Any) -> None:
        nonlocal best
        if not (best >= dense_from or steps_done % 10 == 0):
            return
        per_question = greedy(model, check)
        row = {
            "step": steps_done,
            "check@100": statistics.fmean(per_question[:100]),
            f"check@{check_questions}": statistics.fmean(per_question),
        }
        best = max(best, row["check@100"])
        if best >= dense_from:
            row["held_out"] = statistics.fmean(greedy(model, held_out))
        rows.append(row)
        if row["check@100"] >= until:
            raise _Done

    with contextlib.suppress(_Done):  # the trace went far enough
        warmstart._train("addition", seed=seed, config=config, progress=False, observe=observe)
    return {
        "seed": seed,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "env": {
            k: os.environ[k]
            for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
            if k in os.environ
        },
        "check_questions": check_questions,
        "dense_from": dense_from,
        "trace": rows,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _spawn(path_name: str, seed: int, threads: int, args: argparse.Namespace, out: Path) -> str:
    env = {**os.environ, **PATHS[path_name]}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        f"--seed={seed}",
        f"--threads={threads}",
        f"--check-questions={args.check_questions}",
        f"--until={args.until}",
        f"--max-steps={args.max_steps}",
        f"--dense-from={args.dense_from}",
        f"--trace-out={out}",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"{out.name}: failed: {proc.stderr.strip().splitlines()[-1:]}"
    return f"{out.name}: ok"


def rules() -> tuple[Any, ...]:
    """The rules replayed: the one before (gmts of 2026-12-01), finer checks, a larger check
    set, means over checks, and the default now (the last)."""
    from gmts.embedded.warmstart import WarmStartConfig

    before = WarmStartConfig(check_questions=100, fine_check_from=None, stop_window=1)
    return (
        before,
        replace(before, check_every=1),
        replace(before, fine_check_from=0.2, stop_window=5),
        WarmStartConfig(stop_window=1),
        WarmStartConfig(stop_window=3),
        WarmStartConfig(stop_window=10),
        WarmStartConfig(),
    )


def summarize(traces: dict[str, dict[str, Any]], configs: tuple[Any, ...]) -> dict[str, Any]:
    """Every rule replayed on every trace, and per rule the spread over traces."""
    per_rule = []
    for config in configs:
        stops = {name: replay(config, t["trace"]) for name, t in traces.items()}
        done = [s for s in stops.values() if s is not None]
        held = [s["held_out"] for s in done if s["held_out"] is not None]
        near = [s["held_out_near"] for s in done if s["held_out_near"] is not None]
        per_rule.append(
            {
                "rule": rule_name(config),
                "target": config.stop_at_greedy,
                "stops": stops,
                "max_overshoot": max((s["overshoot"] for s in done), default=None),
                "held_out_range": [min(held, default=None), max(held, default=None)],
                "held_out_std": statistics.stdev(held) if len(held) > 1 else None,
                "held_out_near_range": [min(near, default=None), max(near, default=None)],
                "held_out_near_std": statistics.stdev(near) if len(near) > 1 else None,
            }
        )
    return {"rules": per_rule}


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    for r in summary["rules"]:
        lines.append(f"{r['rule']} (target {r['target']:.0%}):")
        for name, s in r["stops"].items():
            if s is None:
                lines.append(f"  {name:<28} not reached / not traced")
                continue
            held = "-" if s["held_out"] is None else f"{100 * s['held_out']:.1f}%"
            near = "-" if s["held_out_near"] is None else f"{100 * s['held_out_near']:.1f}%"
            lines.append(
                f"  {name:<28} step {s['step']:>5}  check {100 * s['check']:5.1f}%  "
                f"overshoot {100 * s['overshoot']:+5.1f}p  held-out greedy {held} "
                f"(+-2 steps: {near})"
            )
        lo, hi = r["held_out_range"]
        nlo, nhi = r["held_out_near_range"]
        if r["max_overshoot"] is not None and lo is not None and nlo is not None:
            std = r["held_out_std"] or 0.0
            nstd = r["held_out_near_std"] or 0.0
            lines.append(
                f"  max overshoot {100 * r['max_overshoot']:+.1f}p; held-out greedy at the stop "
                f"{100 * lo:.1f}-{100 * hi:.1f}% (std {100 * std:.1f}); mean over the stop "
                f"+-2 steps {100 * nlo:.1f}-{100 * nhi:.1f}% (std {100 * nstd:.1f})"
            )
    return "\n".join(lines)


QUICK = {"seeds": "0", "max_steps": 5, "dense_from": 0.0}
"""``--quick``: one seed, 5 steps, each traced with the held-out accuracy (only checks that the
tracing path runs: no rule reaches its target in 5 steps)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seeds", default="0,1,2", help="Warm-start seeds (comma list).")
    parser.add_argument("--paths", default="default,avx2", help=f"Some of {list(PATHS)}.")
    parser.add_argument("--threads", default="1", help="torch thread counts (comma list).")
    parser.add_argument("--check-questions", type=int, default=400)
    parser.add_argument("--until", type=float, default=0.6, help="Trace until this check@100.")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument(
        "--dense-from", type=float, default=DENSE_FROM, help="Trace every step from this check@100."
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK}: checks that it runs.")
    parser.add_argument("--jobs", type=int, default=1, help="Traces at a time.")
    parser.add_argument("--out", type=Path, default=Path("runs/warmstart_stop"))
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.max_steps, args.dense_from = (
            QUICK["seeds"],
            QUICK["max_steps"],
            QUICK["dense_from"],
        )
    if args.worker:
        import torch

        torch.set_num_threads(int(args.threads))
        record = trace_one(
            args.seed, args.check_questions, args.until, args.max_steps, args.dense_from
        )
        args.trace_out.write_text(json.dumps(record, indent=1) + "\n")
        return 0
    unknown = [p for p in args.paths.split(",") if p not in PATHS]
    if unknown:
        parser.error(f"unknown paths {unknown}; valid: {list(PATHS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (p, int(s), int(t))
        for p in args.paths.split(",")
        for s in args.seeds.split(",")
        for t in args.threads.split(",")
    ]
    files = {job: args.out / f"trace-{job[0]}-seed{job[1]}-t{job[2]}.json" for job in jobs}
    todo = [job for job in jobs if not files[job].exists()]
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for message in pool.map(lambda j: _spawn(*j, args, files[j]), todo):
            print(message, flush=True)
            failed += not message.endswith(": ok")
    traces = {
        f"{p} seed {s} threads {t}": json.loads(files[(p, s, t)].read_text())
        for (p, s, t) in jobs
        if files[(p, s, t)].exists()
    }
    summary = {"traces": traces, **summarize(traces, rules())}
    (args.out / "warmstart_stop.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(format_summary(summary))
    return 1 if failed else 0  # the summary covers the traces that exist


if __name__ == "__main__":
    raise SystemExit(main())
