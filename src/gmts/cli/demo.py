"""``gmts demo [section.field=value ...]``: DAPO with all tokens, ETS and GMTS on the embedded
task, from one warm start, with the recipe of ``gmts/train/demo.yaml`` (= configs/demo.yaml)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gmts.train.demo import METHODS, DemoSettings

    d = DemoSettings()
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="Changes to the recipe (configs/demo.yaml), as for gmts train, e.g. "
        "optim.lr=3e-4 rollout.questions_per_batch=16.",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps (optim.steps).")
    parser.add_argument("--seed", type=int, default=None, help="Warm start and RL seed (seed).")
    parser.add_argument("--task", default=None, help="Built-in task (data.task).")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (threads; the recipe says 1: the tiny model's matrices are "
        "small, and on a busy 2-core machine 2 threads measured 4-7x slower per step).",
    )
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="Comma-separated subset of %(default)s, in table order.",
    )
    parser.add_argument(
        "--output-dir", default=d.output_dir, help="Where the runs and curves.png go."
    )
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache directory.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bars.")
    parser.add_argument("--json", default=None, help="Also write the results to this JSON file.")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from gmts.train.demo import DemoSettings, format_table, run_demo

    shortcuts = {
        "optim.steps": args.steps,
        "seed": args.seed,
        "data.task": args.task,
        "threads": args.threads,
    }
    overrides = [*args.overrides, *(f"{k}={v}" for k, v in shortcuts.items() if v is not None)]
    try:
        settings = DemoSettings(
            overrides=tuple(overrides),
            output_dir=args.output_dir,
            cache_dir=args.cache_dir,
            methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        )
        result = run_demo(settings, progress=not args.no_progress)
    except ValueError as exc:
        print(f"gmts demo: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dataclasses.asdict(result), fh, indent=2)
    return 0
