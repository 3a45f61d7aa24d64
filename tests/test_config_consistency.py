"""The paper's settings are written in three dialects (configs/<model>/ for the standalone
trainer, configs/trl/, configs/verl/); they must agree.

For every TRL and verl config, the values the paper fixes (learning rate, clip range, KL weight,
prompt and response lengths, questions per batch and per optimizer step, answers per question,
temperature, the selection ratio) are derived from the standalone config of the same model and
algorithm (its ``base.yaml`` through the GMTS variant) and compared.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gmts.train.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
STANDALONE_DIR = {  # engine config prefix -> standalone folder
    "qwen2.5-math-1.5b": "qwen2.5-math-1.5b",
    "qwen2.5-math-7b": "qwen2.5-math-7b",
    "qwen2.5-coder-7b": "qwen2.5-coder-7b",
    "csqa-qwen2.5-7b": "qwen2.5-7b-commonsense",
    "qwen3-8b": "qwen3-8b",
}


def _standalone(engine_config: Path):
    """The standalone TrainConfig of the same model and algorithm (the GMTS variant)."""
    stem = engine_config.stem  # e.g. qwen2.5-math-1.5b-dapo-gmts
    for prefix, folder in STANDALONE_DIR.items():
        if stem.startswith(prefix + "-"):
            variant = stem[len(prefix) + 1 :]  # dapo-gmts
            return load_config(CONFIGS / folder / f"{variant}.yaml")
    raise AssertionError(f"{engine_config.name}: no standalone config mapped")


def _paper_values(cfg) -> dict[str, object]:
    r, o = cfg.rollout, cfg.optim
    return {
        "lr": o.lr,
        "clip_low": cfg.objective.clip_low,
        "clip_high": cfg.objective.clip_high,
        "kl_coef": cfg.objective.kl_coef,
        "max_response_length": r.max_response_length,
        "questions_per_batch": r.questions_per_batch,
        "mini_batch_questions": cfg.mini_batch_questions,
        "group_size": r.group_size,
        "temperature": r.temperature,
        "ratio": cfg.selection.ratio,
        "score": cfg.selection.score,
    }


def _verl_values(path: Path) -> tuple[dict[str, object], dict[str, str]]:
    from gmts.integrations.verl.__main__ import _load_config

    gmts, overrides = _load_config(str(path))
    o = dict(item.split("=", 1) for item in overrides)
    actor = "actor_rollout_ref.actor."
    kl_on = o.get(actor + "use_kl_loss", "false").lower() == "true"
    values = {
        "lr": float(o[actor + "optim.lr"]),
        "clip_low": float(o[actor + "clip_ratio_low"]),
        "clip_high": float(o[actor + "clip_ratio_high"]),
        "kl_coef": float(o[actor + "kl_loss_coef"]) if kl_on else 0.0,
        "max_response_length": int(o["data.max_response_length"]),
        "questions_per_batch": int(o["data.train_batch_size"]),
        "mini_batch_questions": int(o[actor + "ppo_mini_batch_size"]),
        "group_size": int(o["actor_rollout_ref.rollout.n"]),
        "temperature": float(o["actor_rollout_ref.rollout.temperature"]),
        "ratio": float(gmts["ratio"]),
        "score": gmts["score"],
    }
    return values, o


VERL = sorted((CONFIGS / "verl").glob("*.yaml"))
TRL = sorted((CONFIGS / "trl").glob("*.yaml"))


@pytest.mark.parametrize("path", VERL, ids=[p.stem for p in VERL])
def test_verl_config_agrees_with_the_standalone_config(path):
    cfg = _standalone(path)
    values, overrides = _verl_values(path)
    assert values == _paper_values(cfg)
    assert int(overrides["data.max_prompt_length"]) == cfg.rollout.max_prompt_length
    assert overrides["algorithm.adv_estimator"] == "grpo"  # GRPO and DAPO both group-normalise


@pytest.mark.parametrize("path", TRL, ids=[p.stem for p in TRL])
def test_trl_config_agrees_with_the_standalone_and_verl_configs(path):
    cfg = _standalone(path)
    t = yaml.safe_load(path.read_text())
    verl_path = CONFIGS / "verl" / path.name
    _, verl_overrides = _verl_values(verl_path)
    processes = int(verl_overrides["trainer.n_gpus_per_node"]) * int(
        verl_overrides["trainer.nnodes"]
    )
    answers_per_step = t["per_device_train_batch_size"] * t["gradient_accumulation_steps"]
    answers_per_generation = t["per_device_train_batch_size"] * t["steps_per_generation"]
    values = {
        "lr": float(t["learning_rate"]),
        "clip_low": float(t["epsilon"]),
        "clip_high": float(t["epsilon_high"]),
        "kl_coef": float(t["beta"]),
        "max_response_length": int(t["max_completion_length"]),
        "questions_per_batch": answers_per_generation * processes // t["num_generations"],
        "mini_batch_questions": answers_per_step * processes // t["num_generations"],
        "group_size": int(t["num_generations"]),
        "temperature": float(t["temperature"]),
        "ratio": float(t["gmts_ratio"]),
        "score": t["gmts_score"],
    }
    assert values == _paper_values(cfg)
    if "max_prompt_length" in t:
        assert int(t["max_prompt_length"]) == cfg.rollout.max_prompt_length


def test_every_engine_config_has_a_counterpart():
    assert {p.name for p in TRL} == {p.name for p in VERL}
    for path in TRL + VERL:
        _standalone(path)  # raises if unmapped
