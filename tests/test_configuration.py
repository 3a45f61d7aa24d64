"""gmts.configuration on toy schemas: optional nested sections (``D | None``) from YAML and
overrides, variable-length tuples, and the reference rows of an optional section."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gmts.configuration import apply_overrides, build, dump_yaml, field_reference, read_yaml


@dataclass
class Adapter:
    rank: int = field(default=8, metadata={"help": "the rank"})
    names: str | tuple[str, ...] = field(default="all", metadata={"help": "names"})

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank: must be >= 1, got {self.rank}")


@dataclass
class Model:
    path: str = "m"
    adapter: Adapter | None = field(default=None, metadata={"help": "off when null"})


@dataclass
class Root:
    model: Model = field(default_factory=Model)


def test_an_optional_section_is_null_by_default_and_built_from_overrides():
    assert build(Root, {}, "").model.adapter is None
    cfg = build(Root, apply_overrides({}, ["model.adapter.rank=4"]), "")
    assert cfg.model.adapter == Adapter(rank=4)
    cfg = build(Root, apply_overrides({}, ["model.adapter={}"]), "")
    assert cfg.model.adapter == Adapter()  # on, with the section's defaults
    # a YAML file that turns it on; an override that turns it off again
    raw = {"model": {"adapter": {"rank": 2, "names": ["a", "b"]}}}
    assert build(Root, raw, "").model.adapter == Adapter(rank=2, names=("a", "b"))
    assert build(Root, apply_overrides(raw, ["model.adapter=null"]), "").model.adapter is None
    # an override into a section that a file set to null
    raw = apply_overrides({"model": {"adapter": None}}, ["model.adapter.rank=3"])
    assert build(Root, raw, "").model.adapter.rank == 3


def test_yaml_round_trip_of_an_optional_section(tmp_path):
    cfg = build(Root, {"model": {"adapter": {"rank": 2, "names": ["x"]}}}, "")
    path = tmp_path / "c.yaml"
    path.write_text(dump_yaml(cfg))
    assert build(Root, read_yaml(path), "") == cfg
    off = build(Root, {}, "")
    path.write_text(dump_yaml(off))
    assert build(Root, read_yaml(path), "") == off


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # the section's own validation reaches the user (not "expected Adapter | null")
        (["model.adapter.rank=0"], "model.adapter: rank: must be >= 1, got 0"),
        (["model.adapter.rnak=2"], "unknown config key 'model.adapter.rnak'"),
        (["model.adapter.names=[1]"], "model.adapter.names: expected str | [str, ...]"),
        (["model.adapter=3"], "model.adapter: expected Adapter | null, got 3"),
    ],
)
def test_errors_inside_an_optional_section_name_the_field(overrides, message):
    with pytest.raises(ValueError) as err:
        build(Root, apply_overrides({}, overrides), "")
    assert message in str(err.value)


def test_reference_lists_the_optional_section_then_its_fields():
    rows = field_reference(Root)
    assert [r[0] for r in rows] == [
        "model.path",
        "model.adapter",
        "model.adapter.rank",
        "model.adapter.names",
    ]
    assert rows[1] == ("model.adapter", "Adapter | null", "None", "off when null")
    assert rows[3][1] == "str | [str, ...]"
