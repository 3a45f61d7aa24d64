"""Item 5: the paper's Tables 1, 6 and 7 in miniature, on the embedded addition task.

One run = one ``gmts.train.trainer.Trainer`` from the cached warm start (seed 0 for every run,
so methods differ only by their RL seed and their selection), ``steps`` RL steps of 32 questions
x 8 samples at lr 2e-4 (the demo's recipe), then held-out average@16 and pass@16 on the task's
200 reserved questions. The held-out score is also taken every ``eval_every`` steps for the
learning curves.

Run specs are ``ALGO:SCORE:RATIO[:bottom]:SEED`` (SCORE "none" = all tokens, ratio ignored).
Plans:
- ``full``: Table 1 ({grpo, dapo} x {none, entropy, gmts @0.2} x seeds 0-2), Table 7 (dapo x
  {entropy, gmts} x ratios {0.1, 0.2, 0.5, 0.9} x seeds 0-2) and Table 6 (dapo x {entropy, gmts}
  bottom 80% x seeds 0-2): 42 runs.
- ``subset``: dapo x {none, entropy, gmts @0.2} x seeds 0-1 plus dapo {entropy, gmts} bottom 0.8
  with seed 0: 8 runs.
- ``mini``: dapo x {none, entropy, gmts @0.2}, seed 0: 3 runs.
- ``table1``, ``table6``, ``table7``: one table of the full plan.

Each run writes ``<out>/learning_runs/<id>.json`` in its own process; a run whose file exists
with the same settings is not repeated, so a sweep can be stopped and resumed, or grown from
the subset to the full plan. The summary (``learning.json``) aggregates every run file present.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SEEDS = (0, 1, 2)
DEFAULT_STEPS = 150
EVAL_EVERY = 25
SCORE_LABEL = {"none": "all tokens", "entropy": "ETS", "gmts": "GMTS"}


@dataclass(frozen=True)
class RunSpec:
    """One learning run."""

    algorithm: str
    score: str
    ratio: float
    bottom: bool
    seed: int

    def __post_init__(self) -> None:
        if self.algorithm not in ("grpo", "dapo"):
            raise ValueError(f"algorithm must be grpo or dapo, got {self.algorithm!r}")
        if self.score not in SCORE_LABEL:
            raise ValueError(f"score must be one of {list(SCORE_LABEL)}, got {self.score!r}")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")

    @property
    def run_id(self) -> str:
        if self.score == "none":
            return f"{self.algorithm}-all-seed{self.seed}"
        side = "bottom" if self.bottom else "top"
        return f"{self.algorithm}-{self.score}-{side}{self.ratio:g}-seed{self.seed}"

    @property
    def label(self) -> str:
        if self.score == "none":
            return "all tokens"
        side = "bottom" if self.bottom else "top"
        return f"{SCORE_LABEL[self.score]} {side} {self.ratio:g}"

    @classmethod
    def parse(cls, text: str) -> RunSpec:
        parts = text.strip().split(":")
        bottom = "bottom" in parts
        parts = [p for p in parts if p != "bottom"]
        if len(parts) != 4:
            raise ValueError(f"run spec {text!r}: expected ALGO:SCORE:RATIO[:bottom]:SEED")
        algorithm, score, ratio_text, seed_text = parts
        return cls(algorithm, score, float(ratio_text), bottom, int(seed_text))


def _all(algorithm: str, seeds: tuple[int, ...]) -> list[RunSpec]:
    return [RunSpec(algorithm, "none", 1.0, False, s) for s in seeds]


def plan(name: str) -> list[RunSpec]:
    """The runs of a named plan, or of a comma list of run specs."""
    table1 = [
        spec
        for algorithm in ("grpo", "dapo")
        for spec in _all(algorithm, SEEDS)
        + [RunSpec(algorithm, s, 0.2, False, seed) for s in ("entropy", "gmts") for seed in SEEDS]
    ]
    table7 = [
        RunSpec("dapo", s, r, False, seed)
        for r in (0.1, 0.2, 0.5, 0.9)
        for s in ("entropy", "gmts")
        for seed in SEEDS
    ]
    table6 = [RunSpec("dapo", s, 0.8, True, seed) for s in ("entropy", "gmts") for seed in SEEDS]
    plans = {
        "table1": table1,
        "table7": table7,
        "table6": table6,
        "subset": _all("dapo", (0, 1))
        + [RunSpec("dapo", s, 0.2, False, seed) for seed in (0, 1) for s in ("entropy", "gmts")]
        + [RunSpec("dapo", s, 0.8, True, 0) for s in ("entropy", "gmts")],
        "quick": [RunSpec("dapo", "none", 1.0, False, 0), RunSpec("dapo", "gmts", 0.2, False, 0)],
        "mini": _all("dapo", (0,))
        + [RunSpec("dapo", s, 0.2, False, 0) for s in ("entropy", "gmts")],
    }
    if name == "full":
        specs = table1 + table7 + table6
    elif name in plans:
        specs = plans[name]
    else:
        specs = [RunSpec.parse(item) for item in name.split(",") if item.strip()]
    unique: dict[str, RunSpec] = {}
    for spec in specs:
        unique.setdefault(spec.run_id, spec)
    return list(unique.values())


# --------------------------------------------------------------------------------------
# one run (in its own process)


def run_one(spec: RunSpec, steps: int, eval_every: int, eval_questions: int, threads: int) -> dict:
    import torch
    from tiny_setup import StepShape, train_config, warm_model_path

    from gmts.train.trainer import Trainer

    torch.set_num_threads(threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gmts-bench-learning-") as tmp:
        cfg = train_config(
            warm_model_path(),
            Path(tmp) / spec.run_id,
            algorithm=spec.algorithm,
            score=spec.score,
            ratio=spec.ratio,
            largest=not spec.bottom,
            shape=StepShape(),
            steps=steps,
            seed=spec.seed,
            eval_questions=eval_questions,
        )
        cfg.data.eval_every = eval_every
        trainer = Trainer(cfg)
        result = trainer.run()
        evals = []
        eval_file = Path(tmp) / spec.run_id / "eval.jsonl"
        if eval_file.exists():
            evals = [json.loads(line) for line in eval_file.read_text().splitlines() if line]
    keep = ("reward/accuracy", "reward/mean", "select/fraction", "policy/entropy", "time/step_s")
    history = [{k: h[k] for k in keep if k in h} for h in result.history]
    return {
        "spec": asdict(spec),
        "run_id": spec.run_id,
        "steps": steps,
        "eval_every": eval_every,
        "eval_questions": eval_questions,
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
        "eval_curve": evals,
        "history": history,
        "wall_s": time.perf_counter() - start,
    }


def _spawn(
    spec: RunSpec, path: Path, steps: int, eval_every: int, eval_questions: int, threads: int
) -> str:
    from bench_common import python_env

    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        f"--spec={spec.algorithm}:{spec.score}:{spec.ratio}{':bottom' if spec.bottom else ''}:{spec.seed}",
        f"--steps={steps}",
        f"--eval-every={eval_every}",
        f"--eval-questions={eval_questions}",
        f"--threads={threads}",
        f"--out={path}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=python_env())
    if proc.returncode != 0:
        return f"{spec.run_id}: failed: " + " | ".join(
            (proc.stderr or "").strip().splitlines()[-4:]
        )
    return f"{spec.run_id}: ok"


# --------------------------------------------------------------------------------------
# aggregation


def _final_avg(run: dict) -> float | None:
    after = run.get("eval_after") or {}
    key = next((k for k in after if k.startswith("average@")), None)
    return None if key is None else float(after[key])


def _cell(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "mean": None, "std": None, "values": []}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "values": values,
    }


def aggregate(runs: list[dict]) -> dict[str, Any]:
    """Table 1 / 6 / 7 cells (mean, spread over seeds) from the run records present."""
    cells: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        spec = RunSpec(**run["spec"])
        value = _final_avg(run)
        if value is None:
            continue
        cells.setdefault(spec.algorithm, {}).setdefault(spec.label, []).append(value)
    table = {alg: {label: _cell(v) for label, v in sorted(d.items())} for alg, d in cells.items()}
    before = [
        float(v)
        for run in runs
        for k, v in (run.get("eval_before") or {}).items()
        if k.startswith("average@")
    ]
    curves: dict[str, dict[str, dict[int, list[float]]]] = {}
    for run in runs:
        spec = RunSpec(**run["spec"])
        for point in run.get("eval_curve") or []:
            key = next((k for k in point if k.startswith("average@")), None)
            if key is not None and int(point["step"]) > 0:
                by_step = curves.setdefault(spec.algorithm, {}).setdefault(spec.label, {})
                by_step.setdefault(int(point["step"]), []).append(float(point[key]))
    curve_cells = {  # held-out average@k at every evaluated step: how fast each method learns
        alg: {
            label: {str(step): _cell(v) for step, v in sorted(d.items())}
            for label, d in sorted(labels.items())
        }
        for alg, labels in curves.items()
    }
    return {
        "cells": table,
        "curve_cells": curve_cells,
        "warm_start_average": _cell(before[:1]) if before else _cell([]),
    }


def plot_curves(runs: list[dict], out_dir: Path) -> list[str]:
    """Learning curves (training accuracy per step, held-out average@16 per eval) as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    by_alg: dict[str, dict[str, list[dict]]] = {}
    for run in runs:
        spec = RunSpec(**run["spec"])
        by_alg.setdefault(spec.algorithm, {}).setdefault(spec.label, []).append(run)
    for algorithm, groups in sorted(by_alg.items()):
        fig, (ax_train, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
        for label, group in sorted(groups.items()):
            curves = [[h.get("reward/accuracy", 0.0) for h in r["history"]] for r in group]
            n = min(len(c) for c in curves)
            mean = [statistics.fmean(c[i] for c in curves) for i in range(n)]
            smooth = _moving_average(mean, 10)
            style = _line_style(label)
            ax_train.plot(range(1, n + 1), smooth, label=f"{label} (n={len(group)})", **style)
            points: dict[int, list[float]] = {}
            for r in group:
                for e in r.get("eval_curve", []):
                    key = next((k for k in e if k.startswith("average@")), None)
                    if key is not None:
                        points.setdefault(int(e["step"]), []).append(float(e[key]))
            if points:
                xs = sorted(points)
                ax_eval.plot(
                    xs, [statistics.fmean(points[x]) for x in xs], marker="o", label=label, **style
                )
        ax_train.set(
            title=f"{algorithm.upper()}: training accuracy (moving average of 10 steps)",
            xlabel="step",
            ylabel="accuracy of sampled answers",
        )
        ax_eval.set(
            title=f"{algorithm.upper()}: held-out average@16", xlabel="step", ylabel="average@16"
        )
        ax_train.legend(fontsize=7)
        ax_eval.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"learning_{algorithm}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def _line_style(label: str) -> dict[str, Any]:
    """One look per run label: all tokens black; ETS dashed, GMTS solid; colour = the ratio."""
    if label == "all tokens":
        return {"color": "black", "linewidth": 2.0}
    method, side, ratio = label.split()  # e.g. "GMTS top 0.2"
    colours = {"top 0.1": "C0", "top 0.2": "C1", "top 0.5": "C2", "top 0.9": "C3"}
    colour = colours.get(f"{side} {ratio}", "C4" if side == "bottom" else "C5")
    return {"color": colour, "linestyle": "--" if method == "ETS" else "-"}


def _moving_average(values: list[float], width: int) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


# --------------------------------------------------------------------------------------
# the driver


def run(options) -> dict[str, Any]:
    from bench_common import REPO_ROOT

    plan_name = "quick" if options.quick else options.extra.get("learning_plan") or "subset"
    steps = options.extra.get("learning_steps") or (4 if options.quick else DEFAULT_STEPS)
    eval_every = options.extra.get("learning_eval_every")
    if eval_every is None:
        eval_every = 2 if options.quick else EVAL_EVERY
    eval_questions = options.extra.get("learning_eval_questions") or (8 if options.quick else 200)
    jobs = max(1, int(options.extra.get("learning_jobs") or 1))
    specs = plan(plan_name)
    runs_dir = options.out_dir / "learning_runs"
    runs_dir.mkdir(parents=True, exist_ok=True)

    def needed(spec: RunSpec) -> bool:
        path = runs_dir / f"{spec.run_id}.json"
        if not path.exists():
            return True
        old = json.loads(path.read_text())
        return (old.get("steps"), old.get("eval_every"), old.get("eval_questions")) != (
            steps,
            eval_every,
            eval_questions,
        )

    todo = [s for s in specs if needed(s)]
    print(f"  learning: plan {plan_name!r}: {len(specs)} runs, {len(todo)} to do", flush=True)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(
                _spawn,
                s,
                runs_dir / f"{s.run_id}.json",
                steps,
                eval_every,
                eval_questions,
                options.threads,
            )
            for s in todo
        ]
        messages = []
        for future in futures:
            messages.append(future.result())
            print("  learning:", messages[-1], flush=True)
    wanted = {s.run_id for s in specs}
    runs = []
    for path in sorted(runs_dir.glob("*.json")):
        run_record = json.loads(path.read_text())
        if run_record["run_id"] in wanted and run_record.get("steps") == steps:
            runs.append(run_record)
    figure_dir = (
        options.out_dir / "figures" if options.quick else REPO_ROOT / "docs" / "figures" / "results"
    )
    figures = plot_curves(runs, figure_dir) if runs else []
    summary = aggregate(runs)
    rows = [
        {
            "run_id": r["run_id"],
            "label": RunSpec(**r["spec"]).label,
            "algorithm": r["spec"]["algorithm"],
            "seed": r["spec"]["seed"],
            "average_before": next(
                (v for k, v in (r.get("eval_before") or {}).items() if k.startswith("average@")),
                None,
            ),
            "average_after": _final_avg(r),
            "pass_after": next(
                (v for k, v in (r.get("eval_after") or {}).items() if k.startswith("pass@")), None
            ),
            "selected_fraction": statistics.fmean(
                h.get("select/fraction", 1.0) for h in r["history"]
            )
            if r["history"]
            else None,
            "wall_s": r["wall_s"],
        }
        for r in runs
    ]
    return {
        "settings": {
            "plan": plan_name,
            "runs_in_plan": len(specs),
            "runs_done": len(runs),
            "steps": steps,
            "questions": 32,
            "group_size": 8,
            "lr": 2e-4,
            "eval_every": eval_every,
            "eval_questions": eval_questions,
            "eval_samples": 16,
            "jobs": jobs,
            "warm_start_seed": 0,
        },
        "failures": [m for m in messages if not m.endswith(": ok")],
        "rows": rows,
        "summary": summary,
        "figures": [
            str(Path(f).relative_to(REPO_ROOT)) if f.startswith(str(REPO_ROOT)) else f
            for f in figures
        ],
        "goals": [],
    }


def _main() -> int:
    parser = argparse.ArgumentParser(description="one learning run (worker of bench_learning)")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    parser.add_argument("--eval-questions", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    record = run_one(
        RunSpec.parse(args.spec), args.steps, args.eval_every, args.eval_questions, args.threads
    )
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
