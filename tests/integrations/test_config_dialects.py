"""One configuration, three dialects: every ``SelectionConfig`` field is TRL's ``gmts_<field>``
and verl's ``gmts.<field>`` (generated, with the field's help text), ``preset`` works in the
three front ends (standalone YAML/CLI, TRL, verl), and a setting a front end refuses is refused
in the same words. A new selection setting is one field of SelectionConfig: these tests then
cover it in both dialects without a change."""

from __future__ import annotations

import dataclasses
import random
import typing

import pytest

import gmts
from gmts.core.config import SELECTION_PRESETS
from gmts.core.support import GROUPS_SPLIT
from gmts.integrations.verl.settings import GMTSVerlSettings, verl_keys
from gmts.train.config import load_config

FIELDS = {f.name: f for f in dataclasses.fields(gmts.SelectionConfig)}
HINTS = typing.get_type_hints(gmts.SelectionConfig)


def _random_selections(n: int, seed: int = 0) -> list[gmts.SelectionConfig]:
    """Valid SelectionConfigs with every field drawn (TRL and verl accept each of them)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        values = dict(
            score=rng.choice(["gmts", "entropy", "omega", "random", "none", "stapo", "rsi"]),
            ratio=rng.choice([0.1, 0.2, 0.35, 1.0]),
            largest=rng.choice([True, False]),
            scope=rng.choice(["batch", "sequence"]),
            count=rng.choice(["ceil", "floor", "quantile", "index"]),
            ties=rng.choice(["first", "last"]),
            zero_scores=rng.choice(["skip", "select"]),
            omega=rng.choice(["analytic", "autograd"]),
            omega_weighting=rng.choice([True, False]),
            normalize=rng.choice(["selected", "all"]),
            kl_tokens=rng.choice(["selected", "all"]),
            seed=rng.randrange(100),
            stapo_prob_threshold=rng.choice([0.002, 0.05]),
            stapo_entropy_quantile=rng.choice([0.8, 0.5]),
            rsi_low=rng.choice([0.5, 0.25]),
            rsi_high=rng.choice([2.0, 3.5]),
        )
        assert set(values) | {"unit"} == set(FIELDS), "a new field: draw it here too"
        try:
            out.append(gmts.SelectionConfig(**values))
        except ValueError:
            continue  # e.g. count quantile with scope sequence
    return out


# ------------------------------------------------------------------------------------------
# verl: gmts.<field>, gmts.preset, gmts.score_inputs


def test_verl_keys_are_the_dataclass_fields_with_their_help():
    keys = {item.key: item for item in verl_keys()}
    assert set(keys) == {f"gmts.{name}" for name in FIELDS} | {"gmts.preset", "gmts.score_inputs"}
    for name, f in FIELDS.items():
        item = keys[f"gmts.{name}"]
        assert item.help.startswith(f.metadata["help"]) and item.type == HINTS[name]
        assert item.default == getattr(gmts.SelectionConfig(), name)
    assert "Not in the verl plugin: 'micro-batch'" in keys["gmts.unit"].help
    assert keys["gmts.score_inputs"].help  # GMTSVerlSettings' own field, its help too


def test_verl_strings_round_trip_every_field():
    for selection in _random_selections(30):
        selection = dataclasses.replace(selection, unit="mini-batch")
        strings = {
            name: str(value).lower() if isinstance(value, bool) else str(value)
            for name, value in dataclasses.asdict(selection).items()
        }
        assert GMTSVerlSettings.from_strings(strings).selection == selection


# ------------------------------------------------------------------------------------------
# TRL: gmts_<field>, gmts_preset


def test_trl_arguments_are_the_dataclass_fields_with_their_help():
    pytest.importorskip("trl")
    from gmts.integrations.trl import GMTSGRPOConfig

    trl_fields = {f.name: f for f in dataclasses.fields(GMTSGRPOConfig)}
    gmts_names = {name for name in trl_fields if name.startswith("gmts_")}
    own = {"gmts_preset", "gmts_vespo_trl_padding"}  # TRL's own: the preset, a TRL loss option
    assert gmts_names == {f"gmts_{name}" for name in FIELDS} | own
    for name, f in FIELDS.items():
        trl_field = trl_fields[f"gmts_{name}"]
        assert trl_field.metadata["help"].startswith(f.metadata["help"])
        assert trl_field.type == (HINTS[name] | None) and trl_field.default is None
    assert "Not in GMTSGRPOTrainer: 'group'" in trl_fields["gmts_scope"].metadata["help"]


def test_trl_arguments_round_trip_and_resolve_to_the_selection():
    pytest.importorskip("trl")
    from gmts.integrations.trl import GMTSGRPOConfig, gmts_args

    common = dict(output_dir="/tmp/gmts-dialects", use_cpu=True, bf16=False, report_to="none")
    for selection in _random_selections(12, seed=1):
        args = GMTSGRPOConfig(**common, **gmts_args(selection))
        assert args.gmts_selection_config() == selection
        for name in FIELDS:  # the resolved values are readable as TRL arguments
            assert getattr(args, f"gmts_{name}") == getattr(selection, name)
    default = GMTSGRPOConfig(**common, seed=7)
    assert default.gmts_selection_config() == gmts.SelectionConfig(seed=7)
    assert default.gmts_seed is None  # still the trainer's seed


# ------------------------------------------------------------------------------------------
# preset in the three front ends


@pytest.mark.parametrize("preset", sorted(SELECTION_PRESETS))
@pytest.mark.parametrize("score", ["gmts", "entropy"])
def test_preset_means_the_same_in_the_three_front_ends(preset, score):
    want = dataclasses.replace(gmts.SelectionConfig.preset(preset, score=score), ratio=0.3)
    standalone = load_config(
        None, [f"selection.preset={preset}", f"selection.score={score}", "selection.ratio=0.3"]
    ).selection
    assert standalone == want
    if want.unit == "mini-batch" and want.scope != "group" and want.normalize != "per-group":
        verl = GMTSVerlSettings.from_strings({"preset": preset, "score": score, "ratio": "0.3"})
        assert verl.selection == want
    pytest.importorskip("trl")
    from gmts.integrations.trl import GMTSGRPOConfig

    args = GMTSGRPOConfig(
        output_dir="/tmp/gmts-dialects",
        use_cpu=True,
        bf16=False,
        report_to="none",
        seed=0,
        gmts_preset=preset,
        gmts_score=score,
        gmts_ratio=0.3,
    )
    assert args.gmts_selection_config() == want


def test_a_refused_setting_reads_the_same_in_trl_and_verl():
    pytest.importorskip("trl")
    from gmts.integrations.trl import GMTSGRPOConfig, check_trl_args

    with pytest.raises(ValueError) as verl_err:
        GMTSVerlSettings.from_strings({"scope": "group"})
    args = GMTSGRPOConfig(
        output_dir="/tmp/gmts-dialects", use_cpu=True, bf16=False, gmts_scope="group"
    )
    with pytest.raises(ValueError) as trl_err:
        check_trl_args(args)
    verl_line = str(verl_err.value).splitlines()[1]
    trl_line = str(trl_err.value).splitlines()[1]
    assert verl_line.startswith("- gmts.scope='group' is not available in the verl plugin: ")
    assert trl_line.startswith("- gmts_scope='group' is not available in GMTSGRPOTrainer: ")
    assert verl_line.split(": ", 1)[1] == trl_line.split(": ", 1)[1]  # the same words
    assert GROUPS_SPLIT in verl_line
