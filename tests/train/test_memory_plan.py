"""The memory plan: exact parameter counts from the config alone, strategy layouts, activation
costs measured on a narrow copy, and the refusal naming the knobs."""

from __future__ import annotations

import pytest
import torch

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
    from pathlib import Path

    from gmts.cli import main

    from file_modules import load_module

    tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")
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


# --------------------------------------------------------------------------- LoRA

LORA_ROWS = ("model.lora.rank=64",)
"""The overrides of docs/training.md's LoRA rows."""


def _linear_in_out(model) -> list[tuple[int, int]]:
    """(in, out) of every linear layer but the output head: what 'all-linear' adapts."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    sizes = []
    for module in model.modules():
        if module is head:
            continue
        if isinstance(module, torch.nn.Linear):
            sizes.append((module.in_features, module.out_features))
        elif isinstance(module, Conv1D):  # GPT-2 stores the weight as (in, out)
            sizes.append(tuple(module.weight.shape))
    return sizes


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_lora_shape_counts_the_adapters_exactly(name):
    """rank x (in + out) for every adapted linear layer, counted on the real model, equals the
    meta-device count; the base count is unchanged and the layers add up."""
    from transformers import AutoModelForCausalLM

    from gmts.models.lora import LoraConfig

    config = _configs()[name]
    shape = ModelShape.from_config(config, LoraConfig(rank=4))
    model = AutoModelForCausalLM.from_config(config)
    assert shape.adapter_params == 4 * sum(i + o for i, o in _linear_in_out(model))
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.trainable_params == shape.adapter_params and shape.frozen_params == shape.params
    assert shape.root_params + shape.layers * shape.layer_params == (
        shape.params + shape.adapter_params
    )
    # one named target: GPT-2's fused qkv (64 -> 3 x 64), the others' q_proj (hidden -> hidden)
    target, in_out = {"gpt2": ("c_attn", 64 + 3 * 64), "llama": ("q_proj", 2 * 64)}.get(
        name, ("q_proj", 2 * 96)
    )
    only_q = ModelShape.from_config(config, LoraConfig(rank=2, target_modules=(target,)))
    assert only_q.adapter_params == 2 * shape.layers * in_out


def test_lora_layouts_hold_the_adapters_as_masters_and_no_reference_copy():
    from gmts.models.lora import LoraConfig

    config = _configs()["qwen2"]
    base = dict(
        world_size=4,
        dtype="bfloat16",
        micro_batch_size=2,
        prompt_length=64,
        response_length=192,
        generation_rows=8,
    )
    lora = LoraConfig(rank=4)
    full = plan_memory(config, PlanSettings(strategy="replicate", reference=True, **base))
    rep = plan_memory(config, PlanSettings(strategy="replicate", lora=lora, **base))
    fsdp = plan_memory(config, PlanSettings(strategy="fsdp", lora=lora, **base))
    a, p = rep.shape.adapter_params, rep.shape.params
    step = rep.phases["step"]
    assert (step["weights"], step["gradients"], step["optimizer"]) == (4 * a, 4 * a, 8 * a)
    assert step["frozen weights"] == 2 * p  # the base in bf16
    assert "reference" in full.phases["step"] and "reference" not in step
    assert rep.peak < full.peak
    fstep = fsdp.phases["step"]
    assert (fstep["weights"], fstep["frozen weights"]) == (4 * a / 4, 2 * p / 4)
    assert fsdp.phases["rollout"]["sampling copy"] == 2 * (p + a)
    assert f"LoRA rank 4: {a / 1e6:.2f}M trainable" in rep.table()


def test_plan_settings_of_a_lora_config_keep_no_reference():
    from gmts.train.config import load_config

    cfg = load_config(None, ["algorithm=grpo", "model.lora.rank=8"])  # KL on
    settings = PlanSettings.from_config(cfg, world_size=1, prompt_length=8, response_length=8)
    assert settings.lora == cfg.model.lora and settings.reference is False
    full = load_config(None, ["algorithm=grpo"])
    assert PlanSettings.from_config(
        full, world_size=1, prompt_length=8, response_length=8
    ).reference


@pytest.mark.parametrize("mode", ["float32", "bf16-base"])
def test_lora_activation_cost_scales_back_from_the_narrow_copy(mode):
    """The rank-r tensors of the adapters are not width-dependent: probing ranks 1 and 2 on the
    narrow copy gives the full-width measurement at rank 8 (measured equal; scaling the rank-8
    probe by the width factor instead is 1.4% high here)."""
    import dataclasses

    from transformers import Qwen2Config

    from gmts.models.lora import LoraConfig
    from gmts.scale import model_cost

    wide = Qwen2Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    lora = LoraConfig(rank=8)
    fields = tuple(getattr(lora, f.name) for f in dataclasses.fields(lora))
    narrowed = activation_cost(wide, mode, lora)
    unnarrowed = model_cost._activation_cost(wide.to_json_string(), "Qwen2Config", mode, 1, fields)
    assert narrowed.per_layer == pytest.approx(unnarrowed.per_layer, rel=1e-6)
    assert narrowed.outside == pytest.approx(unnarrowed.outside, rel=1e-6)
    assert narrowed.kv_per_layer == unnarrowed.kv_per_layer
    full = activation_cost(wide, "float32")
    # rank 64 saves more per token than rank 8 (the adapters' A x)
    assert activation_cost(wide, mode, LoraConfig(rank=64)).per_layer > narrowed.per_layer
    if mode == "bf16-base":  # a bf16 base: the KV cache comes out bf16
        assert narrowed.kv_per_layer == full.kv_per_layer / 2


@pytest.mark.slow
def test_docs_lora_rows_of_the_shipped_configs_are_current():
    """docs/training.md holds `gmts plan --shipped configs --markdown model.lora.rank=64`."""
    from pathlib import Path

    from gmts.cli.plan import shipped_table

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "training.md").read_text()
    assert shipped_table(repo / "configs", overrides=LORA_ROWS) in doc


def test_plan_counts_auto_as_the_dtype_it_resolves_to(tmp_path, capsys):
    """``gmts plan`` plans for GPUs: auto is counted as bf16 and the plan is bf16's, said
    above the table; the trainer plans with the dtype it resolved (test_auto_dtype.py)."""
    from pathlib import Path

    from gmts.cli import main

    from file_modules import load_module

    tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")
    model_dir = tiny.save_tiny_model(tmp_path / "model")
    capsys.readouterr()
    tables = {}
    for dtype in ("auto", "bfloat16", "float32"):
        assert main(["plan", f"model.path={model_dir}", f"model.dtype={dtype}"]) == 0
        tables[dtype] = capsys.readouterr().out.splitlines()
    assert tables["auto"][1].startswith("model.dtype: auto, counted as bfloat16 (planned for GPUs")
    assert tables["auto"][2:] == tables["bfloat16"][1:]  # the same plan
    assert tables["auto"][2:] != tables["float32"][1:]
    assert not any("model.dtype: auto" in line for line in tables["bfloat16"])


@pytest.mark.parametrize(
    "m, G, u",
    [(24, 8, 3), (4, 8, 1), (3, 8, 2), (5, 2, 3), (8, 8, 1), (6, 1, 6), (6, 4, 2), (5, 3, 3)],
)
def test_grouped_forward_shape_is_the_worst_bucket_plan(m, G, u):
    """At the budget's worst case (every prompt P, every response T tokens) the plan's grouped
    shape is what forward_plan builds for the worst micro-batch of group-contiguous rows:
    u distinct prompts, u x P + m x (T - 1) positions, against the padded m x (P + T)."""
    from gmts.scale.memory_plan import forward_shape
    from gmts.train.forward_plan import plan_forward
    from gmts.train.scoring import micro_slices

    P, T, questions = 5, 7, 6
    B = questions * G
    prompt_ids = torch.arange(B).div(G, rounding_mode="floor")[:, None].repeat(1, P) + 10
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    response_mask = torch.ones(B, T, dtype=torch.long)
    worst = max(
        plan_forward(prompt_ids[s], prompt_mask[s], response_mask[s]).positions.computed
        for s in micro_slices(B, m)
    )
    distinct = max(len(set(prompt_ids[s, 0].tolist())) for s in micro_slices(B, m))
    base = dict(world_size=1, strategy="replicate", dtype="float32", generation_rows=B)
    settings = dict(micro_batch_size=m, prompt_length=P, response_length=T, group_size=G)
    grouped = forward_shape(PlanSettings(forward_layout="grouped", **base, **settings))
    padded = forward_shape(PlanSettings(forward_layout="padded", **base, **settings))
    assert grouped.prompts == distinct == u
    assert grouped.positions == worst == u * P + m * (T - 1)
    assert grouped.prefix == m * P and grouped.cached == (u + m) * P
    assert padded.positions == m * (P + T) and padded.prefix == padded.cached == 0
    assert grouped.logit_rows == m * T + u and padded.logit_rows == m * (T + 1)


def _smollm2_like(layers: int = 4):
    from transformers import Qwen2Config

    return Qwen2Config(  # SmolLM2-135M's widths (30 layers); the plan never builds the model
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    )


def test_grouped_activations_are_the_padded_ones_per_position_plus_the_prefix():
    """Without checkpointing the update keeps per_layer bytes per computed position and, per
    row, its prompt's keys and values as attention saved them; so grouped / padded is the
    positions' ratio up to that prefix term, and the prefix per position is at least the
    keys and values repeated to every query head (9 / 3 here) in float32."""
    from gmts.scale.memory_plan import forward_shape

    config = _smollm2_like()
    act = activation_cost(config, "float32")
    assert act.prefix_per_layer >= 2 * 9 * 64 * 4  # K and V, 9 query heads, float32
    assert act.prefix_per_layer < 1.05 * 2 * 9 * 64 * 4  # + the probe's mask rows
    base = dict(
        world_size=1,
        strategy="replicate",
        dtype="float32",
        micro_batch_size=24,
        mini_batch_rows=24,
        prompt_length=96,
        response_length=64,
        generation_rows=24,
        group_size=8,
    )
    plans = {
        layout: plan_memory(config, PlanSettings(forward_layout=layout, **base))
        for layout in ("grouped", "padded")
    }
    kept = {k: p.phases["update"]["activations"] for k, p in plans.items()}
    g = forward_shape(plans["grouped"].settings)
    per_position = 4 * act.per_layer + act.outside
    assert kept["padded"] == 24 * 160 * per_position
    assert kept["grouped"] == pytest.approx(
        (3 * 96 + 24 * 63) * per_position + g.prefix * 4 * act.prefix_per_layer
    )
    assert kept["grouped"] < 0.6 * kept["padded"]  # 1,800 of 3,840 positions + the prefix
    # no grad: the grouped layout holds its prompts' keys and values (store + per-row prefix)
    scoring = plans["grouped"].phases["scoring"]
    assert scoring["KV cache"] == (3 + 24) * 96 * 4 * act.kv_per_layer
    assert "KV cache" not in plans["padded"].phases["scoring"]


def test_checkpointed_bf16_update_keeps_the_output_cast_and_no_gradients_yet():
    """replicate + bf16 autocast + checkpointing, one micro-batch per mini-batch: at the
    logits' backward the checkpointed layers' weight casts are gone (only the output
    projection's cast and one recomputed layer's remain) and no gradient exists yet (the
    trainer sets them to None before each mini-batch); with two micro-batches the first
    one's gradients are alive in the second."""
    config = _smollm2_like(30)
    base = dict(
        world_size=1,
        strategy="replicate",
        dtype="bfloat16",
        micro_batch_size=24,
        prompt_length=96,
        response_length=64,
        generation_rows=24,
        group_size=8,
        gradient_checkpointing=True,
    )
    one = plan_memory(config, PlanSettings(mini_batch_rows=24, **base))
    two = plan_memory(config, PlanSettings(mini_batch_rows=48, **base))
    shape = one.shape
    update = one.phases["update"]
    assert update["compute copy"] == (49152 * 576 + shape.layer_params) * 2
    assert update["compute copy"] < 0.5 * 2 * shape.params  # the whole cast: what it counted
    assert update["gradients"] < 4 * shape.params  # none, or the root's during the backward
    assert two.phases["update"]["gradients"] == 4 * shape.params
    assert two.peak > one.peak


def test_padded_log_prob_block_is_a_copy_of_the_sliced_logits():
    """logits[:, :-1] of the padded layout: a block of several whole rows is a copy in the
    logits' dtype on top of the 2 float32 scratch blocks; the grouped layout's contiguous
    logits are viewed."""
    from gmts.core.logprobs import default_chunk_size
    from gmts.scale.memory_plan import _logit_blocks, forward_shape

    V, T = 49152, 64
    n = T * (default_chunk_size(V) // T)  # whole rows per block
    base = dict(
        world_size=1,
        strategy="replicate",
        dtype="float32",
        micro_batch_size=24,
        prompt_length=96,
        response_length=T,
        generation_rows=24,
        group_size=8,
    )
    padded = PlanSettings(forward_layout="padded", **base)
    grouped = PlanSettings(forward_layout="grouped", **base)
    assert _logit_blocks(padded, forward_shape(padded), V, 4) == 3 * n * V * 4
    n_grouped = (T - 1) * (default_chunk_size(V) // (T - 1))
    assert _logit_blocks(grouped, forward_shape(grouped), V, 4) == 2 * n_grouped * V * 4


def test_plan_settings_carry_the_forward_layout_and_mini_batch(tmp_path):
    from gmts.train.config import load_config

    cfg = load_config(
        None,
        [
            "rollout.questions_per_batch=4",
            "rollout.group_size=8",
            "optim.mini_batch_questions=2",
            "model.forward_layout=padded",
        ],
    )
    s = PlanSettings.from_config(cfg, world_size=2, prompt_length=8, response_length=8)
    assert (s.forward_layout, s.group_size, s.mini_batch_rows) == ("padded", 8, 8)
