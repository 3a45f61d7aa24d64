"""The verl launcher's command line and the settings' environment encoding (no verl needed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gmts.core import SelectionConfig, available_scores
from gmts.integrations.verl.__main__ import build_command, keys_help, main
from gmts.integrations.verl.settings import ENV_VAR, GMTSVerlSettings, verl_keys

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "verl").glob("*.yaml"))
RUNTIME_KEY = f"+ray_kwargs.ray_init.runtime_env.env_vars.{ENV_VAR}="


def test_env_round_trip_in_both_encodings():
    settings = GMTSVerlSettings(
        selection=SelectionConfig(score="entropy", ratio=0.1, largest=False, kl_tokens="all"),
        score_inputs="current",
    )
    for encoded in (False, True):
        value = settings.to_env_value(encoded=encoded)
        assert GMTSVerlSettings.from_env({ENV_VAR: value}) == settings
    encoded = settings.to_env_value(encoded=True)
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert GMTSVerlSettings.from_env({}) is None
    with pytest.raises(ValueError, match=ENV_VAR):
        GMTSVerlSettings.from_env({ENV_VAR: "{not json"})
    with pytest.raises(ValueError, match="unknown gmts settings"):
        GMTSVerlSettings.from_dict({"ratio": 0.2, "rato": 0.3})


def test_command_line_gmts_items_become_settings_and_runtime_env():
    settings, entry, overrides, dry = build_command(
        [
            "gmts.score=entropy",
            "gmts.ratio=0.2",
            "gmts.largest=false",
            "algorithm.adv_estimator=grpo",
            "--dry-run",
        ]
    )
    assert settings.selection == SelectionConfig(score="entropy", ratio=0.2, largest=False)
    assert entry == "verl.trainer.main_ppo" and dry
    assert overrides[0] == "algorithm.adv_estimator=grpo"
    forwarded = [o for o in overrides if o.startswith(RUNTIME_KEY)]
    assert len(forwarded) == 1
    value = forwarded[0][len(RUNTIME_KEY) :]
    assert GMTSVerlSettings.from_env({ENV_VAR: value}) == settings


def test_preset_and_bad_values():
    # the authors' code normalises each question group on its own: groups are not whole on a
    # verl rank, so the preset is refused with the reason
    with pytest.raises(ValueError, match="per-group"):
        build_command(["gmts.preset=reference-code", "gmts.score=entropy"])
    # TRL's unit (each micro-batch) cannot be expressed in verl: a clear error
    with pytest.raises(ValueError, match="unit='micro-batch'"):
        build_command(["gmts.preset=trl", "gmts.score=entropy"])
    with pytest.raises(ValueError, match="gmts.ratio"):
        build_command(["gmts.ratio=lots"])
    # normalize=selected is eq. 2 whatever verl's aggregation (the core's rule)
    build_command(["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"])
    with pytest.raises(ValueError, match="loss_agg_mode"):  # no core counterpart
        build_command(["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"])
    build_command(["actor_rollout_ref.actor.policy_loss.loss_mode=gpg"])  # omega of gpg: w A
    # clip_cov / kl_cov: the core's clip-cov / kl-cov (equal to verl's functions), with GMTS too
    for mode in ("clip_cov", "kl_cov"):
        build_command([f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}"])
        build_command(
            [f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}", "gmts.score=entropy"]
        )
    dro = "actor_rollout_ref.actor.policy_loss.loss_mode=dro"
    with pytest.raises(ValueError, match="dro_beta"):
        build_command([dro])
    build_command([dro, "+actor_rollout_ref.actor.policy_loss.dro_beta=0.1"])  # nested, parsed
    bypass = [
        "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode",
        "+actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is_batch_normalize=true",
    ]
    with pytest.raises(ValueError, match="mean 1 over each micro-batch"):
        build_command(bypass)
    build_command([*bypass, "gmts.score=entropy"])
    with pytest.raises(ValueError, match="full next-token distributions"):
        build_command(
            [
                "actor_rollout_ref.actor.use_kl_loss=true",
                "actor_rollout_ref.actor.kl_loss_type=full",
            ]
        )
    assert main(["gmts.ratio=2.0", "--dry-run"]) == 2


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_shipped_configs_parse_and_command_line_wins(config):
    settings, _, overrides, _ = build_command(
        ["--config", str(config), "actor_rollout_ref.actor.optim.lr=1e-7", "gmts.ratio=0.5"]
    )
    assert settings.selection.ratio == 0.5
    lr = [o for o in overrides if o.startswith("actor_rollout_ref.actor.optim.lr=")]
    assert lr == ["actor_rollout_ref.actor.optim.lr=1e-7"]
    keys = [o.split("=", 1)[0] for o in overrides]
    assert len(keys) == len(set(keys)), "duplicate Hydra overrides"
    assert any(o.startswith(RUNTIME_KEY) for o in overrides)


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_shipped_configs_choose_verls_trainer_explicitly(config):
    """verl 0.9 defaults to the V1 trainer; each config says so itself, and DAPO configs name
    their group-filter metric (V1 requires one)."""
    _, _, overrides, _ = build_command(["--config", str(config)])
    assert "trainer.use_v1=true" in overrides
    if "dapo" in config.stem:
        assert "algorithm.filter_groups.enable=true" in overrides
        assert "algorithm.filter_groups.metric=reward" in overrides


def test_configs_exist_for_every_paper_setting():
    names = {c.stem for c in CONFIGS}
    for stem in ("qwen2.5-math-1.5b", "qwen2.5-math-7b", "qwen3-8b", "qwen2.5-coder", "csqa"):
        assert any(name.startswith(stem) for name in names), stem


@pytest.mark.slow
def test_dry_run_from_the_command_line_imports_neither_verl_nor_trl():
    code = (
        "import sys\n"
        "import gmts.integrations, gmts.integrations.verl.plugin\n"
        "from gmts.integrations.verl.__main__ import main\n"
        "rc = main(['--dry-run', 'gmts.score=gmts', 'x.y=1'])\n"
        "heavy = sorted(m for m in ('verl', 'trl', 'ray', 'transformers') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(f"{ENV_VAR}=")
    assert "-m verl.trainer.main_ppo x.y=1" in lines[1]
    assert lines[-1] == "HEAVY []"


def test_help_lists_every_key_and_score_whole():
    """--help's epilog is generated: every gmts.* key, and each score's name unbroken (the
    wrap never splits at a hyphen, so logit-grad or a new score's name can be searched)."""
    text = keys_help()
    for item in verl_keys():
        assert f"  {item.key}=" in text
    words = set(re.findall(r"[\w-]+", text))
    for name in available_scores():
        assert name in words
    broken = [line for line in text.splitlines() if re.search(r"\w-$", line)]
    assert not broken  # mini-batch, seq-mean-token-mean, ... never cut at their hyphen
