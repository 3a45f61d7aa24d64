"""One update path: when a step is one update on one micro-batch, the trainer takes the old
log-probs from that update's own forward (no separate no-grad pass) and nothing else changes —
every metric of every step equals the run that makes the no-grad pass."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gmts.train.scoring import TokenScorer
from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


@pytest.mark.parametrize("score", ["gmts", "none"])
def test_the_one_pass_step_equals_the_step_with_a_no_grad_pass(
    tiny_dir, tmp_path, monkeypatch, score
):
    no_grad_passes = []
    real = TokenScorer.no_grad

    def counted(self, model, batch, **kw):
        no_grad_passes.append(model)
        return real(self, model, batch, **kw)

    monkeypatch.setattr(TokenScorer, "no_grad", counted)
    histories = {}
    for one_pass in (True, False):
        cfg = _tiny.small_config(
            tiny_dir,
            tmp_path / str(one_pass),
            "algorithm=grpo",  # with a KL term: a reference pass every step
            f"selection.score={score}",
            "optim.micro_batch_size=16",  # the rank's 16 rows: one micro-batch
        )
        trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
        assert trainer.single_pass
        trainer.single_pass = one_pass  # False: the general path's no-grad pass
        no_grad_passes.clear()
        histories[one_pass] = trainer.run().history
        policy_passes = sum(m is trainer.model for m in no_grad_passes)
        assert policy_passes == (0 if one_pass else cfg.optim.steps)
        assert len(no_grad_passes) - policy_passes == cfg.optim.steps  # the reference's
    assert len(histories[True]) == len(histories[False]) == 2
    for fused, general in zip(histories[True], histories[False]):
        assert fused.keys() == general.keys()
        for key, value in general.items():
            if key.startswith("time/"):
                continue
            if math.isnan(value):
                assert math.isnan(fused[key]), key
            else:
                assert fused[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
