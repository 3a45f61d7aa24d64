"""LoRA in the standalone trainer (``model.lora``): what trains and in what dtype, the reference
without a second copy, adapter checkpoints that every reader loads as base + adapters, a
bit-exact resume, merged weights for an inference engine, clear errors before any weight is
read, and a run of the embedded task that learns."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch

from gmts.cli import main
from gmts.models.loading import load_model, resolve_model_path
from gmts.models.lora import LoraConfig, add_adapters, check_targets, merged_weights
from gmts.train import checkpoint as ckpt
from gmts.train.metrics_log import TIMING_KEYS, read_metrics
from gmts.train.trainer import Trainer, train

from file_modules import load_module

pytest.importorskip("peft")

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")
LORA = ("model.lora.rank=4", "model.lora.alpha=8")
COMPUTE = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.fixture
def one_process_group():
    """FSDP in this process creates a one-process group; leave none behind."""
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _config(tiny_dir: Path, run: Path, *overrides: str):
    return _tiny.small_config(tiny_dir, run, *LORA, *overrides)


def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_metrics(run)]


# --------------------------------------------------------------------------- what trains


@pytest.mark.parametrize("strategy", ["replicate", "fsdp"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_only_the_adapters_train_as_float32_masters_over_a_frozen_base(
    tiny_dir, tmp_path, dtype, strategy, one_process_group
):
    cfg = _config(
        tiny_dir,
        tmp_path / "run",
        f"model.dtype={dtype}",
        f"distributed.strategy={strategy}",
        "algorithm=grpo",  # KL on: the reference is the base
        "checkpoint.save_final=true",
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    params = dict(trainer.model.named_parameters())
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    frozen = {n: p for n, p in params.items() if not p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(p.dtype == torch.float32 for p in trainable.values())  # master weights
    assert all(p.dtype == COMPUTE[dtype] for p in frozen.values())  # 2 bytes/param in bf16
    # every linear layer but the tied head (all-linear): peft's own placement on the meta
    # device (what the memory plan counts) and a count by hand
    from transformers import AutoConfig

    expected = check_targets(AutoConfig.from_pretrained(tiny_dir), cfg.model.lora)
    # rank 4 x 2 layers x (in + out) of c_attn, attn.c_proj, c_fc, mlp.c_proj
    by_hand = 4 * 2 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert sum(p.numel() for p in trainable.values()) == expected == by_hand
    # the optimizer holds exactly the adapters
    held = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert len(held) == len(trainable)
    assert {id(p) for p in held} == {id(p) for p in trainable.values()}
    base_before = {n: p.detach().clone() for n, p in frozen.items()}
    adapters_before = _adapters(trainer.model)
    trainer.run()
    rows = read_metrics(tmp_path / "run")
    assert all(r["update/skipped_nonfinite"] == 0 for r in rows)
    assert rows[-1]["update/kl_mean"] > 0  # the adapters moved the policy from the base
    for name, p in trainer.model.named_parameters():
        if name in base_before:
            assert torch.equal(p.detach(), base_before[name]), name
    assert any(
        not torch.equal(p.detach(), adapters_before[n])
        for n, p in trainer.model.named_parameters()
        if n in adapters_before
    )
    state = trainer.optimizer.state
    assert len(state) == len(trainable)  # AdamW state for the adapters only, float32
    assert all(s["exp_avg"].dtype == torch.float32 for s in state.values())

    # the weights an inference engine would get, taken where sampling runs (replicate: inside
    # its bf16 autocast region; fsdp: the layers gathered), against the checkpoint loaded as
    # base + adapters merged
    with trainer.strategy.sampling(trainer.model):
        synced = {n: t.detach().cpu().clone() for n, t in merged_weights(trainer.model)}
    folder = ckpt.latest_checkpoint(tmp_path / "run") / "model"
    merged = dict(load_model(folder, dtype=COMPUTE[dtype], training=False).named_parameters())
    assert list(synced) == list(merged)
    # exact, but for fsdp's bf16 gather of the adapters (its compute copy) before the merge
    exact = dtype == "float32" or strategy == "replicate"
    for name, tensor in merged.items():
        assert synced[name].dtype == tensor.dtype
        torch.testing.assert_close(
            synced[name], tensor, rtol=0 if exact else 1.6e-2, atol=0 if exact else 1e-3
        )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_logprobs_are_those_of_a_frozen_copy_of_the_base(tiny_dir, tmp_path, dtype):
    cfg = _config(tiny_dir, tmp_path / "run", "algorithm=grpo", f"model.dtype={dtype}")
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    trainer.run()  # two steps: lora_B is no longer 0, the adapters change the function
    batch = trainer.collect(5).batch
    micro = 8
    reference = trainer.scorer.no_grad(trainer.ref_model, batch, micro_batch_size=micro)
    base = load_model(tiny_dir, dtype=COMPUTE[dtype], training=False).requires_grad_(False)
    base = base.to(trainer.device)
    expected = trainer.scorer.no_grad(base, batch, micro_batch_size=micro)
    assert torch.equal(reference.logprobs, expected.logprobs)
    assert torch.equal(reference.entropy, expected.entropy)
    policy = trainer.scorer.no_grad(trainer.model, batch, micro_batch_size=micro)
    mask = batch.response_mask
    assert (policy.logprobs - reference.logprobs)[mask].abs().max() > 1e-4  # adapters back on


# --------------------------------------------------------------------------- merged weights


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merged_weights_equal_peft_merge_and_unload(arch, dtype):
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    base = build_tiny_model(
        tokenizer, TinyModelConfig(architecture=arch, hidden_size=32, num_heads=2)
    ).to(dtype)
    model = add_adapters(base, LoraConfig(rank=4, alpha=8))
    g = torch.Generator().manual_seed(0)
    for name, p in model.named_parameters():
        if ".lora_B." in name:  # nonzero, so the merge changes the weights
            p.data = 0.1 * torch.randn(p.shape, generator=g)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    reference = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    streamed = list(merged_weights(model))
    assert [n for n, _ in streamed] == list(reference)  # the base model's own names, in order
    own = {id(p) for p in model.parameters()}
    changed = 0
    for name, tensor in streamed:
        assert tensor.dtype == dtype
        assert torch.equal(tensor, reference[name]), name
        changed += id(tensor) not in own  # everything but a merged weight is handed out as is
    # every linear layer but the tied head, in both layers: GPT-2's c_attn, c_proj, c_fc,
    # mlp.c_proj; Qwen2's q, k, v, o, gate, up, down
    assert changed == {"gpt2": 2 * 4, "qwen2": 2 * 7}[arch]
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # untouched
    plain = build_tiny_model(tokenizer, TinyModelConfig(architecture=arch, hidden_size=32))
    assert [(n, id(t)) for n, t in merged_weights(plain)] == [
        (n, id(p)) for n, p in plain.named_parameters()
    ]  # full fine-tuning: the parameters themselves


def test_sampling_a_peft_model_passes_the_wrapped_models_arguments():
    """The sampler reads the forward signature of the model inside the peft wrapper (whose own
    forward takes ``**kwargs``): the cache under its current name, ``logits_to_keep``; a fresh
    LoRA model (lora_B = 0) samples exactly what its base samples."""
    import warnings

    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer
    from gmts.sampling.rollout import _forward_parameters, generate_rollouts

    tokenizer = build_char_tokenizer()
    base = build_tiny_model(tokenizer, TinyModelConfig(hidden_size=32, num_heads=2)).eval()
    adapted = add_adapters(copy.deepcopy(base), LoraConfig(rank=4)).eval()
    assert "logits_to_keep" in _forward_parameters(adapted)
    assert "logits_to_keep" not in __import__("inspect").signature(adapted.forward).parameters
    prompts = ["7=", "12+5=", "123+456="]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        rollout = generate_rollouts(
            adapted, tokenizer, prompts, num_samples=2, max_new_tokens=5, seed=1
        )
    expected = generate_rollouts(base, tokenizer, prompts, num_samples=2, max_new_tokens=5, seed=1)
    assert torch.equal(rollout.response_ids, expected.response_ids)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoints_hold_the_adapters_and_every_reader_loads_base_plus_adapters(
    tiny_dir, tmp_path, capsys
):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    trainer = Trainer(
        _config(tiny_dir, run, "checkpoint.save_final=true"), reward_fn=_tiny.partial_credit
    )
    trainer.run()
    folder = ckpt.latest_checkpoint(run) / "model"
    files = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert "config.json" not in files and "model.safetensors" not in files  # no model copy
    saved = load_file(folder / "adapter_model.safetensors")
    adapters = _adapters(trainer.model)
    assert sum(t.numel() for t in saved.values()) == sum(t.numel() for t in adapters.values())
    assert all(t.dtype == torch.float32 for t in saved.values())

    # resolve_model_path -> the adapter folder; load_model -> base + adapters merged
    assert resolve_model_path(run) == str(folder)
    merged = load_model(folder, training=False)
    assert type(merged).__name__ == "GPT2LMHeadModel"
    assert all(p.requires_grad for p in merged.parameters())  # a plain model, as loaded
    expected = {name: t.cpu() for name, t in merged_weights(trainer.model)}
    got = dict(merged.named_parameters())
    assert list(got) == list(expected)
    assert all(torch.equal(got[n], expected[n]) for n in got)
    batch = trainer.collect(3).batch
    policy = trainer.scorer.no_grad(trainer.model, batch, micro_batch_size=8).logprobs
    loaded = trainer.scorer.no_grad(merged.to(trainer.device), batch, micro_batch_size=8)
    loaded = loaded.logprobs
    assert torch.allclose(policy, loaded, atol=1e-5, rtol=0)  # W x + B A x vs (W + B A) x

    # gmts eval's HF backend, gmts plan and the context guard read the run like any model
    from gmts.eval.backends import BackendOptions, make_backend
    from gmts.models.context import read_limit

    sampler = make_backend("hf", BackendOptions(model_path=run, device="cpu", dtype="float32"))
    assert torch.equal(
        dict(sampler.model.named_parameters())["transformer.wte.weight"],
        got["transformer.wte.weight"].cpu(),
    )
    assert read_limit(str(folder)).positions == 64
    # the vllm backend needs a whole model: a clear error (gmts eval: before loading anything)
    from gmts.eval.backends import check_whole_model

    with pytest.raises(ValueError, match="holds LoRA adapters, not a whole model.*gmts export"):
        check_whole_model(run, "the vllm backend")
    assert main(["eval", "--model", str(run), "--backend", "vllm"]) == 2
    assert "gmts export" in capsys.readouterr().err
    assert main(["plan", f"model.path={run}", *LORA]) == 0
    out = capsys.readouterr().out
    assert "memory plan" in out and "LoRA rank 4" in out
    assert "full fine-tuning (model.lora=null) would peak at" in out and "LoRA saves" in out
    analysis = tmp_path / "analysis"
    args = ["--questions", "2", "--samples", "2", "--out", str(analysis), "--device", "cpu"]
    assert main(["analyze", "--run", str(run), *args]) == 0
    report = json.loads((analysis / "report.json").read_text())
    assert report["meta"]["model"] == str(folder) and report["meta"]["answers"] == 4

    # gmts export: the adapters merged into a bf16 Hugging Face folder
    out = tmp_path / "exported"
    assert main(["export", str(run), str(out)]) == 0
    assert "merged" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert exported.dtype == torch.bfloat16
    bf16 = dict(load_model(folder, dtype=torch.bfloat16, training=False).named_parameters())
    assert all(torch.equal(p, bf16[n]) for n, p in exported.named_parameters())
    assert (out / "tokenizer.json").is_file()


def test_resume_continues_bit_exactly(tiny_dir, tmp_path):
    settings = (
        "optim.steps=4",
        "optim.mini_batch_questions=2",
        "optim.epochs=2",
        "optim.schedule=cosine",
        "optim.warmup_steps=2",
        "model.lora.dropout=0.1",  # the dropout masks' RNG must come back too
        "checkpoint.every=1",
        "checkpoint.keep=2",
        "checkpoint.save_final=true",
    )
    straight = tmp_path / "straight"
    train(_config(tiny_dir, straight, *settings), reward_fn=_tiny.partial_credit)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000004")
    trainer = Trainer(
        _config(tiny_dir, resumed, *settings), resume=True, reward_fn=_tiny.partial_credit
    )
    assert trainer.step == 3
    trainer.run()
    assert _rows(resumed) == _rows(straight)
    from safetensors.torch import load_file

    def final(run: Path) -> dict[str, torch.Tensor]:
        return load_file(ckpt.latest_checkpoint(run) / "model" / "adapter_model.safetensors")

    a, b = final(straight), final(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_with_other_lora_settings_is_refused(tiny_dir, tmp_path):
    run = tmp_path / "run"
    train(_config(tiny_dir, run, "checkpoint.save_final=true"), reward_fn=_tiny.partial_credit)
    with pytest.raises(ValueError, match=r"differs .* in model.lora.rank \(4 -> 8\)"):
        Trainer(_config(tiny_dir, run, "model.lora.rank=8"), resume=True)
    # past the config comparison (--allow-config-change), the checkpoint itself refuses
    with pytest.raises(ValueError, match="r=4.*8; resume with the same model.lora"):
        Trainer(_config(tiny_dir, run, "model.lora.rank=8"), resume=True, allow_config_change=True)
    full = _tiny.small_config(tiny_dir, run)  # model.lora: null
    with pytest.raises(ValueError, match="holds LoRA adapters, but model.lora is null"):
        Trainer(full, resume=True, allow_config_change=True)


# --------------------------------------------------------------------------- bad configs


def test_unknown_target_module_fails_before_any_weight_is_read(tiny_dir, tmp_path, monkeypatch):
    import gmts.train.policy as policy

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr(policy, "load_model", no_weights)
    cfg = _config(tiny_dir, tmp_path / "run", "model.lora.target_modules=[q_proj, c_attn]")
    message = (
        r"model.lora.target_modules: \['q_proj'\] match no module of GPT2LMHeadModel; its "
        r"linear layers are \['c_attn', 'c_fc', 'c_proj', 'lm_head'\]"
    )
    with pytest.raises(ValueError, match=message):
        Trainer(cfg, reward_fn=_tiny.partial_credit)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.lora.rank=0", "model.lora.rank: must be an integer >= 1, got 0"),
        ("model.lora.rank=-2", "model.lora.rank: must be an integer >= 1, got -2"),
        ("model.lora.alpha=0", "model.lora.alpha: must be > 0"),
        ("model.lora.dropout=1.0", "model.lora.dropout: must be in [0, 1)"),
        ("model.lora.target_modules=q_proj", "expected 'all-linear' or a list of module names"),
        ("model.lora.target_modules=[]", "expected a non-empty list of module names"),
    ],
)
def test_bad_lora_values_are_config_errors(tiny_dir, tmp_path, capsys, override, message):
    code = main(["train", f"model.path={tiny_dir}", f"logging.output_dir={tmp_path}", override])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_plan_refuses_an_unknown_target_module(tiny_dir, capsys):
    assert main(["plan", f"model.path={tiny_dir}", "model.lora.target_modules=[q_proj]"]) == 2
    assert "['q_proj'] match no module of GPT2LMHeadModel" in capsys.readouterr().err


# --------------------------------------------------------------------------- it learns


@pytest.mark.slow
def test_a_lora_run_of_the_embedded_task_learns(tmp_path):
    """The demo recipe (embedded warm start, addition, DAPO + GMTS 20%) with rank-8 adapters at
    lr 1e-3 (LoRA wants a larger step than full fine-tuning's 2e-4): 30 steps.

    Measured (2-core machine, 1 thread): held-out average@16 0.091 -> 0.391, batch reward of
    the first 10 steps 0.124, of the last 10 0.346. Criterion, half of those gains: average@16
    up by at least 0.15 and the last 10 steps' reward above the first 10's by at least 0.1.
    """
    from gmts.train.config import load_config

    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(
        repo / "configs" / "demo.yaml",
        [
            "model.lora.rank=8",
            "optim.lr=1e-3",
            "optim.steps=30",
            "data.eval_every=0",
            "data.eval_questions=100",
            "logging.progress=false",
            f"logging.output_dir={tmp_path / 'run'}",
        ],
    )
    result = train(cfg)
    before, after = result.eval_before["average@16"], result.eval_after["average@16"]
    first = sum(r["reward/mean"] for r in result.history[:10]) / 10
    last = sum(r["reward/mean"] for r in result.history[-10:]) / 10
    assert after >= before + 0.15, (before, after)
    assert last >= first + 0.1, (first, last)
