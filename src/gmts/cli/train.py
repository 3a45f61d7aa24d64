"""``gmts train``: RLVR training from a YAML config, every field overridable.

    gmts train --config configs/qwen2.5-math-1.5b/dapo-gmts.yaml optim.lr=1e-6 selection.ratio=0.1
    torchrun --nproc_per_node 2 -m gmts train --config FILE.yaml
    gmts train --config FILE.yaml --resume          # continue from the last checkpoint
    gmts train --plugin my_objectives objective.name=mine   # an objective you registered

Overrides are positional ``section.field=value`` arguments (values parsed as YAML). Every key,
its type, default and meaning is listed by ``gmts train --help``.
"""

from __future__ import annotations

import argparse
import sys


def exit_status_text() -> str:
    """The exit statuses of ``gmts train`` (the top of its ``--help`` epilog)."""
    from gmts.train.preemption import MARKER_FILE, PREEMPTED_EXIT_CODE

    code = PREEMPTED_EXIT_CODE
    return f"""exit status:
  0   training finished
  2   bad config, model path, dataset or sandbox (reported before anything loads)
  {code}  stopped by SIGTERM or checkpoint.preempt_signal at a step boundary: the optimizer
      step in progress was finished and checkpointed and {MARKER_FILE} written into the run
      directory; run the same command with --resume to continue exactly (docs/training.md,
      "Preemption"). Under torchrun every rank exits with {code} and torchrun itself with 1:
      check for {MARKER_FILE}."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gmts.cli.config_reference import config_help_text

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = exit_status_text() + "\n\n" + config_help_text()
    parser.add_argument("--config", "-c", default=None, help="YAML config file (optional).")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.field=value",
        help="Override config fields, e.g. selection.ratio=0.1 optim.lr=1e-6.",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="Continue from the run's latest checkpoint (none yet: start afresh).",
    )
    parser.add_argument("--output-dir", default=None, help="Shortcut for logging.output_dir=DIR.")
    parser.add_argument(
        "--report-to",
        choices=["none", "tensorboard", "wandb"],
        default=None,
        help="Shortcut for logging.report_to.",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="Print the resolved config and exit."
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help=(
            "Import MODULE (importable from the working directory or PYTHONPATH) before the "
            "config is read, so what it registers (an objective through "
            "gmts.register_objective, a score, ...) can be named in the config; repeatable. "
            "Give the same --plugin to --resume."
        ),
    )


def import_plugins(modules: list[str]) -> None:
    """Import each module (its registrations take effect); ValueError names one that fails."""
    import importlib

    if "" not in sys.path:  # `python -m gmts` has the working directory; the console script not
        sys.path.insert(0, "")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # any import-time failure of the user's module
            raise ValueError(f"--plugin {name}: cannot import it: {exc!r}") from exc


def run(args: argparse.Namespace) -> int:
    from gmts.train.config import dump_yaml, load_config

    try:
        import_plugins(args.plugin)
    except ValueError as exc:
        print(f"gmts train: error: {exc}", file=sys.stderr)
        return 2
    overrides = list(args.overrides)
    if args.output_dir is not None:
        overrides.append(f"logging.output_dir={args.output_dir}")
    if args.report_to is not None:
        overrides.append(f"logging.report_to={args.report_to}")
    try:
        cfg = load_config(args.config, overrides)
    except ValueError as exc:
        print(f"gmts train: error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    from gmts.rewards import SandboxUnavailableError

    if cfg.data.dataset is not None:  # a code reward's sandbox, checked before anything loads
        from gmts.train.sources import dataset_reward

        try:
            dataset_reward(cfg.data.reward, sandbox=cfg.data.sandbox)
        except (ValueError, SandboxUnavailableError) as exc:
            print(f"gmts train: error: {exc}", file=sys.stderr)
            return 2
    from gmts.scale.distributed import shutdown
    from gmts.train.preemption import TrainingPreempted
    from gmts.train.trainer import train

    finished = False  # every rank got here on its normal path (preempted ranks agreed to stop)
    try:
        result = train(cfg, resume=args.resume)
        finished = True
    except (ValueError, SandboxUnavailableError) as exc:  # bad model path, dataset fields, ...
        print(f"gmts train: error: {exc}", file=sys.stderr)
        return 2
    except TrainingPreempted as stopped:  # checkpoint saved, reason printed by rank 0
        finished = True
        return int(stopped.code)
    finally:
        shutdown(drain=finished)  # under torchrun: leave the process group the trainer joined
    if result.eval_after is not None:
        before = result.eval_before or {}
        parts = [
            f"{k} {before.get(k, float('nan')):.3f} -> {v:.3f}"
            for k, v in result.eval_after.items()
            if k != "questions"
        ]
        print("held-out: " + ", ".join(parts))
    print(f"run directory: {result.run_dir}")
    return 0
