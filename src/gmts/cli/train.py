"""``gmts train``: RLVR training from a YAML config, every field overridable.

    gmts train --config configs/qwen2.5-math-1.5b/dapo-gmts.yaml optim.lr=1e-6 selection.ratio=0.1
    torchrun --nproc_per_node 2 -m gmts train --config FILE.yaml
    gmts train --config FILE.yaml --resume          # continue from the last checkpoint
    gmts train --config FILE.yaml --resume auto     # continue, or start afresh if none yet
    gmts train --plugin my_objectives objective.name=mine   # an objective you registered

Overrides are positional ``section.field=value`` arguments (values parsed as YAML), before,
after or between the flags. Every key, its type, default and meaning is listed by
``gmts train --help``. What the run may do with its folder (--resume, --overwrite,
--allow-config-change): gmts.train.run_folder.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def exit_status_text() -> str:
    """The exit statuses of ``gmts train`` (the top of its ``--help`` epilog)."""
    from gmts.train.preemption import MARKER_FILE, PREEMPTED_EXIT_CODE

    code = PREEMPTED_EXIT_CODE
    return f"""exit status:
  0   training finished
  2   bad config, model path, dataset or sandbox, or a run folder that refuses the run
      (reported before anything loads); a write that failed during training (disk full,
      read-only folder): the checkpoints written before it are kept
  {code}  stopped by SIGTERM or checkpoint.preempt_signal at a step boundary: the optimizer
      step in progress was finished and checkpointed and {MARKER_FILE} written into the run
      directory; run the same command with --resume to continue exactly (docs/training.md,
      "Preemption"). Under torchrun every rank exits with {code} and torchrun itself with 1:
      check for {MARKER_FILE}."""


class _IntermixedParser(argparse.ArgumentParser):
    """``gmts train``'s parser: flags and ``section.field=value`` overrides in any order
    (``parse_known_intermixed_args``), and ``--resume auto`` read as ``--resume=auto`` (a bare
    ``--resume`` as ``--resume=on``), so ``--resume`` never takes the override after it."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:  # the two passes of parse_known_intermixed_args
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(_resume_values(list(args or [])), namespace)
        finally:
            self._intermixing = False


def _resume_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":  # the rest is positional
            return out + argv[i:]
        if argv[i] == "--resume":
            auto = i + 1 < len(argv) and argv[i + 1] == "auto"
            out.append("--resume=auto" if auto else "--resume=on")
            i += 2 if auto else 1
            continue
        out.append(argv[i])
        i += 1
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gmts.cli.config_reference import config_help_text

    parser.__class__ = _IntermixedParser  # the sub-command parser cli/__init__ made for us
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
        nargs="?",
        choices=["on", "auto"],
        const="on",
        default=None,
        metavar="auto",
        help=(
            "Continue from the run's newest intact checkpoint; with none it is an error. "
            "'--resume auto': start afresh when there is none (and say so). The config must "
            "match the run's config.yaml in every key that changes training."
        ),
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=(
            "Start afresh in a folder that holds a run: first delete its metrics, evaluations, "
            "config, checkpoints and records (nothing else in the folder)."
        ),
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="Resume with a config that differs from the run's (the changes are recorded in "
        "resumes.jsonl).",
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

    resume = {None: False, "on": True, "auto": "auto"}[args.resume]
    finished = False  # every rank got here on its normal path (preempted ranks agreed to stop)
    try:
        result = train(
            cfg,
            resume=resume,
            overwrite=args.overwrite,
            allow_config_change=args.allow_config_change,
        )
        finished = True
    except (ValueError, SandboxUnavailableError) as exc:  # bad model path, run folder, ...
        print(f"gmts train: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a write that failed during training (disk full, read-only)
        print(f"gmts train: error: {_write_failure(exc, cfg.logging.output_dir)}", file=sys.stderr)
        return 2
    except TrainingPreempted as stopped:  # checkpoint saved, reason printed by rank 0
        finished = True
        return int(stopped.code)
    finally:
        shutdown(drain=finished)  # under torchrun: leave the process group the trainer joined
    if result.eval_after is not None:
        print(held_out_line(result.eval_after, _evaluation_before(result)))
    print(f"run directory: {result.run_dir}")
    return 0


def _evaluation_before(result: Any) -> dict[str, Any] | None:
    """The held-out evaluation before step 1: this process's, or after a ``--resume`` the
    step-0 row of the run's eval.jsonl (None when the run never made one)."""
    if result.eval_before is not None:
        return result.eval_before
    from gmts.train.metrics_log import EVAL_FILE, read_metrics

    rows = [row for row in read_metrics(result.run_dir, EVAL_FILE) if row.get("step") == 0]
    return rows[-1] if rows else None


def held_out_line(after: dict[str, Any], before: dict[str, Any] | None) -> str:
    """``held-out: average@2 0.109 -> 0.406, pass@2 ...``; without an evaluation before
    training, the final figures and why there is no "before"."""
    metrics = {k: float(v) for k, v in after.items() if k != "questions"}
    if before is None:
        parts = [f"{k} {v:.3f}" for k, v in metrics.items()]
        return "held-out: " + ", ".join(parts) + " (no evaluation before step 1 was recorded)"
    parts = [
        f"{k} {float(before[k]):.3f} -> {v:.3f}" if k in before else f"{k} {v:.3f}"
        for k, v in metrics.items()
    ]
    return "held-out: " + ", ".join(parts)


def _write_failure(exc: OSError, run_dir: str) -> str:
    """One line for a failed write: the error's own line, and where the checkpoints are."""
    from gmts.train.checkpoint import CheckpointWriteError, latest_checkpoint

    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, CheckpointWriteError):  # says which checkpoint is kept
        return line
    newest = latest_checkpoint(run_dir)
    return f"{line}; the newest checkpoint is {newest}" if newest else line
