"""TrainConfig: YAML + overrides -> validated dataclasses; errors name the bad key or value."""

from __future__ import annotations

from pathlib import Path

import pytest

from gmts.cli import main
from gmts.cli.config_reference import config_markdown_table, config_reference
from gmts.configuration import read_yaml
from gmts.train.config import build_config, dump_yaml, load_config

REPO = Path(__file__).resolve().parents[2]


def test_defaults_and_algorithm_presets():
    dapo = load_config()
    assert dapo.algorithm == "dapo"
    assert dapo.objective.aggregation == "token-mean" and dapo.objective.kl_coef == 0
    assert dapo.rollout.dynamic_sampling is True
    grpo = load_config(None, ["algorithm=grpo"])
    assert grpo.objective.aggregation == "seq-mean-token-mean" and grpo.objective.kl_coef > 0
    assert grpo.rollout.dynamic_sampling is False
    # objective fields override the preset, the rest of the preset stays
    tuned = load_config(None, ["algorithm=grpo", "objective.kl_coef=0.04"])
    assert tuned.objective.kl_coef == 0.04
    assert tuned.objective.aggregation == "seq-mean-token-mean"


def test_model_dtype_takes_auto_and_defaults_to_float32():
    """float32 stays the default (the committed figures are float32 results); auto is kept as
    written in the config: the trainer resolves it on its device (test_auto_dtype.py)."""
    assert load_config().model.dtype == "float32"
    assert load_config(None, ["model.dtype=auto"]).model.dtype == "auto"
    with pytest.raises(ValueError, match="'float32' | 'bfloat16' | 'auto'"):
        load_config(None, ["model.dtype=bf16"])


def test_override_values_are_parsed_and_typed():
    cfg = load_config(
        None,
        [
            "selection.ratio=0.1",
            "selection.largest=false",
            "optim.betas=[0.9, 0.95]",
            "optim.lr=1e-6",
            "rollout.max_response_length=null",
            "optim.steps=5.0",
            "model.path=some/dir",
        ],
    )
    assert cfg.selection.ratio == 0.1 and cfg.selection.largest is False
    assert cfg.optim.betas == (0.9, 0.95) and cfg.optim.lr == 1e-6
    assert cfg.rollout.max_response_length is None
    assert cfg.optim.steps == 5 and isinstance(cfg.optim.steps, int)


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("selection.ratoi=0.1", ["selection.ratoi", "ratio", "score", "scope"]),
        ("optimizer.lr=1", ["optimizer", "optim", "selection", "rollout"]),
        ("objective.klcoef=1", ["objective.klcoef", "kl_coef", "clip_high"]),
    ],
)
def test_unknown_key_names_it_and_lists_valid_keys(override, names):
    with pytest.raises(ValueError) as err:
        load_config(None, [override])
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("selection.ratio=1.5", "ratio"),
        ("selection.score=entropyy", "score"),
        ("optim.lr=-1", "optim.lr"),
        ("optim.steps=abc", "optim.steps"),
        ("optim.betas=[0.9]", "optim.betas"),
        ("algorithm=ppo", "algorithm"),
        ("model.dtype=float16", "model.dtype"),
        ("rollout.group_size=0", "rollout.group_size"),
        ("logging.progress=maybe", "logging.progress"),
        ("optim.mini_batch_questions=5", "optim.mini_batch_questions"),
        ("objective.clip_low=-0.1", "clip"),
        ("selection", "section.field=value"),
    ],
)
def test_invalid_values_raise_naming_the_field(override, fragment):
    with pytest.raises(ValueError, match=None) as err:
        load_config(None, [override])
    assert fragment in str(err.value)


def test_yaml_base_inheritance(tmp_path):
    (tmp_path / "base.yaml").write_text("algorithm: grpo\noptim:\n  lr: 1.0e-6\n  steps: 7\n")
    (tmp_path / "variant.yaml").write_text("base: base.yaml\noptim:\n  lr: 2.0e-6\n")
    cfg = load_config(tmp_path / "variant.yaml", ["optim.epochs=2"])
    assert cfg.algorithm == "grpo" and cfg.optim.lr == 2e-6 and cfg.optim.steps == 7
    assert cfg.optim.epochs == 2
    # the dumped config reloads to the same config
    (tmp_path / "dumped.yaml").write_text(dump_yaml(cfg))
    assert load_config(tmp_path / "dumped.yaml") == cfg


def test_missing_config_file():
    with pytest.raises(ValueError, match="not found"):
        read_yaml("/nonexistent/config.yaml")


# The trainer's configs (configs/trl and configs/verl belong to the integrations).
TRAINER_CONFIGS = sorted(
    p.relative_to(REPO)
    for p in [REPO / "configs" / "demo.yaml", *(REPO / "configs").glob("qwen*/*.yaml")]
)


@pytest.mark.parametrize("path", TRAINER_CONFIGS, ids=str)
def test_shipped_configs_load(path):
    cfg = load_config(REPO / path)
    assert cfg.algorithm in ("grpo", "dapo")


def test_reference_covers_every_field_with_help():
    rows = config_reference()
    keys = [r[0] for r in rows]
    assert "selection.ratio" in keys and "objective.kl_coef" in keys and "optim.lr" in keys
    assert len(keys) == len(set(keys))
    assert all(r[3] for r in rows), [r[0] for r in rows if not r[3]]
    assert "| `selection.score` |" in config_markdown_table()
    assert build_config({}) == load_config()


def test_cli_errors_are_one_line_before_any_model_is_loaded(capsys, tmp_path):
    assert main(["train", "selection.ratoi=0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "selection.ratoi" in err and "ratio" in err
    missing = tmp_path / "no-such-model"
    code = main(["train", f"model.path={missing}", f"logging.output_dir={tmp_path / 'run'}"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and "does not exist" in err


def test_cli_print_config(capsys):
    assert main(["train", "--print-config", "selection.score=entropy"]) == 0
    out = capsys.readouterr().out
    assert "score: entropy" in out


def test_docs_reference_table_is_current():
    """docs/training.md holds the generated table (regenerate: python -m gmts.cli.config_reference)."""
    doc = (REPO / "docs" / "training.md").read_text()
    assert config_markdown_table() in doc


@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("wandb") is not None, reason="wandb installed"
)
def test_report_to_a_missing_package_is_a_config_error():
    with pytest.raises(ValueError, match="logging.report_to: wandb is not installed"):
        load_config(None, ["logging.report_to=wandb"])
