"""The method comparison on a real model: SmolLM2-135M-Instruct trained with DAPO on
``addition-2digit`` with all tokens, ETS top 20%, GMTS top 20% and a random 20% (the control),
seeds 0-2 each (issue 24, item 5).

Each run is ``gmts train --config configs/smollm2-135m-instruct/dapo-<method>.yaml seed=S``
(plus ``--set`` overrides) in its own process, alone on the machine (runs are never side by
side: two jobs on 2 cores distort each other's times). Within a seed every method starts from
the same pretrained model and sees the same questions in the same order (the data order is
seeded by the run seed); held-out average@k on ``addition-2digit``'s test split (no question
shared with training) is taken before training, every ``data.eval_every`` steps and at the end.

Each run writes ``<out>/real_model_runs/<method>-seed<S>.json`` as it finishes (its config, the
held-out curve, every step's reward, selected fraction and time, the machine and load before and
after, the command and the commit), so an interruption loses at most the run in flight; a run
whose record holds the same config is not repeated. Runs go seed by seed (all methods of seed 0
first), so a stopped comparison leaves whole seeds. The summary (``real_model_comparison.json``
and the printed table) reports, as ``gmts demo`` does, each method's mean +- std over seeds and
the paired differences A - B with their 95% t intervals ("within the seed spread" where the
interval holds 0).

    python benchmarks/real_model_comparison.py                    # the whole comparison
    python benchmarks/real_model_comparison.py --seeds 1          # one seed of each method
    python benchmarks/real_model_comparison.py --quick --out /tmp/q   # CI: 1 step, tiny batch
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_common import machine_record, provenance_commit, utc_now  # noqa: E402

from gmts.demo.stats import mean_std, paired_difference  # noqa: E402
from gmts.provenance import load  # noqa: E402

CONFIGS = REPO / "configs" / "smollm2-135m-instruct"
METHODS = {
    "all tokens": "none",
    "ETS top 20%": "ets",
    "GMTS top 20%": "gmts",
    "random 20%": "random",
}
"""Table label -> the config's suffix (``dapo-<suffix>.yaml``)."""
PAIRS = (
    ("GMTS top 20%", "ETS top 20%"),
    ("GMTS top 20%", "random 20%"),
    ("GMTS top 20%", "all tokens"),
    ("ETS top 20%", "all tokens"),
    ("random 20%", "all tokens"),
)
QUICK = (
    "optim.steps=1",
    "rollout.questions_per_batch=2",
    "rollout.group_size=2",
    "rollout.max_response_length=16",
    "data.eval_questions=2",
    "data.eval_samples=2",
    "data.eval_every=0",
    "checkpoint.every=0",
    "checkpoint.save_final=false",
    "logging.progress=false",
)


def run_one(
    method: str, seed: int, out: Path, overrides: list[str], *, evaluate_start: bool
) -> dict[str, Any]:
    """Train one run (unless its record with this config exists) and return its record.

    ``evaluate_start``: evaluate the pretrained model first. Within a seed every method starts
    from the same weights and evaluates with the same sampling seed, so one run per seed does it
    and the others take its figure (``data.eval_before=false``: the evaluation draws from its
    own seeded generator, so it changes nothing in training).
    """
    suffix = METHODS[method]
    record_path = out / "real_model_runs" / f"{suffix}-seed{seed}.json"
    run_dir = out / "runs" / f"{suffix}-seed{seed}"
    config = CONFIGS / f"dapo-{suffix}.yaml"
    args = [f"seed={seed}", f"logging.output_dir={run_dir}", *overrides]
    if not evaluate_start:
        args.append(SHARED_START)
    if record_path.is_file():
        old = json.loads(record_path.read_text())
        if old.get("args") == args and old.get("config_file") == str(config.relative_to(REPO)):
            return old
    command = [sys.executable, "-m", "gmts", "train", "--config", str(config), "--overwrite"]
    command += args
    before, machine, started = load(), machine_record(), utc_now()
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, text=True, capture_output=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SystemExit(f"run {suffix}-seed{seed} failed (exit {done.returncode}):\n{tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    record = {
        "method": method,
        "seed": seed,
        "config_file": str(config.relative_to(REPO)),
        "args": args,
        "resolved_config": (run_dir / "config.yaml").read_text(),
        "command": " ".join(command[1:]),
        "commit": provenance_commit(REPO),
        "started": started,
        "finished": utc_now(),
        "wall_s": round(wall, 1),
        "load_before": before,
        "load_after": load(),
        "machine": machine,
        "evals": evals,
        "steps": [
            {
                key: row[key]
                for key in (
                    "step",
                    "reward/mean",
                    "reward/accuracy",
                    "select/fraction",
                    "select/positive_adv_fraction",
                    "response/length_mean",
                    "policy/entropy",
                    "time/step_s",
                )
                if key in row
            }
            for row in rows
        ],
    }
    record_path.parent.mkdir(parents=True, exist_ok=True)
    staging = record_path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(staging, record_path)
    return record


SHARED_START = "data.eval_before=false"
"""The argument of a run that takes its seed's pretrained figure from the seed's first run."""


def pretrained_by_seed(records: list[dict[str, Any]]) -> dict[int, float]:
    """Seed -> the pretrained model's held-out figure (%), from the run of the seed that took
    it (the others carry :data:`SHARED_START`)."""
    return {r["seed"]: _accuracy(r["evals"][0]) for r in records if SHARED_START not in r["args"]}


def _accuracy(row: dict[str, Any]) -> float:
    """A held-out evaluation row's average@k in percent."""
    key = next(k for k in row if k.startswith("average@"))
    return 100.0 * float(row[key])


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method: held-out accuracy before, at the end, its gain and the mean over the curve,
    the share of its selected tokens with a positive advantage (in a right answer) and the
    seconds per step (mean +- std over seeds); per pair of methods: the paired differences
    over common seeds."""
    by_method: dict[str, dict[int, dict[str, float]]] = {}
    start_of_seed = pretrained_by_seed(records)
    for record in records:
        curve = [_accuracy(row) for row in record["evals"]]
        if SHARED_START in record["args"]:
            curve = [start_of_seed[record["seed"]], *curve]
        times = [s["time/step_s"] for s in record["steps"] if "time/step_s" in s]
        positive = [  # a step that selected nothing logs no number here
            s["select/positive_adv_fraction"]
            for s in record["steps"]
            if isinstance(s.get("select/positive_adv_fraction"), (int, float))
        ]
        by_method.setdefault(record["method"], {})[record["seed"]] = {
            "start": curve[0],
            "final": curve[-1],
            "gain": curve[-1] - curve[0],
            "mean": sum(curve) / len(curve),
            "s_per_step": sum(times) / max(len(times), 1),
            "positive_selected": 100.0 * sum(positive) / max(len(positive), 1),
        }
    methods: dict[str, Any] = {}
    for method, seeds in by_method.items():
        methods[method] = {"seeds": sorted(seeds)}
        for key in ("start", "final", "gain", "mean", "s_per_step", "positive_selected"):
            mean, std = mean_std([seeds[s][key] for s in sorted(seeds)])
            methods[method][key] = {"mean": mean, "std": std}
    pairs: list[dict[str, Any]] = []
    for a, b in PAIRS:
        common = sorted(set(by_method.get(a, {})) & set(by_method.get(b, {})))
        if not common:
            continue
        for key in ("mean", "final"):
            diff = paired_difference(
                [by_method[a][s][key] for s in common], [by_method[b][s][key] for s in common]
            )
            pairs.append({"a": a, "b": b, "metric": key, "seeds": common, **diff.__dict__})
    return {"methods": methods, "pairs": pairs}


def format_summary(summary: dict[str, Any]) -> str:
    def cell(stat: dict[str, Any]) -> str:
        std = stat["std"]
        return f"{stat['mean']:.1f}" + (f"±{std:.1f}" if std is not None else "")

    head = f"{'method':<15}{'before':>11}{'final':>11}{'gain':>11}{'mean':>11}{'A>0 sel':>9}"
    lines = [head + f"{'s/step':>9}"]
    for method in METHODS:
        if method not in summary["methods"]:
            continue
        m = summary["methods"][method]
        cells = "".join(f"{cell(m[k]):>11}" for k in ("start", "final", "gain", "mean"))
        positive = f"{m['positive_selected']['mean']:.1f}%"
        lines.append(f"{method:<15}{cells}{positive:>9}{m['s_per_step']['mean']:>9.1f}")
    lines.append("paired by seed, A - B in points: mean±std [95% t interval]")
    for p in summary["pairs"]:
        spread = f"±{p['std']:.1f} [{p['low']:+.1f}, {p['high']:+.1f}]" if p["std"] else ""
        verdict = ""
        if p["low"] is not None:
            clear = p["low"] > 0 or p["high"] < 0
            verdict = "; larger than the seed spread" if clear else "; within the seed spread"
        lines.append(
            f"  {p['a']} - {p['b']} ({p['metric']}): {p['mean']:+.1f}{spread}; "
            f"A ahead on {p['ahead']} of {len(p['seeds'])} seeds{verdict}"
        )
    return "\n".join(lines)


def plot_comparison(records: list[dict[str, Any]], out: Path) -> Path:
    """``out``: the training reward per step (mean over seeds, min-max band) and the held-out
    average@k before and after training (each seed a dot, the mean a bar), per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in METHODS if any(r["method"] == m for r in records)]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (curve_ax, bar_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, method in enumerate(methods):
        color = colors[i % len(colors)]
        runs = [r for r in records if r["method"] == method]
        per_step: dict[int, list[float]] = {}
        for run in runs:
            for row in run["steps"]:
                per_step.setdefault(row["step"], []).append(100.0 * row["reward/mean"])
        steps = sorted(s for s, v in per_step.items() if len(v) == len(runs))
        mean = [sum(per_step[s]) / len(per_step[s]) for s in steps]
        curve_ax.plot(steps, mean, color=color, marker="o", markersize=3, label=method)
        if len(runs) > 1:
            low = [min(per_step[s]) for s in steps]
            high = [max(per_step[s]) for s in steps]
            curve_ax.fill_between(steps, low, high, color=color, alpha=0.15, lw=0)
        finals = [_accuracy(r["evals"][-1]) for r in runs]
        bar_ax.bar(i + 1, sum(finals) / len(finals), color=color, alpha=0.5)
        bar_ax.scatter([i + 1] * len(finals), finals, color=color, s=14, zorder=3)
    starts = list(pretrained_by_seed(records).values())
    bar_ax.bar(0, sum(starts) / max(len(starts), 1), color="grey", alpha=0.5)
    bar_ax.scatter([0] * len(starts), starts, color="grey", s=14, zorder=3)
    bar_ax.set_xticks(range(len(methods) + 1), ["pretrained", *methods], fontsize=8)
    key = next((k for k in records[0]["evals"][-1] if k.startswith("average@")), "average@k")
    bar_ax.set_ylabel(f"held-out {key} (%)")
    bar_ax.set_title("held-out: pretrained, after training (dots: seeds; bar: mean)", fontsize=10)
    curve_ax.set_xlabel("RL step")
    curve_ax.set_ylabel("training reward (%)")
    n_seeds = len({r["seed"] for r in records})
    seeds = f"mean of {n_seeds} seeds, band: min to max" if n_seeds > 1 else "one seed"
    curve_ax.set_title(f"training reward ({seeds})", fontsize=10)
    curve_ax.legend(fontsize=8, frameon=False, loc="upper left")
    for ax in (curve_ax, bar_ax):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def read_records(out: Path) -> list[dict[str, Any]]:
    """Every run record under ``<out>/real_model_runs``, seed by seed in the methods' order."""
    records = [json.loads(p.read_text()) for p in (out / "real_model_runs").glob("*.json")]
    order = list(METHODS)
    return sorted(records, key=lambda r: (r["seed"], order.index(r["method"])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 of each method")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma list of labels")
    parser.add_argument("--set", action="append", default=[], help="section.field=value")
    parser.add_argument("--quick", action="store_true", help="1 step, tiny batch (CI)")
    parser.add_argument(
        "--report",
        action="store_true",
        help="train nothing: summarise and plot the records already under --out",
    )
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or args.seeds < 1:
        parser.error(f"unknown methods {unknown} (valid: {list(METHODS)}) or seeds < 1")
    overrides = [*(QUICK if args.quick else ()), *args.set]
    out = Path(args.out)
    if args.report:
        records = read_records(out)
    else:
        records = []
        for seed in range(args.seeds):
            for method in methods:
                first = method == methods[0]
                record = run_one(method, seed, out, overrides, evaluate_start=first)
                records.append(record)
                print(f"{method} seed {seed}: {record['wall_s']:.0f} s", flush=True)
    if not records:
        parser.error(f"no run records under {out / 'real_model_runs'}")
    summary = summarize(records)
    summary["overrides"] = sorted({a for r in records for a in r["args"][2:]})
    (out / "real_model_comparison.json").write_text(json.dumps(summary, indent=1) + "\n")
    figure = plot_comparison(records, out / "real_model_comparison.png")
    print(format_summary(summary))
    print(f"figure: {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
