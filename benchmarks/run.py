"""The one benchmark command of issue 7.

    python benchmarks/run.py [--only selection,logprobs,overhead,throughput,learning] [--quick]
    .venv-vllm/bin/python benchmarks/run.py --only rollout [--quick]      # hf vs vLLM sampling

Runs each named benchmark (all by default; ``rollout`` only where vllm is installed), writes ``benchmarks/results/<name>.json`` (the
machine, the command, the date, the commit, every repeat) and refreshes the generated tables
in ``docs/results.md``. ``--quick`` uses tiny shapes and writes to ``$TMPDIR/gmts-bench-quick``
unless ``--out`` says otherwise; its figures only show that the harness works.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench_common import (  # noqa: E402
    DEFAULT_RESULTS_DIR,
    BenchOptions,
    git_commit,
    machine_description,
    utc_now,
    write_result,
)

# name -> module; each module defines run(options: BenchOptions) -> dict
BENCHMARKS = {
    "selection": "bench_selection",
    "logprobs": "bench_logprobs",
    "overhead": "bench_overhead",
    "throughput": "bench_throughput",
    "learning": "bench_learning",
    "rollout": "bench_rollout",
}
NEEDS_VLLM = frozenset({"rollout"})
"""Benchmarks that need the vllm package (run them with .venv-vllm/bin/python)."""


def default_benchmarks() -> list[str]:
    """What runs without --only: every benchmark, those needing vllm only where it is installed."""
    import importlib.util

    has_vllm = importlib.util.find_spec("vllm") is not None
    return [name for name in BENCHMARKS if has_vllm or name not in NEEDS_VLLM]


def parse_only(text: str | None) -> list[str]:
    """Comma-separated benchmark names (None = :func:`default_benchmarks`) -> validated list in
    the canonical order."""
    if text is None:
        return default_benchmarks()
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown or not names:
        raise ValueError(f"--only: unknown benchmark(s) {unknown}; valid: {', '.join(BENCHMARKS)}")
    return [name for name in BENCHMARKS if name in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated subset of: {','.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: checks the harness")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="'cpu' (default) or 'cuda[:N]' for selection, logprobs and overhead (item 6)",
    )
    parser.add_argument("--out", type=Path, help="results folder (default benchmarks/results)")
    parser.add_argument(
        "--no-report", action="store_true", help="do not refresh docs/results.md tables"
    )
    parser.add_argument(
        "--logprobs-repeats", type=int, default=3, help="timed fwd+bwd runs per variant and cell"
    )
    parser.add_argument(
        "--logprobs-grid",
        default=None,
        help="log-prob benchmark cells NxTHREADS, comma-separated "
        "(default 1024x1,1024x2,4096x1,4096x2; on CUDA only N counts)",
    )
    parser.add_argument(
        "--logprobs-shape",
        default=None,
        help="log-prob benchmark LM head VOCABxHIDDEN (default 151936x1536, Qwen2.5-1.5B's; "
        "SmolLM2-135M's: 49152x576)",
    )
    parser.add_argument(
        "--learning-plan",
        default="subset",
        help="learning sweep: 'full' (Tables 1, 6, 7: ~2 h on 2 idle cores), 'subset' "
        "(default), or a comma list of runs ALGO:SCORE:RATIO[:bottom]:SEED, e.g. "
        "dapo:gmts:0.2:0,dapo:none:1.0:0",
    )
    parser.add_argument(
        "--learning-steps", type=int, default=None, help="training steps per learning run"
    )
    parser.add_argument(
        "--learning-eval-every",
        type=int,
        default=None,
        help="held-out evaluation every N steps (0: before and after only; default 25)",
    )
    parser.add_argument(
        "--learning-eval-questions",
        type=int,
        default=None,
        help="held-out questions per evaluation (default 200)",
    )
    parser.add_argument(
        "--learning-jobs", type=int, default=1, help="learning runs in parallel (processes)"
    )
    parser.add_argument(
        "--overhead-config",
        type=Path,
        default=None,
        help="overhead: a trainer config file for every variant instead of the demo recipe "
        "(e.g. configs/smollm2-135m-instruct/base.yaml)",
    )
    parser.add_argument(
        "--overhead-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overhead: settings added to --overhead-config's (section.field=value)",
    )
    parser.add_argument(
        "--overhead-repeats", type=int, default=20, help="timed rounds of the overhead benchmark"
    )
    parser.add_argument(
        "--rollout-repeats", type=int, default=10, help="timed rollouts per engine (rollout)"
    )
    return parser


def options_from(args: argparse.Namespace, names: list[str]) -> BenchOptions:
    """The benchmarks' options from the command line, every check done before any benchmark
    starts (ValueError with the message to print)."""
    quick_dir = Path(tempfile.gettempdir()) / "gmts-bench-quick"
    default_dir = DEFAULT_RESULTS_DIR if args.device == "cpu" else DEFAULT_RESULTS_DIR / "gpu"
    out_dir = args.out or (quick_dir if args.quick else default_dir)
    on_cpu_only = {"throughput", "learning", "rollout"} & set(names)
    if args.device != "cpu" and on_cpu_only:
        raise ValueError(f"--device {args.device}: {sorted(on_cpu_only)} run on the CPU only")
    # BenchOptions checks threads and device before any benchmark starts
    options = BenchOptions(
        quick=args.quick,
        threads=args.threads,
        device=args.device,
        out_dir=out_dir,
        extra={
            "logprobs_repeats": args.logprobs_repeats,
            "logprobs_grid": args.logprobs_grid,
            "logprobs_shape": args.logprobs_shape,
            "learning_plan": args.learning_plan,
            "learning_steps": args.learning_steps,
            "learning_jobs": args.learning_jobs,
            "learning_eval_every": args.learning_eval_every,
            "learning_eval_questions": args.learning_eval_questions,
            "rollout_repeats": args.rollout_repeats,
            "overhead_config": args.overhead_config,
            "overhead_set": args.overhead_set,
            "overhead_repeats": args.overhead_repeats,
        },
    )
    check_overhead_config(args)
    if "logprobs" in names:
        check_logprobs_cells(args)
    return options


def check_overhead_config(args: argparse.Namespace) -> None:
    """ValueError unless ``--overhead-config`` (and ``--overhead-set``) make a trainer config:
    a missing file or a bad setting fails before any benchmark runs."""
    if args.overhead_set and args.overhead_config is None:
        raise ValueError("--overhead-set needs --overhead-config")
    if args.overhead_config is not None:
        from gmts.train.config import load_config

        try:
            load_config(args.overhead_config, list(args.overhead_set))
        except (OSError, ValueError) as error:
            raise ValueError(f"--overhead-config {args.overhead_config}: {error}") from error


def check_logprobs_cells(args: argparse.Namespace) -> None:
    """ValueError on a bad ``--logprobs-grid`` or ``--logprobs-shape``."""
    if (args.logprobs_grid or args.logprobs_shape) is None:
        return
    from bench_logprobs import parse_grid, parse_shape

    if args.logprobs_grid is not None:
        parse_grid(args.logprobs_grid)
    if args.logprobs_shape is not None:
        parse_shape(args.logprobs_shape)


def run_benchmark(
    name: str, options: BenchOptions, *, command: str, commit: str, quick: bool, threads: int
) -> tuple[dict[str, Any], Path]:
    """Run benchmark ``name`` and write its record (with where, when and how it ran; a
    benchmark that raises is recorded with status "error"); returns (record, its path)."""
    machine_before = machine_description()
    started = utc_now()
    start = time.perf_counter()
    try:
        module = importlib.import_module(BENCHMARKS[name])
        record = module.run(options)
        status = "ok"
    except Exception as error:  # a failing benchmark must not hide the others
        traceback.print_exc()
        record = {"error": f"{type(error).__name__}: {error}", "rows": [], "goals": []}
        status = "error"
    record.update(
        {
            "benchmark": name,
            "status": status,
            "command": command.strip(),
            "quick": quick,
            "threads": threads,
            "started": started,
            "date": utc_now(),
            "commit": commit,
            "wall_s": round(time.perf_counter() - start, 2),
            "machine": machine_before,
            "uptime_after": machine_description()["uptime"],
        }
    )
    return record, write_result(options.out_dir, name, record)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        names = parse_only(args.only)
        options = options_from(args, names)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    command = "python benchmarks/run.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    commit = git_commit()  # the code that runs (benchmark edits after this are not in it)
    failures = 0
    for name in names:
        print(f"[bench] {name} ...", flush=True)
        record, path = run_benchmark(
            name, options, command=command, commit=commit, quick=args.quick, threads=args.threads
        )
        failures += record["status"] != "ok"
        print(
            f"[bench] {name}: {record['status']} in {record['wall_s']:.1f}s -> {path}", flush=True
        )
        for item in record.get("goals", []):
            print(
                f"    goal {item['name']}: {item['measured']} (target {item['target']}, "
                f"met={item['met']})"
            )
    if not args.no_report and not args.quick:
        from report import update_results_doc

        update_results_doc(options.out_dir)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
