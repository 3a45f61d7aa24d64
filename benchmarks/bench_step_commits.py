"""A training step of today's code against an older commit's, on the real model (issue 34's
"done when": the median step of ``configs/smollm2-135m-instruct/dapo-gmts.yaml``, fp32, engine
``hf``, 2 threads, <= 0.4x the time of commit 32f82aa on the same machine; ``vllm`` <= 0.45x).

Each side is ``gmts train`` in its own process, run from its own ``src`` (``PYTHONPATH``), with
its own checkout's copy of the config and the same overrides: held-out evaluation and the final
save off, ``data.split=train`` (the old code's default split was the test split), ``threads``
torch threads. The sides alternate, ``old new`` then ``new old``, round after round, so a
change in the machine's load hits both alike. Per step the record keeps the step's
``time/step_s``, ``time/rollout_s``, ``time/update_s``, response tokens, reward and the new
side's ``update/positions_computed`` / ``update/positions_real``; per process its peak RSS
(``wait4``'s ``ru_maxrss``) and wall time. The first step of each process is a warm-up and is
left out of the ratios; ratios are paired by (round, step): new / old, median and min-max.

The step-1 rollouts of the two sides come from the same weights and the same seed: their
rewards and response lengths are compared (``step1_equal``); later steps may differ (the old
and new updates round differently).

    git worktree add /tmp/old 32f82aa
    python benchmarks/bench_step_commits.py --old-src /tmp/old/src --old-configs /tmp/old/configs
    .venv-vllm/bin/python benchmarks/bench_step_commits.py --engine vllm --old-src ...  # vllm

About 2 rounds x (3 old steps of ~70 s + 3 new ones) on an idle 2-core CPU: 10-15 minutes.
``--quick`` runs a random tiny llama (bench_rollout_real's) on ``a+b=`` questions for 2 steps,
1 round (both sides today's code unless ``--old-src`` is given), writes no record: a plumbing
check for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    REPO_ROOT,
    child_env,
    git_commit,
    machine_description,
    standalone_record,
    write_result,
)

CONFIG = "configs/smollm2-135m-instruct/dapo-gmts.yaml"
STEP_KEYS = (
    "time/step_s",
    "time/rollout_s",
    "time/update_s",
    "response/tokens",
    "reward/mean",
    "update/positions_computed",
    "update/positions_real",
)
"""The metrics each step's record keeps (a key the side's code does not log is left out)."""
QUICK_SETTINGS = (
    "data.template=null",
    "data.reward=math",
    "rollout.questions_per_batch=2",
    "rollout.group_size=4",
    "rollout.max_response_length=8",
    "optim.micro_batch_size=8",
)
"""The quick mode's shape on the random tiny llama (its questions in the plain ``a+b=`` form)."""


def side_command(
    args: argparse.Namespace, side: str, run_dir: Path
) -> tuple[list[str], dict[str, str]]:
    """The ``gmts train`` command of ``side`` ('old' or 'new') and its environment."""
    src = Path(args.old_src) if side == "old" else REPO_ROOT / "src"
    configs = Path(args.old_configs) if side == "old" else REPO_ROOT / "configs"
    config = configs / Path(CONFIG).relative_to("configs")
    overrides = [
        f"optim.steps={args.steps}",
        f"threads={args.threads}",
        f"rollout.engine={args.engine}",
        "checkpoint.save_final=false",
        f"logging.output_dir={run_dir}",
    ]
    overrides += ["data.eval_dataset=null"]
    if args.quick:  # the random tiny llama and its questions (written by main)
        overrides += [f"model.path={args.model}", f"data.dataset={args.dataset}", *QUICK_SETTINGS]
    else:
        overrides += ["data.split=train"]
    overrides += args.set
    env = child_env(args.threads)
    env["PYTHONPATH"] = str(src)
    command = [sys.executable, "-m", "gmts", "train", "--config", str(config), *overrides]
    return command, env


def run_side(args: argparse.Namespace, side: str, work: Path, label: str) -> dict[str, Any]:
    """One process of ``side``: its steps' metrics, peak RSS and wall time."""
    run_dir = work / label
    command, env = side_command(args, side, run_dir)
    started = time.perf_counter()
    with open(work / f"{label}.log", "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = (work / f"{label}.log").read_text()[-3000:]
        raise SystemExit(f"{side} side ({label}) failed with exit code {code}:\n{tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [{k: row[k] for k in ("step", *STEP_KEYS) if k in row} for row in rows]
    return {
        "side": side,
        "label": label,
        "wall_s": wall,
        "peak_rss_kib": usage.ru_maxrss,
        "steps": steps,
    }


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarize(processes: list[dict[str, Any]]) -> dict[str, Any]:
    """Paired new/old ratios per (round, step), the first step of each process left out."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for p in processes:
        by_round.setdefault(p["round"], {})[p["side"]] = p
    ratios: dict[str, list[float]] = {"time/step_s": [], "time/rollout_s": [], "time/update_s": []}
    tokens_per_s: dict[str, list[float]] = {"old": [], "new": []}
    step1_equal = []
    for sides in by_round.values():
        old, new = sides["old"]["steps"], sides["new"]["steps"]
        first_old, first_new = old[0], new[0]
        step1_equal.append(
            all(first_old.get(k) == first_new.get(k) for k in ("reward/mean", "response/tokens"))
        )
        for o, n in zip(old[1:], new[1:], strict=True):
            for key in ratios:
                if o.get(key) and n.get(key) is not None:
                    ratios[key].append(n[key] / o[key])
        for name, steps in (("old", old), ("new", new)):
            tokens_per_s[name] += [
                s["response/tokens"] / s["time/step_s"] for s in steps[1:] if "response/tokens" in s
            ]
    out = {f"new_over_old {k}": _spread(v) for k, v in ratios.items() if v}
    out.update({f"tokens_per_s {k}": _spread(v) for k, v in tokens_per_s.items() if v})
    out["step1_equal"] = step1_equal
    for side in ("old", "new"):
        out[f"peak_rss_gib {side}"] = (
            max(p["peak_rss_kib"] for p in processes if p["side"] == side) / 2**20
        )
    return out


def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Every process of every round, the sides' order alternating from round to round."""
    processes = []
    for round_index in range(args.rounds):
        order = ("old", "new") if round_index % 2 == 0 else ("new", "old")
        for side in order:
            label = f"round{round_index}-{side}"
            print(f"[bench_step_commits] {label} ...", flush=True)
            record = run_side(args, side, work, label)
            record["round"] = round_index
            step_times = [round(s["time/step_s"], 1) for s in record["steps"]]
            print(f"[bench_step_commits] {label}: steps {step_times} s", flush=True)
            processes.append(record)
    return processes


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-src", help="the older commit's src folder (default: today's)")
    parser.add_argument("--old-configs", help="the older commit's configs folder")
    parser.add_argument("--engine", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--steps", type=int, default=3, help="steps per process (>= 2)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="a gmts override, both sides")
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 steps, 1 round")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/real_model")
    return parser


def main(argv: list[str] | None = None) -> int:
    record = run(argv)
    print(json.dumps(record["summary"], indent=2))
    if not record["quick"]:
        out = write_result(Path(record["out"]), record["name"], record)
        print(f"wrote {out}")
    return 0


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure as ``argv`` says and return the record (not written)."""
    args = argument_parser().parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 2, 1
    args.old_src = args.old_src or str(REPO_ROOT / "src")
    args.old_configs = args.old_configs or str(REPO_ROOT / "configs")
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2: the first step of each process is a warm-up")
    old_config = Path(args.old_configs) / Path(CONFIG).relative_to("configs")
    for path in (Path(args.old_src) / "gmts", old_config):
        if not path.exists():
            raise SystemExit(f"{path} does not exist (--old-src / --old-configs)")
    started, machine = time.perf_counter(), machine_description()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-step-commits-") as tmp:
        if args.quick:
            from bench_rollout_real import save_quick_model
            from bench_throughput_real import write_quick_dataset

            args.model = save_quick_model(Path(tmp) / "model")
            args.dataset = write_quick_dataset(Path(tmp) / "questions.jsonl")
        processes = measure(args, Path(tmp))
    record = standalone_record(
        f"step_commits_{args.engine}",
        quick=args.quick,
        commit=git_commit(),
        machine_before=machine,
        load_before=load_before,
        started=started,
        argv=sys.argv[1:] if argv is None else argv,
        executable=sys.executable,
    )
    record.update(old_src=args.old_src, out=str(args.out), processes=processes)
    record["summary"] = summarize(processes)
    return record


if __name__ == "__main__":
    raise SystemExit(main())
