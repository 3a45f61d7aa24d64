"""``optim.adamw``: which of torch's AdamW implementations the trainer builds, and that the
choice changes the update only by float rounding, across a checkpoint and a resume.

``auto`` takes torch's fused kernel for plain float tensors on a CPU or GPU (faster than
torch's one-tensor-at-a-time CPU default: benchmarks/bench_adamw.py) and leaves any other
parameter kind (FSDP2's DTensors) to torch's default."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gmts.train.run_parts import adamw_implementation

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


class _Wrapped(torch.Tensor):
    """A tensor subclass standing for a parameter that is not a plain tensor (a DTensor)."""


def test_auto_takes_fused_only_for_plain_float_tensors():
    plain = list(torch.nn.Linear(3, 3).parameters())
    assert adamw_implementation("auto", plain) == {"fused": True}
    wrapped = [torch.nn.Parameter(torch.zeros(3).as_subclass(_Wrapped))]
    assert adamw_implementation("auto", plain + wrapped) == {}
    assert adamw_implementation("auto", []) == {}
    assert adamw_implementation("fused", wrapped) == {"fused": True}
    assert adamw_implementation("foreach", plain) == {"foreach": True}
    assert adamw_implementation("for-loop", plain) == {"foreach": False}


def test_an_unknown_implementation_is_refused_by_the_config():
    from gmts.train.config import load_config

    with pytest.raises(ValueError, match="optim.adamw"):
        load_config(None, ["optim.adamw=apex"])


def _train(tiny_dir: Path, run_dir: Path, adamw: str, *extra: str):
    from gmts.train.trainer import Trainer

    cfg = _tiny.small_config(tiny_dir, run_dir, f"optim.adamw={adamw}", *extra)
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    result = trainer.run()
    return trainer, result


@pytest.mark.parametrize("other", ["for-loop", "foreach"])
def test_fused_and_the_others_train_the_same_to_rounding(tiny_dir, tmp_path, other):
    fused, fused_result = _train(tiny_dir, tmp_path / "fused", "fused")
    assert fused.optimizer.defaults["fused"] is True
    plain, plain_result = _train(tiny_dir, tmp_path / other, other)
    assert not plain.optimizer.defaults["fused"]
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_dir)
    moved = 0.0
    for a, b, s in zip(fused.model.parameters(), plain.model.parameters(), start.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        moved = max(moved, (a - s).abs().max().item())
    assert moved > 1e-4  # the two steps did update the weights: the agreement is not trivial
    for key in ("reward/mean", "response/tokens"):
        assert fused_result.history[-1][key] == plain_result.history[-1][key]


def test_a_run_saved_with_one_implementation_resumes_with_another(tiny_dir, tmp_path):
    from gmts.train.trainer import Trainer

    run = tmp_path / "run"
    cfg = _tiny.small_config(tiny_dir, run, "optim.adamw=for-loop", "checkpoint.every=1")
    Trainer(cfg, reward_fn=_tiny.partial_credit).run()
    resumed_cfg = _tiny.small_config(
        tiny_dir, run, "optim.adamw=fused", "checkpoint.every=1", "optim.steps=3"
    )
    resumed = Trainer(
        resumed_cfg, resume=True, allow_config_change=True, reward_fn=_tiny.partial_credit
    )
    assert resumed.step == 2 and resumed.optimizer.defaults["fused"] is True
    state = resumed.optimizer.state_dict()["state"]
    assert state and all(int(s["step"]) == 2 for s in state.values())
    resumed.run()
    assert all(int(s["step"]) == 3 for s in resumed.optimizer.state_dict()["state"].values())
