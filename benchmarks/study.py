"""The token-selection study on a real model (issue 35): SmolLM2-135M-Instruct trained with DAPO
on all tokens and on the tokens chosen by each selection rule, seeds paired, at a real budget.

Experiments (``EXPERIMENTS``; each a task's config folder, its methods, seeds and overrides):

- ``budget``: all tokens / GMTS 20% / ETS 20% / random 20% on ``addition-2digit``, 25 steps of
  3 questions x 8 answers (600 training answers per run), held-out average@2 on 128 questions
  every 5 steps (every fifth of the run), 5 seeds;
- ``clip``: the same four with each batch of 4 questions x 8 answers split into 4 mini-batches
  (the policy moves between them, so ratios leave 1 and the clip acts), 18 steps (576
  answers), a quarter of the learning rate, 3 seeds; each step records the share of selected
  tokens the clip silenced;
- ``rules``: the newer rules on the first task, 3 seeds, the settings of ``budget`` (its
  all-tokens and GMTS runs of seeds 0-2 are the same runs: a record is reused when its config
  matches);
- ``task2``: the four methods on the second task (a right answer takes 40 tokens or more).

Every run is ``gmts train --config <configs>/dapo-<method>.yaml seed=S <overrides>`` in its own
process, alone on the machine. Within a seed every method starts from the same pretrained model
and sees the same questions in the same order; the seed's first method evaluates the pretrained
model and the others take its figure (``data.eval_before=false``: evaluation draws from its own
seeded generator, so this changes nothing in training). Each run's record is written when it
finishes (``<out>/runs/<configs>/<method>-seed<S>-<key>.json``; key: a hash of the resolved
config, so a run whose config matches a record is never repeated and a changed config runs
again) with its config, held-out curve, every step's metrics, the machine, the load before and
after, the command and the commit: an interruption loses at most the run in flight.

    python benchmarks/study.py budget                   # one experiment (or several, or all)
    python benchmarks/study.py all --report             # summarise the records, train nothing
    python benchmarks/study.py budget --quick --out /tmp/q   # CI: 1 step, tiny batch
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_common import machine_record, provenance_commit, utc_now  # noqa: E402

from gmts.demo.stats import mean_std, paired_difference  # noqa: E402
from gmts.provenance import load  # noqa: E402

CONFIGS = REPO / "configs"
FOUR = {
    "all tokens": "none",
    "GMTS top 20%": "gmts",
    "ETS top 20%": "ets",
    "random 20%": "random",
}
"""Label -> the config's suffix (``dapo-<suffix>.yaml``); all tokens first: it evaluates the
seed's pretrained model."""
BUDGET = (
    "optim.steps=25",
    "data.eval_questions=128",
    "data.eval_samples=2",
    "data.eval_every=5",
)
"""Item 1's budget: 25 steps x 3 x 8 answers, held-out every fifth of the run."""
CLIP = (
    "optim.steps=18",
    "rollout.questions_per_batch=4",
    "optim.mini_batch_questions=1",
    "optim.lr=7.5e-06",
    "data.eval_questions=128",
    "data.eval_samples=2",
    "data.eval_every=6",
)
"""Item 2: 4 mini-batches of one question's 8 answers per step, 18 steps (576 answers), at a
quarter of the learning rate (4 updates a batch where budget makes one: the same step size per
batch). At budget's 3e-5 the first seed collapsed within 2 steps (8 updates) for all tokens and
GMTS alike: answers of 3 tokens, reward 0 from step 3 on, nothing left to learn from (records
kept; docs/results.md section 14)."""
QUICK = (
    "optim.steps=1",
    "rollout.questions_per_batch=2",
    "rollout.group_size=2",
    "optim.mini_batch_questions=null",
    "rollout.max_response_length=16",
    "data.eval_questions=2",
    "data.eval_samples=2",
    "data.eval_every=0",
    "checkpoint.every=0",
    "checkpoint.save_final=false",
)
"""Every experiment's overrides in --quick (CI): one step of a tiny batch."""
ALWAYS = ("logging.progress=false", "checkpoint.every=0", "checkpoint.save_final=false")
"""No progress bars in records' logs; the study keeps no weights."""
STEP_KEYS = (
    "step",
    "reward/mean",
    "reward/accuracy",
    "select/fraction",
    "select/positive_adv_fraction",
    "select/clip_fraction",
    "update/clip_fraction",
    "response/length_mean",
    "response/truncated_fraction",
    "policy/entropy",
    "time/rollout_s",
    "time/update_s",
    "time/step_s",
)
"""What a record keeps of each step's metrics row."""


@dataclass(frozen=True)
class Experiment:
    """One comparison: ``methods`` (label -> config suffix) on the configs in ``configs``."""

    name: str
    title: str
    configs: str
    methods: dict[str, str]
    seeds: int
    overrides: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...] = ()
    clip: bool = False  # report the clip shares per method
    lengths: bool = False  # report the answers' length and share cut at the budget per method
    notes: list[str] = field(default_factory=list)


RULES = {
    "all tokens": "none",
    "GMTS top 20%": "gmts",
    "STAPO": "stapo",
    "Clip-Cov": "clip-cov",
    "KL-Cov": "kl-cov",
    "RSI-S": "rsi",
}
"""The rules of item 4 beside the two runs they are compared with (same settings as budget).

ICT (arXiv 2606.19771) is not among them: the copy of its paper this project can read holds
the abstract only, which does not fix its divergence or its threshold (docs/semantics.md)."""
_FOUR_PAIRS = (
    ("GMTS top 20%", "all tokens"),
    ("GMTS top 20%", "ETS top 20%"),
    ("GMTS top 20%", "random 20%"),
    ("ETS top 20%", "all tokens"),
    ("random 20%", "all tokens"),
)
EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "budget",
            "GMTS vs all tokens at a real budget (addition-2digit, 25 steps x 3 x 8)",
            "smollm2-135m-instruct",
            FOUR,
            5,
            BUDGET,
            _FOUR_PAIRS,
        ),
        Experiment(
            "clip",
            "The clip acting: 4 mini-batches per batch (addition-2digit, 18 steps x 4 x 8, lr 7.5e-6)",
            "smollm2-135m-instruct",
            FOUR,
            3,
            CLIP,
            _FOUR_PAIRS,
            clip=True,
        ),
        Experiment(
            "rules",
            "The family of rules (addition-2digit, the budget experiment's settings)",
            "smollm2-135m-instruct",
            RULES,
            3,
            BUDGET,
            tuple((rule, "all tokens") for rule in RULES if rule != "all tokens")
            + tuple((rule, "GMTS top 20%") for rule in RULES if rule not in FOUR),
        ),
        Experiment(
            "task2",
            "The second task (a right answer takes 40 tokens or more)",
            "smollm2-135m-instruct-word-problems",
            FOUR,
            3,
            BUDGET,
            _FOUR_PAIRS,
            lengths=True,
        ),
    )
}


# ------------------------------------------------------------------------------- one run


def resolved_key(config: Path, args: list[str]) -> tuple[str, dict[str, Any]]:
    """A run's key (16 hex digits of a SHA-256) and its resolved config: the config file with
    its base and ``args``, every default filled in, less what does not change the run (its
    folder and its progress display)."""
    from gmts.configuration import to_dict
    from gmts.train.config import load_config

    resolved = to_dict(load_config(str(config), list(args)))
    resolved["logging"].pop("output_dir", None)
    resolved["logging"].pop("progress", None)
    text = json.dumps(resolved, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16], resolved


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"section.field": value}``."""
    out: dict[str, Any] = {}
    for name, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def matching_record(
    folder: Path, name: str, resolved: dict[str, Any], args: list[str]
) -> Path | None:
    """The record of run ``name`` (``<suffix>-seed<S>-<key>``) in ``folder``: its own file, or
    else a record of the same method and seed written before a config field was added, whose
    config equals this one on every field it has while the fields it lacks are at their
    defaults (none of them set by ``args``). A field added with a default keeps a run's
    meaning; any other difference is another run."""
    exact = folder / f"{name}.json"
    if exact.is_file():
        return exact
    current = _flat(resolved)
    set_by_args = {a.split("=", 1)[0] for a in args}
    stem = name.rsplit("-", 1)[0]  # <suffix>-seed<S>
    for path in sorted(folder.glob(f"{stem}-*.json")):
        stored = _flat(json.loads(path.read_text())["resolved_config"])
        added = set(current) - set(stored)
        same = set(stored) <= set(current) and all(current[k] == stored[k] for k in stored)
        if same and not added & set_by_args:
            return path
    return None


def run_one(
    experiment: Experiment, method: str, seed: int, out: Path, extra: list[str], *, first: bool
) -> dict[str, Any]:
    """Train one run unless a record with its config exists; return its record. ``first``: the
    seed's first method, which evaluates the pretrained model for the others."""
    suffix = experiment.methods[method]
    config = CONFIGS / experiment.configs / f"dapo-{suffix}.yaml"
    args = [f"seed={seed}", *ALWAYS, *experiment.overrides, *extra]
    if not first:
        args.append(SHARED_START)
    key, resolved = resolved_key(config, args)
    name = f"{suffix}-seed{seed}-{key}"
    record_path = out / "runs" / experiment.configs / f"{name}.json"
    found = matching_record(record_path.parent, name, resolved, args)
    if found is not None:
        return json.loads(found.read_text())
    run_dir = out / "train" / experiment.configs / name
    command = [sys.executable, "-m", "gmts", "train", "--config", str(config), "--overwrite"]
    command += [*args, f"logging.output_dir={run_dir}"]
    before, machine, started = load(), machine_record(), utc_now()
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, text=True, capture_output=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise SystemExit(f"run {name} failed (exit {done.returncode}):\n{tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    record = {
        "experiment": experiment.name,
        "method": method,
        "suffix": suffix,
        "seed": seed,
        "key": key,
        "config_file": str(config.relative_to(REPO)),
        "args": args,
        "resolved_config": resolved,
        "command": " ".join(["python", *command[1:]]),
        "commit": provenance_commit(REPO),
        "started": started,
        "finished": utc_now(),
        "wall_s": round(wall, 1),
        "load_before": before,
        "load_after": load(),
        "machine": machine,
        "evals": evals,
        "steps": [{k: row[k] for k in STEP_KEYS if k in row} for row in rows],
    }
    record_path.parent.mkdir(parents=True, exist_ok=True)
    staging = record_path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(staging, record_path)
    return record


SHARED_START = "data.eval_before=false"
"""The argument of a run that takes its seed's pretrained figure from the seed's first run."""


# ------------------------------------------------------------------------------- the summary


def _accuracy(row: dict[str, Any]) -> float:
    """A held-out evaluation row's average@k in percent."""
    key = next(k for k in row if k.startswith("average@"))
    return 100.0 * float(row[key])


def curve_of(record: dict[str, Any], starts: dict[int, float]) -> list[tuple[int, float]]:
    """(step, held-out %) of a run, its seed's pretrained figure at step 0."""
    points = [(int(row["step"]), _accuracy(row)) for row in record["evals"]]
    if SHARED_START in record["args"]:
        points = [(0, starts[record["seed"]]), *points]
    return points


def _mean_of_steps(record: dict[str, Any], key: str, *, last_fifth: bool = False) -> float | None:
    """The mean of a step metric over the run's steps, or over its last fifth of them (at least
    one step); steps without the metric, or with nan (a step that selected nothing), left out."""
    values = [s[key] for s in record["steps"] if isinstance(s.get(key), (int, float))]
    values = [v for v in values if v == v]
    if last_fifth:
        values = values[-max(1, len(values) // 5) :]
    return sum(values) / len(values) if values else None


def per_run_figures(record: dict[str, Any], starts: dict[int, float]) -> dict[str, float]:
    """One run's figures: held-out before and at the end, the gain, the area under the curve
    (the trapezoid mean over the run's steps), and the step means of the selection's shares."""
    curve = curve_of(record, starts)
    steps, values = [s for s, _ in curve], [v for _, v in curve]
    area = sum((b - a) * (u + v) / 2 for (a, u), (b, v) in zip(curve, curve[1:]))
    figures = {
        "start": values[0],
        "final": values[-1],
        "gain": values[-1] - values[0],
        "auc": area / (steps[-1] - steps[0]) if steps[-1] > steps[0] else values[0],
    }
    for name, key in (
        ("selected", "select/fraction"),
        ("positive_selected", "select/positive_adv_fraction"),
        ("clip_selected", "select/clip_fraction"),
        ("clip_all", "update/clip_fraction"),
        ("s_per_step", "time/step_s"),
    ):
        value = _mean_of_steps(record, key)
        if value is not None:
            figures[name] = 100.0 * value if name != "s_per_step" else value
    for name, key, scale in (
        ("entropy_end", "policy/entropy", 1.0),  # the policy's mean token entropy (nats)
        ("cut_end", "response/truncated_fraction", 100.0),  # answers cut at the token budget
        ("length_end", "response/length_mean", 1.0),  # tokens an answer
    ):
        value = _mean_of_steps(record, key, last_fifth=True)
        if value is not None:
            figures[name] = scale * value
    return figures


def summarize(experiment: Experiment, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method: mean +- std over seeds of each run figure, and its curve (mean, min, max per
    evaluated step); per pair: the paired differences A - B over common seeds (final, auc)."""
    starts = {r["seed"]: _accuracy(r["evals"][0]) for r in records if SHARED_START not in r["args"]}
    figures: dict[str, dict[int, dict[str, float]]] = {}
    curves: dict[str, dict[int, list[float]]] = {}
    for record in records:
        if record["seed"] not in starts:
            continue  # its seed's pretrained figure is missing (a partial seed)
        figures.setdefault(record["method"], {})[record["seed"]] = per_run_figures(record, starts)
        for step, value in curve_of(record, starts):
            curves.setdefault(record["method"], {}).setdefault(step, []).append(value)
    methods: dict[str, Any] = {}
    for method in experiment.methods:
        if method not in figures:
            continue
        seeds = figures[method]
        entry: dict[str, Any] = {"seeds": sorted(seeds)}
        for key in seeds[min(seeds)]:
            values = [seeds[s][key] for s in sorted(seeds) if key in seeds[s]]
            mean, std = mean_std(values)
            entry[key] = {"mean": mean, "std": std}
        entry["curve"] = [
            {"step": s, "mean": sum(v) / len(v), "min": min(v), "max": max(v), "n": len(v)}
            for s, v in sorted(curves[method].items())
        ]
        methods[method] = entry
    pairs: list[dict[str, Any]] = []
    for a, b in experiment.pairs:
        common = sorted(set(figures.get(a, {})) & set(figures.get(b, {})))
        for key in ("final", "auc"):
            if not common:
                continue
            diff = paired_difference(
                [figures[a][s][key] for s in common], [figures[b][s][key] for s in common]
            )
            pairs.append({"a": a, "b": b, "metric": key, "seeds": common, **diff.__dict__})
    return {"title": experiment.title, "methods": methods, "pairs": pairs}


_DIGITS = {"entropy_end": 2}
"""Decimals of a figure shown with other than one (entropy in nats is below 1)."""


def _columns(experiment: Experiment) -> list[tuple[str, str, str]]:
    """The per-method figures shown: (the page's heading, the printed heading, the key)."""
    columns = [
        ("before", "before", "start"),
        ("final", "final", "final"),
        ("gain", "gain", "gain"),
        ("AUC", "AUC", "auc"),
        ("tokens trained, %", "trained %", "selected"),
        ("selected tokens with A > 0, %", "A>0 sel %", "positive_selected"),
        ("entropy, last fifth", "entropy end", "entropy_end"),
    ]
    if experiment.clip:
        columns += [
            ("selected, clipped %", "clip sel %", "clip_selected"),
            ("all, clipped %", "clip all %", "clip_all"),
        ]
    if experiment.lengths:
        columns += [
            ("answer tokens, last fifth", "len end", "length_end"),
            ("cut at the budget, last fifth, %", "cut end %", "cut_end"),
        ]
    return columns


def format_summary(experiment: Experiment, summary: dict[str, Any]) -> str:
    """The printed table of one experiment."""

    def cell(stat: dict[str, Any] | None, digits: int) -> str:
        return _cell(stat, digits).replace(" ± ", "±") if stat is not None else "-"

    columns = [(short, key) for _, short, key in _columns(experiment)]
    columns += [("s/step", "s_per_step")]
    lines = [summary["title"]]
    lines.append(f"{'method':<15}" + "".join(f"{h:>13}" for h, _ in columns) + "  seeds")
    for method, m in summary["methods"].items():
        cells = "".join(f"{cell(m.get(k), _DIGITS.get(k, 1)):>13}" for _, k in columns)
        lines.append(f"{method:<15}{cells}  {len(m['seeds'])}")
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


DOC = REPO / "docs" / "results.md"
"""The page whose ``<!-- study:<experiment>:begin/end -->`` blocks ``--report`` writes."""


def _cell(stat: dict[str, Any] | None, digits: int = 1) -> str:
    if stat is None:
        return ""
    std = stat["std"]
    return f"{stat['mean']:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def _one_minute_load(uptime: Any) -> float | None:
    """The 1-minute load of an ``uptime`` line (or of a (1, 5, 15) triple)."""
    if isinstance(uptime, (list, tuple)) and uptime:
        return float(uptime[0])
    if isinstance(uptime, str) and "load average:" in uptime:
        return float(uptime.split("load average:")[1].split(",")[0])
    return None


def _spread(records: list[dict[str, Any]]) -> str:
    """Where and when the records ran: dates, commits, machines, load before the runs."""
    dates = sorted(r["started"][:10] for r in records)
    commits = sorted({r["commit"][:7] for r in records})
    cpus = sorted({r["machine"].get("cpu", "?") for r in records})
    loads = [_one_minute_load(r.get("load_before")) for r in records]
    loads = [x for x in loads if x is not None]
    span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    load = ""
    if loads:
        low, high = min(loads), max(loads)
        load = f"; 1-minute load before a run {low:.1f}" + (f"-{high:.1f}" if high > low else "")
    runs = f"{len(records)} run" + ("s" if len(records) != 1 else "")
    return f"{runs}, {span}, code at {', '.join(commits)}, on {', '.join(cpus)}{load}"


def render_markdown(
    experiment: Experiment, summary: dict[str, Any], records: list[dict[str, Any]]
) -> str:
    """The block of docs/results.md for one experiment: the methods' figures (mean ± std over
    seeds, in points of held-out average@k), the paired differences with 95% t intervals, and
    where the records ran. Generated by ``--report`` from the committed records."""
    columns = [(heading, key) for heading, _, key in _columns(experiment)]
    lines = [f"{summary['title']}: {_spread(records)}.", ""]
    lines.append("| method | seeds | " + " | ".join(h for h, _ in columns) + " |")
    lines.append("|---|---|" + "---|" * len(columns))
    for method, m in summary["methods"].items():
        cells = " | ".join(_cell(m.get(k), _DIGITS.get(k, 1)) for _, k in columns)
        lines.append(f"| {method} | {len(m['seeds'])} | {cells} |")
    lines += [
        "",
        "| paired by seed, A - B (points) | metric | mean ± std | 95% interval | A ahead |",
    ]
    lines.append("|---|---|---|---|---|")
    for p in summary["pairs"]:
        spread = f" ± {p['std']:.1f}" if p["std"] is not None else ""
        interval = f"[{p['low']:+.1f}, {p['high']:+.1f}]" if p["low"] is not None else "one seed"
        lines.append(
            f"| {p['a']} - {p['b']} | {p['metric']} | {p['mean']:+.1f}{spread} | {interval} | "
            f"{p['ahead']} of {len(p['seeds'])} |"
        )
    return "\n".join(lines)


def update_doc(doc: Path, name: str, block: str) -> bool:
    """Replace the text between ``<!-- study:<name>:begin -->`` and ``...:end -->`` in ``doc``;
    False when the page has no such block."""
    begin, end = f"<!-- study:{name}:begin -->", f"<!-- study:{name}:end -->"
    text = doc.read_text()
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{block}\n{end}{tail}")
    return True


def plot_curves(experiment: Experiment, summary: dict[str, Any], out: Path) -> Path:
    """``out``: held-out average@k per evaluated step, per method: the mean over seeds and a
    band from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (method, m) in enumerate(summary["methods"].items()):
        color = colors[i % len(colors)]
        steps = [p["step"] for p in m["curve"]]
        ax.plot(steps, [p["mean"] for p in m["curve"]], color=color, marker="o", ms=3,
                label=f"{method} ({len(m['seeds'])} seed{'s' * (len(m['seeds']) > 1)})")  # fmt: skip
        if len(m["seeds"]) > 1:
            low, high = [p["min"] for p in m["curve"]], [p["max"] for p in m["curve"]]
            ax.fill_between(steps, low, high, color=color, alpha=0.12, lw=0)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out average@k (%)")
    ax.set_title(summary["title"], fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def read_records(experiment: Experiment, out: Path) -> list[dict[str, Any]]:
    """The records under ``out`` of the runs ``experiment`` would make now (its methods and
    seeds with today's resolved configs): a record of another config is not this experiment's."""
    records = []
    for seed in range(experiment.seeds):
        for i, method in enumerate(experiment.methods):
            suffix = experiment.methods[method]
            config = CONFIGS / experiment.configs / f"dapo-{suffix}.yaml"
            if not config.is_file():
                continue
            args = [f"seed={seed}", *ALWAYS, *experiment.overrides]
            if i:
                args.append(SHARED_START)
            key, resolved = resolved_key(config, args)
            folder = out / "runs" / experiment.configs
            path = matching_record(folder, f"{suffix}-seed{seed}-{key}", resolved, args)
            if path is not None:
                records.append(json.loads(path.read_text()))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiments", nargs="+", help=f"of {list(EXPERIMENTS)}, or all")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "study"))
    parser.add_argument("--seeds", type=int, default=None, help="fewer seeds than the design's")
    parser.add_argument("--methods", default=None, help="comma list of labels (a subset)")
    parser.add_argument("--quick", action="store_true", help="1 step of a tiny batch (CI)")
    parser.add_argument("--report", action="store_true", help="summarise only, train nothing")
    args = parser.parse_args(argv)
    names = list(EXPERIMENTS) if args.experiments == ["all"] else args.experiments
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiments {unknown}; valid: {list(EXPERIMENTS)} or all")
    out = Path(args.out)
    report: dict[str, Any] = {}
    for name in names:
        experiment = EXPERIMENTS[name]
        if args.quick:
            experiment = replace(experiment, seeds=1, overrides=QUICK)
        methods = list(experiment.methods)
        if args.methods:
            wanted = [m.strip() for m in args.methods.split(",")]
            methods = [m for m in methods if m in wanted]
        seeds = min(args.seeds or experiment.seeds, experiment.seeds)
        missing = [
            m for m in methods
            if not (CONFIGS / experiment.configs / f"dapo-{experiment.methods[m]}.yaml").is_file()
        ]  # fmt: skip
        if missing and not args.report:
            parser.error(f"{name}: no config for {missing} under configs/{experiment.configs}")
        if not args.report:
            for seed in range(seeds):
                for i, method in enumerate(methods):
                    first = list(experiment.methods).index(method) == 0
                    if i == 0 and not first:
                        parser.error(f"{name}: the first method must be {methods[0]!r}")
                    record = run_one(experiment, method, seed, out, [], first=first)
                    print(f"{name}: {method} seed {seed}: {record['wall_s']:.0f} s", flush=True)
        records = read_records(experiment, out)
        if not records:
            print(f"{name}: no records yet under {out}")
            continue
        summary = summarize(experiment, records)
        report[name] = summary
        figure = plot_curves(experiment, summary, out / f"{name}.png")
        print(format_summary(experiment, summary))
        print(f"figure: {figure}\n")
        committed = out.resolve() == (REPO / "benchmarks" / "results" / "study").resolve()
        block = render_markdown(experiment, summary, records)
        if args.report and committed and update_doc(DOC, name, block):
            print(f"refreshed the study:{name} block of {DOC.relative_to(REPO)}")
    if report:
        summary_path = out / "study.json"
        old = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        summary_path.write_text(json.dumps({**old, **report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
