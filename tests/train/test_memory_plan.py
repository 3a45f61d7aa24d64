"""The memory plan: exact parameter counts from the config alone, strategy layouts, activation
costs measured on a narrow copy, and the refusal naming the knobs."""

from __future__ import annotations

import pytest

from gmts.scale.memory_plan import (
    GIB,
    MemoryPlanError,
    PlanSettings,
    check_fits_device,
    plan_memory,
)
from gmts.scale.model_cost import ModelShape, activation_cost


def _configs():
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    return {
        "gpt2": GPT2Config(n_embd=64, n_layer=3, n_head=4, n_positions=128, vocab_size=300),
        "llama": LlamaConfig(
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=300,
        ),
        "qwen2": Qwen2Config(
            hidden_size=96,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            vocab_size=300,
            tie_word_embeddings=True,
        ),
    }


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_shape_counts_the_parameters_of_the_real_model(name):
    from transformers import AutoModelForCausalLM

    config = _configs()[name]
    shape = ModelShape.from_config(config)
    model = AutoModelForCausalLM.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.layers == config.num_hidden_layers
    assert shape.root_params + shape.layers * shape.layer_params == shape.params


def test_activation_cost_scales_back_from_the_narrow_copy():
    """A config whose heads allow narrowing (k = 2) gives the same per-token bytes as
    measuring the full width directly (k = 1)."""
    from transformers import Qwen2Config

    wide = Qwen2Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    narrowed = activation_cost(wide, "float32")
    from gmts.scale import model_cost

    assert model_cost._narrow_config(wide, 1)[1] == 2  # the probe did narrow it
    unnarrowed = model_cost._activation_cost(wide.to_json_string(), "Qwen2Config", "float32", 1)
    assert narrowed.per_layer == pytest.approx(unnarrowed.per_layer, rel=0.02)
    assert narrowed.stream == 256 * 4
    bf16 = activation_cost(wide, "bf16-params")
    assert bf16.per_layer < 0.7 * narrowed.per_layer  # bf16 tensors are half the bytes


def test_layouts_checkpointing_and_refusal():
    config = _configs()["qwen2"]
    base = dict(
        world_size=4,
        dtype="bfloat16",
        micro_batch_size=2,
        prompt_length=64,
        response_length=192,
        generation_rows=8,
    )
    rep = plan_memory(config, PlanSettings(strategy="replicate", **base))
    fsdp = plan_memory(config, PlanSettings(strategy="fsdp", **base))
    p = rep.shape.params
    assert rep.phases["step"]["weights"] == 4 * p and rep.phases["step"]["optimizer"] == 8 * p
    assert fsdp.phases["step"]["weights"] == 4 * p / 4
    assert fsdp.phases["step"]["optimizer"] == 8 * p / 4
    assert fsdp.phases["rollout"]["sampling copy"] == 2 * p  # every layer gathered in bf16
    gc = plan_memory(config, PlanSettings(strategy="fsdp", gradient_checkpointing=True, **base))
    assert gc.phases["update"]["activations"] < fsdp.phases["update"]["activations"]
    assert "memory plan per rank (4 x fsdp" in fsdp.table()
    with pytest.raises(MemoryPlanError, match="optim.micro_batch_size.*generation_batch_size"):
        check_fits_device(fsdp, int(fsdp.peak / 2), "a small GPU")
    check_fits_device(fsdp, int(fsdp.peak * 2), "a big GPU")
    assert fsdp.peak < 100 * GIB


def test_plan_command_on_a_config(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    from gmts.cli import main

    spec = importlib.util.spec_from_file_location("_tiny", Path(__file__).with_name("_tiny.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    model_dir = tiny.save_tiny_model(tmp_path / "model")
    args = ["plan", f"model.path={model_dir}", "model.dtype=bfloat16", "--gpus", "2"]
    assert main([*args, "--gpu-gib", "1"]) == 0
    out = capsys.readouterr().out
    assert "memory plan per rank (2 x replicate, bfloat16" in out and "fits on a 1 GiB GPU" in out
    assert main([*args, "--gpu-gib", "0.0001"]) == 1
    assert "does not fit" in capsys.readouterr().out
    assert main(["plan", f"model.path={model_dir}", "--gpus", "3"]) == 2  # 32 questions / 3


@pytest.mark.slow
def test_docs_table_of_the_shipped_configs_is_current():
    """docs/training.md holds `gmts plan --shipped configs --markdown` (regenerate it there)."""
    from pathlib import Path

    from gmts.cli.plan import shipped_table

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "training.md").read_text()
    assert shipped_table(repo / "configs") in doc
