"""The standalone trainer runs every registered objective, in GRPO and DAPO recipes alike,
from the same YAML/override keys (``objective.name=...``), and names a mistaken one before any
model is loaded. (That the trainer's update equals the reference for every objective is the
conformance matrix's trainer column: tests/conformance/test_conformance_objectives.py.)"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import gmts
from gmts.train.config import load_config
from gmts.train.metrics_log import read_metrics
from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")

OBJECTIVES = {
    "ppo": [],
    "gspo": [
        "objective.ratio_level=sequence",
        "objective.clip_low=0.0003",
        "objective.clip_high=0.0004",
    ],
    "gspo-token": ["objective.ratio_level=sequence-token"],
    "cispo": ["objective.name=cispo", "objective.clip_low=1.0", "objective.clip_high=4.0"],
    "sapo": ["objective.name=sapo"],
    "gmpo": ["objective.name=gmpo", "objective.clip_low=0.4", "objective.clip_high=0.4"],
    "gpg": ["objective.name=gpg"],
    "dppo-tv": ["objective.name=dppo-tv", "objective.ratio_cap=3.0"],
    "dppo-kl": ["objective.name=dppo-kl", "objective.ratio_cap=3.0"],
    "dro": ["objective.name=dro", "objective.dro_beta=0.1"],
    "vespo": ["objective.name=vespo"],
    # the covariance picks at ratios that act on a tiny batch (verl's default 0.0002 picks one)
    "clip-cov": [
        "objective.name=clip-cov",
        "objective.clip_cov_ratio=0.1",
        "objective.clip_cov_lb=-1.0",
        "objective.clip_cov_ub=1.0",
    ],
    "kl-cov": ["objective.name=kl-cov", "objective.kl_cov_ratio=0.1", "objective.kl_cov_coef=0.5"],
    "dr-grpo": ["objective.aggregation=seq-mean-token-sum-norm", "rollout.std_normalize=false"],
}


def test_every_registered_objective_has_a_trainer_case():
    names = {gmts.ObjectiveConfig().name}
    for overrides in OBJECTIVES.values():
        names |= {o.split("=", 1)[1] for o in overrides if o.startswith("objective.name=")}
    assert names == set(gmts.available_objectives())


@pytest.mark.parametrize("algorithm", ["grpo", "dapo"])
@pytest.mark.parametrize("case", sorted(OBJECTIVES))
def test_the_trainer_runs_every_objective(tiny_dir, tmp_path, algorithm, case):
    extra = ["objective.kl_estimator=k2"] if algorithm == "grpo" and case == "gpg" else []
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        f"algorithm={algorithm}",
        "selection.ratio=0.3",
        "optim.mini_batch_questions=2",  # two optimizer steps: the second one is off-policy
        *OBJECTIVES[case],
        *extra,
    )
    assert cfg.objective.kl_coef == (0.001 if algorithm == "grpo" else 0.0)  # the recipe's KL
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    assert trainer.loss.objective == cfg.objective
    before = _tiny.params_vector(trainer.model)
    trainer.run()
    assert not torch.equal(before, _tiny.params_vector(trainer.model))
    for row in read_metrics(tmp_path / "run"):
        assert row["update/skipped_nonfinite"] == 0 and math.isfinite(row["update/loss"])
        assert 0 < row["select/fraction"] <= 0.3 + 2 / row["response/tokens"] + 1e-9
        if case in ("clip-cov", "kl-cov"):  # at most max(1, int(0.1 N)) tokens a mini-batch
            assert 0 < row["update/picked_fraction"] <= 0.1 + 2 / row["response/tokens"], case
        else:
            assert "update/picked_fraction" not in row


def test_reference_code_preset_trains_with_per_group_normalisation(tiny_dir, tmp_path):
    """The authors' normalisation (each question group on its own, summed) needs whole groups
    in a mini-batch, which the trainer's mini-batches are; population std from the rollout."""
    selection = gmts.SelectionConfig.preset("reference-code")
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        "algorithm=grpo",
        "rollout.advantage_std=population",
        *(
            f"selection.{k}={v}"
            for k, v in (
                ("scope", selection.scope),
                ("count", selection.count),
                ("ties", selection.ties),
                ("zero_scores", selection.zero_scores),
                ("omega_weighting", "true"),
                ("normalize", selection.normalize),
                ("kl_tokens", selection.kl_tokens),
            )
        ),
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    before = _tiny.params_vector(trainer.model)
    trainer.run()
    assert not torch.equal(before, _tiny.params_vector(trainer.model))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            ["objective.name=cispo", "objective.dual_clip=3.0"],
            r"'cispo' does not read \['dual_clip'\]",
        ),
        (["objective.name=gspo"], "unknown objective 'gspo'"),
        (["objective.name=gmpo", "objective.ratio_level=sequence"], "'gmpo' supports"),
        (["objective.name=dro"], "dro_beta"),
        (["objective.kl_estimator=k5"], "kl_estimator"),
        (["selection.count=quantile", "selection.scope=group"], "scope='batch'"),
        (["rollout.advantage_std=sample"], "advantage_std"),
    ],
)
def test_a_mistaken_objective_is_named_before_any_model_loads(tmp_path, overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [f"logging.output_dir={tmp_path}", *overrides])
