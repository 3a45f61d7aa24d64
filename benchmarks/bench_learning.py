"""Item 5: the paper's Tables 1, 6 and 7 in miniature, on the embedded addition task; and the
same comparison under other objectives (GSPO, CISPO).

One run = one ``gmts.train.trainer.Trainer`` from the cached warm start (seed 0 for every run,
so methods differ only by their RL seed and their selection), ``steps`` RL steps of 32 questions
x 8 samples at lr 2e-4 (the demo's recipe), then held-out average@16 and pass@16 on the task's
200 reserved questions. The held-out score is also taken every ``eval_every`` steps for the
learning curves.

Run specs are ``RECIPE:SCORE:RATIO[:bottom]:SEED`` (SCORE "none" = all tokens, ratio ignored).
RECIPE names an entry of ``RECIPES``: ``grpo`` and ``dapo`` (the trainer's algorithms, one update
per rollout batch, as before), ``gspo``, ``cispo`` and ``dapo-4mb`` (their reference: DAPO with
the same four updates per rollout batch). So every spec written before (``dapo:gmts:0.2:0``)
means what it meant.

Plans:
- ``full``: Table 1 ({grpo, dapo} x {none, entropy, gmts @0.2} x seeds 0-2), Table 7 (dapo x
  {entropy, gmts} x ratios {0.1, 0.2, 0.5, 0.9} x seeds 0-2) and Table 6 (dapo x {entropy, gmts}
  bottom 80% x seeds 0-2): 42 runs.
- ``objectives``: {gspo, cispo, dapo-4mb} x {none, entropy, gmts @0.2} x seeds 0-2: 27 runs.
- ``subset``: dapo x {none, entropy, gmts @0.2} x seeds 0-1 plus dapo {entropy, gmts} bottom 0.8
  with seed 0: 8 runs.
- ``mini``: dapo x {none, entropy, gmts @0.2}, seed 0: 3 runs.
- ``table1``, ``table6``, ``table7``: one table of the full plan.
A plan may be a comma list of plan names and run specs: ``full,objectives`` is every table in
one summary (what docs/results.md renders).

Each run writes ``<out>/learning_runs/<id>.json`` in its own process, with its resolved trainer
config; a run whose file holds the same config (and steps, evaluation, threads) is not
repeated, so a sweep can be stopped and resumed, or grown from the subset to the full plan. A
change of the code that the config does not show (a new default inside the core, say) is not
detected: delete ``learning_runs/`` then. The summary (``learning.json``) aggregates every run
file of the plan present.
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
class Recipe:
    """How a run spec's first field trains, on top of the demo's recipe.

    Attributes:
        title: the name in the tables.
        algorithm: the trainer's ``algorithm`` (grpo or dapo): the objective preset it starts
            from and whether DAPO's dynamic sampling is on.
        objective: an ``ObjectiveConfig.preset`` that replaces the algorithm's (None: keep it).
        mini_batch_questions: questions per optimizer step (None: the whole rollout batch of
            32, one update per batch). Below 32 the later updates of a batch are off-policy,
            the only place where an objective's ratio clip or weight clip acts.
        description: the recipe in words (docs/results.md).
    """

    title: str
    algorithm: str
    objective: str | None = None
    mini_batch_questions: int | None = None
    description: str = ""

    def apply(self, cfg: Any) -> Any:
        """``cfg`` (a TrainConfig built for ``algorithm``) with this recipe's objective and
        mini-batches."""
        from dataclasses import replace

        from gmts.core.objectives import ObjectiveConfig

        objective = ObjectiveConfig.preset(self.objective) if self.objective else cfg.objective
        optim = replace(cfg.optim, mini_batch_questions=self.mini_batch_questions)
        return replace(cfg, objective=objective, optim=optim)


RECIPES: dict[str, Recipe] = {
    "grpo": Recipe("GRPO", "grpo", description="GRPO (eq. 1, KL 0.001), one update per batch"),
    "dapo": Recipe("DAPO", "dapo", description="DAPO (clip 0.2 / 0.28), one update per batch"),
    "dapo-4mb": Recipe(
        "DAPO, 4 updates",
        "dapo",
        mini_batch_questions=8,
        description="DAPO with 4 mini-batches of 8 questions per rollout batch (the reference "
        "for GSPO and CISPO, which use the same)",
    ),
    "gspo": Recipe(
        "GSPO",
        "grpo",
        objective="gspo",
        mini_batch_questions=8,
        description="GSPO as in its paper: sequence-level ratio clipped to [1 - 3e-4, 1 + "
        "4e-4], seq-mean-token-mean, no KL, GRPO's groups without dynamic sampling, 4 "
        "mini-batches per rollout batch",
    ),
    "cispo": Recipe(
        "CISPO",
        "dapo",
        objective="cispo",
        mini_batch_questions=8,
        description="CISPO (ScaleRL / MiniMax-M1): token weight min(r, 5) detached times A "
        "times log pi, token-mean, DAPO's dynamic sampling, 4 mini-batches per rollout batch",
    ),
}
"""Run-spec recipe -> how it trains (``RunSpec.algorithm`` holds the key)."""


@dataclass(frozen=True)
class RunSpec:
    """One learning run. ``algorithm`` names a recipe of ``RECIPES`` (the field keeps its old
    name so that the run files written before still load)."""

    algorithm: str
    score: str
    ratio: float
    bottom: bool
    seed: int

    def __post_init__(self) -> None:
        if self.algorithm not in RECIPES:
            raise ValueError(f"recipe must be one of {list(RECIPES)}, got {self.algorithm!r}")
        if self.score not in SCORE_LABEL:
            raise ValueError(f"score must be one of {list(SCORE_LABEL)}, got {self.score!r}")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")

    @property
    def recipe(self) -> Recipe:
        return RECIPES[self.algorithm]

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
            raise ValueError(f"run spec {text!r}: expected RECIPE:SCORE:RATIO[:bottom]:SEED")
        algorithm, score, ratio_text, seed_text = parts
        return cls(algorithm, score, float(ratio_text), bottom, int(seed_text))


def _all(algorithm: str, seeds: tuple[int, ...]) -> list[RunSpec]:
    return [RunSpec(algorithm, "none", 1.0, False, s) for s in seeds]


def plan(name: str) -> list[RunSpec]:
    """The runs of a comma list of plan names and run specs (``full,objectives``,
    ``dapo:gmts:0.2:0,gspo:none:1:0``), each run once, in order."""
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
    objectives = [
        spec
        for recipe in ("dapo-4mb", "gspo", "cispo")
        for spec in _all(recipe, SEEDS)
        + [RunSpec(recipe, s, 0.2, False, seed) for s in ("entropy", "gmts") for seed in SEEDS]
    ]
    plans = {
        "objectives": objectives,
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
    plans["full"] = table1 + table7 + table6
    specs = []
    for item in (part.strip() for part in name.split(",")):
        if item:
            if item in plans:
                specs += plans[item]
                continue
            try:
                specs.append(RunSpec.parse(item))
            except ValueError as error:
                raise ValueError(f"{error}, or a plan name ({', '.join(sorted(plans))})") from None
    if not specs:
        raise ValueError(f"plan {name!r}: no runs (plans: {sorted(plans)}, or run specs)")
    unique: dict[str, RunSpec] = {}
    for spec in specs:
        unique.setdefault(spec.run_id, spec)
    return list(unique.values())


# --------------------------------------------------------------------------------------
# one run (in its own process)


def run_config(
    spec: RunSpec,
    model_path: Path | str,
    run_dir: Path | str,
    steps: int,
    eval_every: int,
    eval_questions: int,
) -> Any:
    """The resolved ``TrainConfig`` of one run: the demo's recipe, the run's recipe, selection
    and seed."""
    from dataclasses import replace

    from tiny_setup import StepShape, train_config

    cfg = train_config(
        model_path,
        run_dir,
        algorithm=spec.recipe.algorithm,
        score=spec.score,
        ratio=spec.ratio,
        largest=not spec.bottom,
        shape=StepShape(),
        steps=steps,
        seed=spec.seed,
        eval_questions=eval_questions,
    )
    cfg = replace(cfg, data=replace(cfg.data, eval_every=eval_every))
    return spec.recipe.apply(cfg)


def config_fingerprint(cfg: Any, threads: int) -> str:
    """What decides a run's numbers, as text: the resolved config (its run directory left
    out) and the thread count. A stored run with another fingerprint is re-run."""
    from dataclasses import replace

    from gmts.train.config import dump_yaml

    cfg = replace(cfg, logging=replace(cfg.logging, output_dir="-"))
    return dump_yaml(cfg) + f"threads: {threads}\n"


KEEP_METRICS = (
    "reward/accuracy",
    "reward/mean",
    "select/fraction",
    "policy/entropy",
    "update/clip_fraction",
    "time/step_s",
)
"""The per-step training metrics a run record keeps."""


def run_one(spec: RunSpec, steps: int, eval_every: int, eval_questions: int, threads: int) -> dict:
    import torch
    from tiny_setup import warm_model_path

    from gmts.train.trainer import Trainer

    torch.set_num_threads(threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gmts-bench-learning-") as tmp:
        model_path = warm_model_path()
        cfg = run_config(
            spec, model_path, Path(tmp) / spec.run_id, steps, eval_every, eval_questions
        )
        trainer = Trainer(cfg)
        result = trainer.run()
        evals = []
        eval_file = Path(tmp) / spec.run_id / "eval.jsonl"
        if eval_file.exists():
            evals = [json.loads(line) for line in eval_file.read_text().splitlines() if line]
    history = [{k: h[k] for k in KEEP_METRICS if k in h} for h in result.history]
    return {
        "spec": asdict(spec),
        "run_id": spec.run_id,
        "steps": steps,
        "eval_every": eval_every,
        "eval_questions": eval_questions,
        "config": config_fingerprint(cfg, threads),
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
    clip: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        history = run.get("history") or []
        values = [h["update/clip_fraction"] for h in history if "update/clip_fraction" in h]
        if values:
            spec = RunSpec(**run["spec"])
            clip.setdefault(spec.algorithm, {}).setdefault(spec.label, []).append(
                statistics.fmean(values)
            )
    return {
        "cells": table,
        "curve_cells": curve_cells,
        "clip_fraction": {
            alg: {label: _cell(v) for label, v in sorted(d.items())} for alg, d in clip.items()
        },
        "paired": paired(runs),
        "warm_start_average": _cell(before[:1]) if before else _cell([]),
    }


def _curve(run: dict) -> list[tuple[int, float]]:
    """(step, held-out average@k) from before training to the end."""
    points = {}
    for k, v in (run.get("eval_before") or {}).items():
        if k.startswith("average@"):
            points[0] = float(v)
    for point in run.get("eval_curve") or []:
        key = next((k for k in point if k.startswith("average@")), None)
        if key is not None:
            points[int(point["step"])] = float(point[key])
    final = _final_avg(run)
    if final is not None:
        points.setdefault(int(run.get("steps") or max(points, default=0)), final)
    return sorted(points.items())


def area_mean(run: dict) -> float | None:
    """Mean held-out average@k over training (trapezoid area / steps), as in gmts demo."""
    points = _curve(run)
    if len(points) < 2:
        return None
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def _pairs(labels: set[str]) -> list[tuple[str, str]]:
    """The comparisons each table makes: GMTS vs ETS at the same ratio and side, and each
    top-20% selection vs all tokens."""
    out = []
    for label in sorted(labels):
        if label.startswith("GMTS ") and "ETS " + label[5:] in labels:
            out.append((label, "ETS " + label[5:]))
    for label in ("GMTS top 0.2", "ETS top 0.2"):
        if label in labels and "all tokens" in labels:
            out.append((label, "all tokens"))
    return out


def paired(runs: list[dict]) -> dict[str, list[dict[str, Any]]]:
    """Per recipe, A - B seed by seed (points of held-out average@k): the final evaluation and
    the mean over training, each with its mean, spread and 95% t interval
    (gmts.demo.stats.paired_difference)."""
    from gmts.demo.stats import paired_difference

    by: dict[str, dict[str, dict[int, dict]]] = {}
    for run in runs:
        spec = RunSpec(**run["spec"])
        by.setdefault(spec.algorithm, {}).setdefault(spec.label, {})[spec.seed] = run
    out: dict[str, list[dict[str, Any]]] = {}
    for alg, labels in by.items():
        for a, b in _pairs(set(labels)):
            seeds = sorted(set(labels[a]) & set(labels[b]))
            row: dict[str, Any] = {"a": a, "b": b, "seeds": seeds}
            for what, value in (("final", _final_avg), ("mean", area_mean)):
                xs = [value(labels[a][s]) for s in seeds]
                ys = [value(labels[b][s]) for s in seeds]
                ok = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
                row[what] = (
                    asdict(paired_difference([100 * x for x, _ in ok], [100 * y for _, y in ok]))
                    if ok
                    else None
                )
            out.setdefault(alg, []).append(row)
    return out


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


@dataclass(frozen=True)
class Sweep:
    """One invocation's sweep: the plan's runs and what every run shares (``steps`` RL steps,
    held-out evaluation every ``eval_every`` steps on ``eval_questions`` questions, the warm
    start at ``model_path``, ``threads`` each), ``jobs`` runs at once into ``runs_dir``."""

    plan_name: str
    specs: list[RunSpec]
    steps: int
    eval_every: int
    eval_questions: int
    jobs: int
    threads: int
    runs_dir: Path
    model_path: str

    def run_file(self, spec: RunSpec) -> Path:
        return self.runs_dir / f"{spec.run_id}.json"

    def fingerprint(self, spec: RunSpec) -> str:
        """What ``spec``'s run file must hold to stand for this sweep's run."""
        cfg = run_config(
            spec,
            self.model_path,
            self.runs_dir / spec.run_id,
            self.steps,
            self.eval_every,
            self.eval_questions,
        )
        return config_fingerprint(cfg, self.threads)

    def needed(self, spec: RunSpec) -> bool:
        """Whether ``spec`` has no run file of this sweep's settings yet."""
        path = self.run_file(spec)
        if not path.exists():
            return True
        old = json.loads(path.read_text())
        return old.get("config") != self.fingerprint(spec)


def sweep_of(options) -> Sweep:
    """The sweep ``options`` (run.py's) ask for; the warm start trained here once if needed."""
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

    from tiny_setup import warm_model_path

    model_path = warm_model_path()  # trained here once (minutes), not by every worker at once
    return Sweep(
        plan_name,
        specs,
        steps,
        eval_every,
        eval_questions,
        jobs,
        options.threads,
        runs_dir,
        model_path,
    )


def run_missing(sweep: Sweep) -> list[str]:
    """Each run of ``sweep`` without its file, ``sweep.jobs`` worker processes at once; one
    message per run (``"<id>: ok"`` or what failed)."""
    todo = [s for s in sweep.specs if sweep.needed(s)]
    print(
        f"  learning: plan {sweep.plan_name!r}: {len(sweep.specs)} runs, {len(todo)} to do",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=sweep.jobs) as pool:
        futures = [
            pool.submit(
                _spawn,
                s,
                sweep.run_file(s),
                sweep.steps,
                sweep.eval_every,
                sweep.eval_questions,
                sweep.threads,
            )
            for s in todo
        ]
        messages = []
        for future in futures:
            messages.append(future.result())
            print("  learning:", messages[-1], flush=True)
    return messages


def plan_runs(sweep: Sweep) -> tuple[list[dict], list[str]]:
    """(the run files of the plan made with this sweep's settings, the ids of the plan's runs
    whose file is older: a run that failed this time is not this plan's result)."""
    wanted = {s.run_id: sweep.fingerprint(s) for s in sweep.specs}
    runs = []
    stale = []
    for path in sorted(sweep.runs_dir.glob("*.json")):
        run_record = json.loads(path.read_text())
        if run_record["run_id"] not in wanted:
            continue
        if run_record.get("config") == wanted[run_record["run_id"]]:
            runs.append(run_record)
        else:  # a run that failed this time: its older file is not this plan's result
            stale.append(run_record["run_id"])
    return runs, stale


def run_row(r: dict) -> dict[str, Any]:
    """One run's row of the record: its scores before and after, its selection, its time."""
    return {
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
        "selected_fraction": statistics.fmean(h.get("select/fraction", 1.0) for h in r["history"])
        if r["history"]
        else None,
        "wall_s": r["wall_s"],
    }


def sweep_settings(sweep: Sweep, runs_done: int) -> dict[str, Any]:
    """The record's ``settings``: the plan, its shared recipe and the recipes it uses."""
    return {
        "plan": sweep.plan_name,
        "runs_in_plan": len(sweep.specs),
        "runs_done": runs_done,
        "steps": sweep.steps,
        "questions": 32,
        "group_size": 8,
        "lr": 2e-4,
        "eval_every": sweep.eval_every,
        "eval_questions": sweep.eval_questions,
        "eval_samples": 16,
        "jobs": sweep.jobs,
        "warm_start_seed": 0,
        "warm_start": Path(sweep.model_path).name,
        "recipes": {
            name: {"title": r.title, "description": r.description}
            for name, r in RECIPES.items()
            if any(spec.algorithm == name for spec in sweep.specs)
        },
    }


def run(options) -> dict[str, Any]:
    from bench_common import DEFAULT_RESULTS_DIR, REPO_ROOT

    sweep = sweep_of(options)
    messages = run_missing(sweep)
    runs, stale = plan_runs(sweep)
    to_docs = not options.quick and options.out_dir.resolve() == DEFAULT_RESULTS_DIR.resolve()
    figure_dir = (
        REPO_ROOT / "docs" / "figures" / "results" if to_docs else options.out_dir / "figures"
    )
    figures = plot_curves(runs, figure_dir) if runs else []
    summary = aggregate(runs)
    return {
        "settings": sweep_settings(sweep, len(runs)),
        "failures": [m for m in messages if not m.endswith(": ok")],
        "stale_runs_left_out": stale,
        "rows": [run_row(r) for r in runs],
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
