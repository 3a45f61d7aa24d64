"""Helpers shared by the core's typed configs (ObjectiveConfig, SelectionConfig)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

C = TypeVar("C")


def help_meta(text: str) -> dict[str, str]:
    """``field(metadata=...)`` carrying a help text (read by the CLI and the YAML loader)."""
    return {"help": text}


def check_choice(name: str, value: Any, choices: Collection[str]) -> None:
    """ValueError naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def from_preset(
    cls: type[C], presets: Mapping[str, C], kind: str, name: str, overrides: dict[str, Any]
) -> C:
    """``presets[name]`` with its fields replaced by ``overrides`` (all validated first)."""
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}; valid presets: {sorted(presets)}")
    unknown = set(overrides) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields in overrides: {sorted(unknown)}")
    return replace(presets[name], **overrides)
