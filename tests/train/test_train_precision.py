"""Mixed precision: bf16 compute over float32 master weights keeps the paper's tiny updates.

With bf16 parameters an AdamW update of ~1e-6 is far below half a bf16 ulp of a typical
weight and rounds away; with float32 master weights every element that has a gradient moves,
by about as much as in an all-float32 run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


def _update(tiny_dir: Path, run_dir: Path, dtype: str) -> tuple[torch.Tensor, Trainer]:
    """(after - before) of every master element over 3 steps at lr 1e-6 on the addition task."""
    cfg = _tiny.small_config(
        tiny_dir,
        run_dir,
        f"model.dtype={dtype}",
        "algorithm=grpo",
        "selection.score=none",
        "optim.lr=1e-6",
        "optim.steps=3",
        "optim.grad_clip=null",
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    before = _tiny.params_vector(trainer.model)
    trainer.run()
    return _tiny.params_vector(trainer.model) - before, trainer


def test_bf16_mixed_precision_moves_the_master_weights_like_float32(tmp_path):
    tiny_dir = _tiny.save_tiny_model(tmp_path / "model")
    delta32, _ = _update(tiny_dir, tmp_path / "fp32", "float32")
    delta16, trainer = _update(tiny_dir, tmp_path / "bf16", "bfloat16")
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    moved32 = (delta32 != 0).double().mean().item()
    moved16 = (delta16 != 0).double().mean().item()
    # every element with a gradient moves (unused token and position embeddings have none)
    assert moved32 > 0.85
    assert moved16 >= 0.98 * moved32
    ratio = (delta16.norm() / delta32.norm()).item()
    assert ratio == pytest.approx(1.0, abs=0.1)
    # the bf16 run did compute in bf16: its update is not the float32 one
    assert not torch.equal(delta16, delta32)


def test_bf16_parameters_would_lose_the_update():
    """The failure mode the master weights fix: AdamW at lr 1e-6 on bf16 weights of ~0.02."""
    weight = (0.02 * torch.randn(256, 256, generator=torch.Generator().manual_seed(0))).bfloat16()
    weight.requires_grad_(True)
    start = weight.detach().clone()
    opt = torch.optim.AdamW([weight], lr=1e-6, weight_decay=0.0)
    for i in range(5):
        weight.grad = torch.randn(weight.shape, generator=torch.Generator().manual_seed(i + 1)).to(
            weight.dtype
        )
        opt.step()
    unchanged = (weight.detach() == start).double().mean().item()
    assert unchanged > 0.9  # ~98% in the colleague's 1536x1536 measurement


def test_export_writes_a_bf16_copy_of_the_float32_checkpoint(tmp_path, capsys):
    """Checkpoints keep float32 master weights; `gmts export` writes the bf16 serving copy."""
    from transformers import AutoModelForCausalLM

    from gmts.cli import main
    from gmts.train.checkpoint import latest_checkpoint

    tiny_dir = _tiny.save_tiny_model(tmp_path / "model")
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        "model.dtype=bfloat16",
        "optim.steps=1",
        "checkpoint.save_final=true",
    )
    Trainer(cfg, reward_fn=_tiny.partial_credit).run()
    master = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / "run") / "model")
    assert {p.dtype for p in master.parameters()} == {torch.float32}
    out = tmp_path / "served"
    assert main(["export", str(tmp_path / "run"), str(out)]) == 0
    served = AutoModelForCausalLM.from_pretrained(out)
    assert {p.dtype for p in served.parameters()} == {torch.bfloat16}
    for a, b in zip(master.parameters(), served.parameters()):
        assert torch.equal(a.detach().bfloat16(), b.detach())
    assert (out / "tokenizer_config.json").is_file()
    assert main(["export", str(tmp_path / "run"), str(out)]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err


def test_cpu_bf16_support_reads_the_cpu_flags(tmp_path):
    from gmts.scale.auto_dtype import cpu_bf16_support

    cases = {
        "flags\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n": "amx_bf16",
        "flags\t: fpu avx2 avx512f avx512_bf16\nflags\t: fpu avx2 avx512f avx512_bf16\n": "avx512_bf16",
        "Features\t: fp asimd sve bf16 i8mm\n": "bf16",
        "flags\t: fpu fma avx f16c avx2\n": None,
    }
    for text, expected in cases.items():
        path = tmp_path / "cpuinfo"
        path.write_text("processor\t: 0\n" + text)
        assert cpu_bf16_support(path) == expected
    assert cpu_bf16_support(tmp_path / "missing") is None
