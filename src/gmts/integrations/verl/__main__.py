"""``python -m gmts.integrations.verl``: verl's PPO entry point with GMTS token selection.

Usage::

    python -m gmts.integrations.verl [--config FILE.yaml] [--entry MODULE] [--dry-run] \\
        [gmts.KEY=VALUE ...] [verl hydra overrides ...]

``gmts.KEY=VALUE`` sets any ``SelectionConfig`` field, ``gmts.preset`` (paper, trl,
reference-code) or ``gmts.score_inputs`` (current, rollout): ``--help`` lists them with their
help, generated from the dataclasses (:func:`~gmts.integrations.verl.settings.verl_keys`). ``--config`` reads a YAML file with a ``gmts:`` mapping and an ``overrides:`` list of
verl overrides (configs/verl/*.yaml); command-line items win over the file's. The launcher
puts the settings in ``GMTS_VERL_SELECTION`` (here and, through
``ray_kwargs.ray_init.runtime_env.env_vars``, in every Ray worker) and then runs ``--entry``
(default ``verl.trainer.main_ppo``) exactly as ``python -m`` would, with the verl overrides as
its command line. ``--dry-run`` prints the environment value and the verl command instead.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gmts.integrations.verl.settings import ENV_VAR, GMTSVerlSettings, verl_keys

__all__ = ["main", "build_command"]

DEFAULT_ENTRY = "verl.trainer.main_ppo"
_RUNTIME_ENV_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{ENV_VAR}"


def _override_key(item: str) -> str:
    """``'+a.b=1'`` -> ``'a.b'`` (Hydra's +, ++ and ~ prefixes stripped)."""
    return item.split("=", 1)[0].lstrip("+~")


def _load_config(path: str) -> tuple[dict[str, str], list[str]]:
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--config: no such file {path!r}")
    content = yaml.safe_load(file.read_text()) or {}
    if not isinstance(content, dict) or set(content) - {"gmts", "overrides", "description"}:
        raise ValueError(
            f"--config {path}: expected a mapping with 'gmts', 'overrides' (and 'description')"
        )
    gmts = content.get("gmts") or {}
    overrides = content.get("overrides") or []
    if not isinstance(gmts, dict) or not isinstance(overrides, list):
        raise ValueError(f"--config {path}: 'gmts' must be a mapping and 'overrides' a list")
    return {str(k): _yaml_str(v) for k, v in gmts.items()}, [str(o) for o in overrides]


def _yaml_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def build_command(argv: Sequence[str]) -> tuple[GMTSVerlSettings, str, list[str], bool]:
    """Parse the launcher's command line.

    Returns:
        ``(settings, entry module, verl overrides, dry_run)``; the overrides already include
        the one that forwards ``GMTS_VERL_SELECTION`` to the Ray workers.
    """
    parser = argparse.ArgumentParser(
        prog="python -m gmts.integrations.verl",
        description="verl PPO/GRPO/DAPO with GMTS token selection (gmts.KEY=VALUE overrides).",
        epilog=keys_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML file with 'gmts' settings and verl 'overrides'")
    parser.add_argument("--entry", default=DEFAULT_ENTRY, help="verl entry module to run")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args, items = parser.parse_known_args(list(argv))
    unknown_flags = [item for item in items if item.startswith("--")]
    if unknown_flags:
        parser.error(f"unknown options {unknown_flags}; verl settings are KEY=VALUE overrides")

    gmts_values: dict[str, str] = {}
    overrides: list[str] = []
    if args.config:
        gmts_values, overrides = _load_config(args.config)
    cli_overrides = []
    for item in items:
        if "=" not in item:
            parser.error(f"expected KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        if key.startswith("gmts."):
            gmts_values[key[len("gmts.") :]] = value
        else:
            cli_overrides.append(item)
    cli_keys = {_override_key(item) for item in cli_overrides}
    overrides = [o for o in overrides if _override_key(o) not in cli_keys] + cli_overrides

    settings = GMTSVerlSettings.from_strings(gmts_values)
    _check_overrides(settings, overrides)
    overrides = [_resolve_model_override(item) for item in overrides]
    if _RUNTIME_ENV_KEY not in {_override_key(o) for o in overrides}:
        overrides.append(f"+{_RUNTIME_ENV_KEY}={settings.to_env_value(encoded=True)}")
    return settings, args.entry, overrides, args.dry_run


def keys_help() -> str:
    """The ``gmts.*`` keys with their defaults and help (``--help``'s epilog)."""
    lines = ["gmts settings (gmts.KEY=VALUE):"]
    for item in verl_keys():
        lines.append(f"  {item.key}={item.default!r}")
        lines.extend(
            textwrap.wrap(
                item.help,
                88,
                initial_indent=" " * 6,
                subsequent_indent=" " * 6,
                break_on_hyphens=False,  # names such as seq-mean-token-mean stay whole
            )
        )
    return "\n".join(lines)


def _check_overrides(settings: GMTSVerlSettings, overrides: list[str]) -> None:
    """Fail before Ray starts on actor settings the worker-side loss would reject anyway (the
    same check, :func:`~gmts.integrations.verl.loss_modes.check_actor_config`, on the
    ``actor_rollout_ref.actor.*`` overrides as a nested dict, values parsed as YAML; verl's
    defaults for the rest). verl's own config check repeats it on the composed config."""
    from gmts.configuration import parse_value
    from gmts.integrations.verl.loss_modes import check_actor_config

    prefix = "actor_rollout_ref.actor."
    actor: dict[str, Any] = {}
    for item in overrides:
        key = _override_key(item)
        if "=" not in item or not key.startswith(prefix) or item.startswith("~"):
            continue
        *parents, name = key[len(prefix) :].split(".")
        node = actor
        for parent in parents:
            node = node.setdefault(parent, {})
            if not isinstance(node, dict):  # a whole section replaced by a value: verl decides
                break
        else:
            node[name] = parse_value(item.split("=", 1)[1])
    check_actor_config(actor, settings)


def _resolve_model_override(item: str) -> str:
    """``*.model.path=smollm2-135m-instruct`` (a named model or a ``.gguf`` file) becomes
    ``*.model.path=<its converted folder>`` (:mod:`gmts.models.named`); every other value is
    verl's to read. ModelPathError (a ValueError) when the package or file is missing."""
    key = _override_key(item)
    if "=" not in item or not (key == "model.path" or key.endswith(".model.path")):
        return item
    from gmts.models.loading import resolve_model_path
    from gmts.models.named import available_named_models, is_gguf_path

    head, value = item.split("=", 1)
    if value in available_named_models() or is_gguf_path(value):
        return f"{head}={resolve_model_path(value)}"
    return item


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, entry, overrides, dry_run = build_command(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env_value = settings.to_env_value()
    if dry_run:
        print(f"{ENV_VAR}={shlex.quote(env_value)}")
        print(shlex.join([sys.executable, "-m", entry, *overrides]))
        return 0
    os.environ[ENV_VAR] = env_value  # the driver, and a local Ray cluster it starts
    sys.argv = [entry, *overrides]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
