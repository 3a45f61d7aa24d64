"""``gmts demo``: DAPO with all tokens, ETS top 20% and GMTS top 20% on the embedded task."""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gmts.train.demo import DemoSettings

    d = DemoSettings()
    parser.add_argument("--steps", type=int, default=d.steps, help="RL steps per policy.")
    parser.add_argument("--questions", type=int, default=d.questions, help="Questions per step.")
    parser.add_argument(
        "--group-size", type=int, default=d.group_size, help="Samples per question."
    )
    parser.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate.")
    parser.add_argument(
        "--sampling-rounds",
        type=int,
        default=d.sampling_rounds,
        help="DAPO dynamic-sampling rounds per step (1: drop all-equal groups without "
        "resampling; they top the batch back up with zero advantage).",
    )
    parser.add_argument(
        "--eval-questions", type=int, default=d.eval_questions, help="Held-out questions."
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--task", default=d.task, help="Built-in task (gmts.data.tasks).")
    parser.add_argument("--output-dir", default=d.output_dir, help="Where the three runs go.")
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache directory.")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (0: torch's default; default 1: the tiny model's matrices "
        "are small, and on a busy 2-core machine 2 threads measured 4-7x slower per step).",
    )
    parser.add_argument("--no-progress", action="store_true", help="No progress bars.")
    parser.add_argument("--json", default=None, help="Also write the results to this JSON file.")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from gmts.train.demo import DemoSettings, format_table, run_demo

    if args.threads < 0:
        print(f"gmts demo: error: --threads must be >= 0, got {args.threads}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        settings = DemoSettings(
            task=args.task,
            steps=args.steps,
            questions=args.questions,
            group_size=args.group_size,
            lr=args.lr,
            sampling_rounds=args.sampling_rounds,
            eval_questions=args.eval_questions,
            seed=args.seed,
            output_dir=args.output_dir,
            cache_dir=args.cache_dir,
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
