"""The ``gmts`` command line.

Each sub-command lives in its own module of this package and exposes two functions::

    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int: ...

Modules are imported only when their sub-command runs, so ``gmts --help`` stays fast and
``import gmts`` never pulls in transformers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("gmts.cli.demo", "train all-tokens, ETS and GMTS policies on the embedded task"),
    "train": ("gmts.cli.train", "train a policy from a YAML config (fields overridable)"),
    "eval": ("gmts.cli.eval", "evaluate a model on benchmarks (average@k)"),
    "analyze": ("gmts.cli.analyze", "per-token entropy / gradient-norm analysis (paper Fig. 2-3)"),
    "plot": ("gmts.cli.plot", "plot learning curves of one or more runs"),
    "plan": ("gmts.cli.plan", "per-GPU memory plan of a training config (no weights loaded)"),
    "export": ("gmts.cli.export", "write a checkpoint's float32 weights as a bf16 model folder"),
}


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(
        prog="gmts", description="Token-selective RLVR (GMTS, ETS, GRPO, DAPO)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen sub-command pays for its imports
            importlib.import_module(module_name).add_arguments(sp)
    return parser, chosen if chosen in SUBCOMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, chosen = build_parser(argv)
    args = parser.parse_args(argv)
    if chosen is None:
        parser.print_help()
        return 0 if not argv else 2
    module = importlib.import_module(SUBCOMMANDS[chosen][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
