"""The reference of every ``gmts train`` config key: ``gmts train --help`` and docs/training.md.

Generated from the dataclasses of :mod:`gmts.train.config` and their ``metadata["help"]`` (the
one place each key is described). Regenerate the docs table with
``python -m gmts.cli.config_reference``.
"""

from __future__ import annotations

from gmts.configuration import field_reference
from gmts.train.config import TrainConfig

__all__ = ["config_help_text", "config_markdown_table", "config_reference"]


def config_reference() -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every ``TrainConfig`` key. Defaults are the fields' own
    (``null`` where the algorithm decides); ``objective.*`` shows the default algorithm's (DAPO)
    preset."""
    return field_reference(TrainConfig)


def config_help_text() -> str:
    """Every key with its type, default and help: the epilog of ``gmts train --help``."""
    lines = ["config keys (override as section.field=value):"]
    for key, tp, default, help_text in config_reference():
        lines.append(f"  {key} = {default}  [{tp}]")
        if help_text:
            lines.append(f"      {help_text}")
    return "\n".join(lines)


def config_markdown_table() -> str:
    """The config reference as a Markdown table (docs/training.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, help_text in config_reference():
        esc_help = help_text.replace("|", "\\|")
        esc_type = tp.replace("|", "\\|")
        rows.append(f"| `{key}` | {esc_type} | `{default}` | {esc_help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m gmts.cli.config_reference > table (docs/training.md)
    print(config_markdown_table())
