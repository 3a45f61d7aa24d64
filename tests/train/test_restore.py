"""The restore part of the trainer alone (gmts/train/restore.py): a checkpoint's optimizer,
schedule, source and RNG states put back on a small module, without a Trainer. The whole run's
bit-exact resume is tested in test_train_resume.py, test_preemption.py and test_lora.py."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from gmts.scale.distributed import DistInfo
from gmts.scale.precision import Precision
from gmts.scale.strategy import make_strategy
from gmts.train import checkpoint as ckpt
from gmts.train.restore import restore_trainer_state

from file_modules import load_module

CPU = torch.device("cpu")
_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


class _Source:
    """A question source reduced to its resumable position."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state["position"]


def _parts(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, _Source]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    return model, optimizer, scheduler, _Source()


def _restore(folder: Path, parts: tuple, *, strategy_name: str = "replicate", **kwargs: Any):
    model, optimizer, scheduler, source = parts
    info = DistInfo()
    return restore_trainer_state(
        folder,
        strategy_name=strategy_name,
        strategy=make_strategy("replicate", info, Precision.from_name("float32"), CPU),
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        source=source,
        info=info,
        **kwargs,
    )


def _checkpoint(folder: Path, *, ranks: int = 1, strategy: str = "replicate") -> dict[str, Any]:
    """Train the small module two steps, save its trainer state as Trainer.save does, and
    return what the RNGs draw next (python, torch) with the saved values."""
    model, optimizer, scheduler, source = _parts(seed=1)
    for _ in range(2):
        model(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    source.position = 5
    rng = ckpt.capture_rng_state()
    folder.mkdir(parents=True)
    torch.save(
        {
            "step": 2,
            "strategy": strategy,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "source": source.state_dict(),
            "rng": rng,
            "rng_ranks": [rng] * ranks,
            "skipped_total": 1,
        },
        folder / "trainer_state.pt",
    )
    return {
        "next": (random.random(), torch.rand(3)),
        "exp_avg": optimizer.state_dict()["state"][0]["exp_avg"].clone(),
        "lr": scheduler.get_last_lr(),
    }


def test_every_state_comes_back_and_the_rngs_draw_what_followed_the_save(tmp_path):
    saved = _checkpoint(tmp_path / "ckpt")
    parts = _parts(seed=2)  # other weights, fresh optimizer, position 0
    random.random(), torch.rand(3)  # the RNGs moved on since the save
    counters = _restore(tmp_path / "ckpt", parts)
    _, optimizer, scheduler, source = parts
    assert (counters.step, counters.skipped_total) == (2, 1)
    assert source.position == 5
    assert scheduler.get_last_lr() == saved["lr"]
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved["exp_avg"])
    python_next, torch_next = saved["next"]
    assert random.random() == python_next
    assert torch.equal(torch.rand(3), torch_next)


def test_another_process_count_warns_at_the_callers_line(tmp_path):
    saved = _checkpoint(tmp_path / "ckpt", ranks=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _restore(tmp_path / "ckpt", _parts(seed=2))
    (warning,) = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert "written by 2 processes, this run has 1" in str(warning.message)
    assert Path(warning.filename).name == "test_restore.py"  # stacklevel=2: the caller's
    assert random.random() == saved["next"][0]  # rank 0's state, taken by every rank


def test_another_strategy_is_refused_before_any_state_is_put_back(tmp_path):
    _checkpoint(tmp_path / "ckpt", strategy="fsdp")
    parts = _parts(seed=2)
    with pytest.raises(ValueError, match="distributed.strategy=fsdp; resume it with the same"):
        _restore(tmp_path / "ckpt", parts)
    _, optimizer, _, source = parts
    assert source.position == 0 and optimizer.state_dict()["state"] == {}


def test_a_resumed_trainer_warns_at_the_trainer_call(tiny_dir, tmp_path, monkeypatch):
    """Through the Trainer (restore <- Trainer._restore <- Trainer.__init__): the warning of a
    checkpoint written by another number of processes names the line that built the Trainer."""
    import gmts.train.restore as restore_module
    from gmts.train.trainer import Trainer

    cfg = _tiny.small_config(tiny_dir, tmp_path / "run", "optim.steps=1", "checkpoint.every=1")
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    trainer.run()
    trainer.close()
    read = restore_module.ckpt.load_trainer_state

    def two_ranks(path):
        state = read(path)
        return {**state, "rng_ranks": state["rng_ranks"] * 2}

    monkeypatch.setattr(restore_module.ckpt, "load_trainer_state", two_ranks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = Trainer(cfg, resume=True, reward_fn=_tiny.partial_credit)
    resumed.close()
    (warning,) = [w for w in caught if "written by 2 processes" in str(w.message)]
    assert Path(warning.filename).name == "test_restore.py"
    assert resumed.step == 1
