"""Typed configuration files: YAML and ``section.field=value`` overrides into validated dataclasses.

Generic and small on purpose: the schemas are the components' own dataclasses (``TrainConfig``,
the core's ``SelectionConfig``, ...) whose fields carry their help text in
``metadata["help"]``; this module only reads values into them.

- :func:`read_yaml`: a YAML mapping, with a top-level ``base: other.yaml`` merged underneath
  (variants hold only their differences);
- :func:`apply_overrides`: ``section.field=value`` items, values parsed as YAML (``0.1``,
  ``true``, ``null``, ``[0.9, 0.99]``);
- :func:`build`: a mapping into dataclass ``cls``, each value checked against its annotation
  (:func:`coerce`: unions, ``Literal``, tuples, nested dataclasses); unknown keys and bad
  values raise ``ValueError`` naming the key;
- :func:`to_dict` / :func:`dump_yaml`: back to plain YAML that :func:`build` reads again;
- :func:`field_reference`: (key, type, default, help) of every leaf field, for ``--help`` and
  the docs;
- :func:`dialect_fields`: a dataclass's fields as another front end spells them (TRL's
  ``gmts_*`` arguments, verl's ``gmts.*`` keys), with their types, defaults and help: the
  dialects are generated from the one dataclass, never written out again.

A section whose dataclass has a ``preset(name, **overrides)`` classmethod (``SelectionConfig``,
``ObjectiveConfig``) also takes ``preset: NAME``: it starts from that preset, and the section's
other keys override it.

Why not a library: OmegaConf (verl's choice) pins ``antlr4-python3-runtime`` 4.9, which
conflicts with math-verify's LaTeX parser (4.13); pydantic would replace the dataclasses the
core exports; dacite covers only the dict -> dataclass step. This module is ~200 lines with
PyYAML (imported on use) as its only dependency.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "apply_overrides",
    "build",
    "coerce",
    "deep_merge",
    "DialectField",
    "dialect_fields",
    "dump_yaml",
    "field_reference",
    "field_types",
    "parse_value",
    "read_yaml",
    "to_dict",
    "type_name",
]


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        if _is_variadic(args):
            return f"[{type_name(args[0])}, ...]"
        return "[" + ", ".join(type_name(a) for a in args) + "]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _is_variadic(args: tuple[Any, ...]) -> bool:
    """Whether the arguments of a ``tuple[...]`` annotation are ``(X, ...)`` (any length)."""
    return len(args) == 2 and args[1] is Ellipsis


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` (parsed YAML) against the annotation ``tp``; return the converted value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ValueError(f"{key}: must not be null (expected {type_name(tp)})")
        section = _dataclass_member(tp)
        if section is not None and isinstance(value, dict):
            # a mapping can only mean the section (``D | None``): its own error names the field
            return build(section, value, key)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except ValueError:
                pass  # try the next member of the union
        raise ValueError(f"{key}: expected {type_name(tp)}, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"{key}: expected one of {list(allowed)}, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if _is_variadic(args):
            if not isinstance(value, list | tuple):
                raise ValueError(f"{key}: expected a list, got {value!r}")
            return tuple(coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ValueError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    if is_dataclass_type(tp):
        return build(tp, value, key)
    if tp is Any:
        return value
    raise ValueError(f"{key}: unsupported field type {tp!r}")  # pragma: no cover


def field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _unknown_key_error(cls: type, key: str, prefix: str) -> ValueError:
    where = f"'{prefix}'" if prefix else "the top level"
    valid = ", ".join(field_types(cls))
    full = f"{prefix}.{key}" if prefix else key
    return ValueError(f"unknown config key '{full}'; valid keys at {where}: {valid}")


PRESET_KEY = "preset"


def build(cls: type, raw: Any, prefix: str, base: Any = None) -> Any:
    """Build dataclass ``cls`` from the mapping ``raw``; ``base`` supplies defaults if given,
    a ``preset`` key (for a class with a ``preset`` classmethod) replaces ``base``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix or 'config'}: expected a mapping of keys, got {raw!r}")
    types_ = field_types(cls)
    presettable = PRESET_KEY not in types_ and callable(getattr(cls, PRESET_KEY, None))
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key == PRESET_KEY and presettable:
            continue
        if key not in types_:
            raise _unknown_key_error(cls, key, prefix)
        full = f"{prefix}.{key}" if prefix else key
        kwargs[key] = coerce(value, types_[key], full)
    try:
        if presettable and raw.get(PRESET_KEY) is not None:
            full = f"{prefix}.{PRESET_KEY}" if prefix else PRESET_KEY
            return getattr(cls, PRESET_KEY)(coerce(raw[PRESET_KEY], str, full), **kwargs)
        if base is not None:
            return dataclasses.replace(base, **kwargs)
        return cls(**kwargs)
    except ValueError as exc:
        msg = str(exc)
        # Name the section for the core's own validation messages.
        if prefix and not msg.startswith(prefix):
            msg = f"{prefix}: {msg}"
        raise ValueError(msg) from None


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config; a top-level ``base: other.yaml`` (relative to this file) is merged
    underneath, so variants can hold only their differences."""
    return _read_yaml(Path(path), ())


def _read_yaml(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ValueError(f"config 'base' cycle through {path}")
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    base = data.pop("base", None)
    if base is not None:
        parent = _read_yaml(path.parent / base, (*seen, path.resolve()))
        data = deep_merge(parent, data)
    return data


def parse_value(text: str) -> Any:
    """A command-line value parsed as YAML (``0.1``, ``1e-6``, ``true``, ``null``,
    ``[0.9, 0.99]``); text YAML cannot parse stays a string, an empty one is ``""``."""
    import yaml

    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.field=value`` overrides (values parsed by :func:`parse_value`)."""
    raw = deep_merge({}, raw)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected section.field=value")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ValueError(f"override {item!r}: bad key {key!r}")
        value = parse_value(text)
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return raw


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-Python (YAML-safe) form of a dataclass; tuples become lists."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        return v

    return plain(cfg)


def dump_yaml(cfg: Any) -> str:
    """``cfg`` (a dataclass) as YAML that :func:`build` reads back to an equal object."""
    import yaml

    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def _dataclass_member(tp: Any) -> type | None:
    """The dataclass of a field typed ``D`` or ``D | None``, else None."""
    if is_dataclass_type(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(members) == 1 and is_dataclass_type(members[0]):
            return members[0]
    return None


def field_reference(
    cls: type, prefix: str = "", defaults: Any = None
) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every leaf field of dataclass ``cls``, nested sections
    flattened to ``section.field`` (a field typed ``D | None`` is listed as section ``D``; when
    it is null by default, a row for the section itself comes first, with the field's help).
    Defaults are each class's own (``D()``), before any ``__post_init__`` of the enclosing
    class fills them in.

    Args:
        defaults: the instance whose values are the defaults (None: ``cls()``).
    """
    rows: list[tuple[str, str, str, str]] = []
    types_ = field_types(cls)
    defaults = cls() if defaults is None else defaults
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(defaults, f.name)
        section = _dataclass_member(types_[f.name])
        help_text = f.metadata.get("help", "") if f.metadata else ""
        if section is not None:
            if value is None:  # an optional section, off by default
                rows.append((key, type_name(types_[f.name]), repr(value), help_text))
            rows.extend(field_reference(section, key))
            continue
        if isinstance(value, tuple):
            value = list(value)
        rows.append((key, type_name(types_[f.name]), repr(value), help_text))
    return rows


@dataclasses.dataclass(frozen=True)
class DialectField:
    """One dataclass field as another front end spells it.

    Attributes:
        key: the front end's name (``prefix + field``).
        field: the dataclass field.
        type: the field's annotation, resolved (``str``, ``float``, ``int | None``, ...).
        default: the field's default.
        help: the field's help text, plus the front end's note for it.
    """

    key: str
    field: str
    type: Any
    default: Any
    help: str


def dialect_fields(
    cls: type, prefix: str, notes: dict[str, str] | None = None
) -> list[DialectField]:
    """Every init field of dataclass ``cls`` as ``prefix + name``, with its resolved type,
    default and help text (``notes[name]`` appended: what the front end adds to it)."""
    notes = notes or {}
    unknown = set(notes) - set(field_types(cls))
    if unknown:
        raise ValueError(f"notes for unknown {cls.__name__} fields {sorted(unknown)}")
    out = []
    defaults = cls()
    for name, tp in field_types(cls).items():
        f = cls.__dataclass_fields__[name]
        text = " ".join(t for t in (f.metadata.get("help", ""), notes.get(name, "")) if t)
        out.append(DialectField(prefix + name, name, tp, getattr(defaults, name), text))
    return out
