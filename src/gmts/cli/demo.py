"""``gmts demo [section.field=value ...]``: all tokens vs ETS vs GMTS under one recipe, from one
warm start, over several RL seeds.

The recipe is ``gmts/demo/demo.yaml`` (the one copy; ``configs/demo.yaml`` links to it).
The three policies differ only in ``selection.score``: within a seed they start from the same
cached warm start (gmts.embedded.warmstart), see the same questions in the same order and get
the same budget (steps x questions x samples). Each method is trained once per seed (``--seeds
N``: the recipe's ``seed`` and the N - 1 after it), each seed with its own warm start, so the
methods are compared seed by seed (paired) and the table says whether a difference is larger
than the spread between seeds (gmts.demo.stats). One seed's ordering is not a measurement:
the warm start, and so every curve, moves with the seed and with the CPU's floating-point path
(docs/training.md); a warm start per seed puts that variation into the spread. Held-out
average@k is measured before training,
every ``data.eval_every`` steps and at the end, on the task's reserved questions: the table
prints that learning curve and its mean over training (area under the curve / steps), and the
curves are drawn to ``<output_dir>/curves.png``.

This module is the command: its arguments, and a call of :func:`gmts.demo.pool.run_demo`
whose table it prints (and records with ``--json``). The demo itself is the package
:mod:`gmts.demo`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from gmts.demo.json_record import write_demo_record
from gmts.demo.pool import run_demo
from gmts.demo.settings import METHODS, DemoSettings
from gmts.demo.tables import format_table
from gmts.provenance import git_commit, machine_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoSettings()
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="Changes to the recipe (configs/demo.yaml), as for gmts train, e.g. "
        "optim.lr=3e-4 rollout.questions_per_batch=16.",
    )
    parser.add_argument("--steps", type=int, default=None, help="RL steps (optim.steps).")
    parser.add_argument(
        "--seed", type=int, default=None, help="The first seed (seed): warm start and RL."
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=d.seeds,
        help="Seeds per method (default %(default)s): --seed and the ones after it, each with "
        "its own warm start; the table pairs the methods seed by seed and says whether a "
        "difference is larger than the seed spread.",
    )
    parser.add_argument("--task", default=None, help="Built-in task (data.task).")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch.set_num_threads (threads; the recipe says 1: the tiny model's matrices are "
        "small, so more threads mostly synchronise; see docs/training.md).",
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
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="Processes running warm starts and runs side by side (default: the usable CPUs "
        "divided by the recipe's threads). The table does not depend on it.",
    )
    parser.add_argument("--no-progress", action="store_true", help="No progress bars.")
    parser.add_argument(
        "--json",
        default=None,
        help="Also write the table, the paired comparisons, every run and the machine to this "
        "JSON file (benchmarks/report.py renders benchmarks/results/demo.json into the docs).",
    )


def settings_from(args: argparse.Namespace) -> DemoSettings:
    """The demo's settings from its command line (the shortcuts ``--steps``, ``--seed``,
    ``--task``, ``--threads`` become overrides after the given ones)."""
    shortcuts = {
        "optim.steps": args.steps,
        "seed": args.seed,
        "data.task": args.task,
        "threads": args.threads,
    }
    overrides = [*args.overrides, *(f"{k}={v}" for k, v in shortcuts.items() if v is not None)]
    return DemoSettings(
        overrides=tuple(overrides),
        output_dir=args.output_dir,
        cache_dir=args.cache_dir,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        seeds=args.seeds,
        jobs=args.jobs,
    )


def _command_line() -> str:
    """``gmts demo`` and the arguments it was given, as the record writes it."""
    argv = sys.argv[sys.argv.index("demo") + 1 :] if "demo" in sys.argv else sys.argv[1:]
    return ("gmts demo " + " ".join(shlex.quote(a) for a in argv)).strip()


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
        machine = machine_record()  # before the runs: the load they started under
        commit = git_commit(Path(__file__).parent)  # the code that runs (it may move on)
        result = run_demo(settings, progress=not args.no_progress)
    except ValueError as exc:
        print(f"gmts demo: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    if args.json:
        write_demo_record(
            args.json, result, command=_command_line(), machine=machine, commit=commit
        )
    return 0
