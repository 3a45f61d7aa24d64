"""GMTS on verl 0.9.1's ``main_ppo`` on the real pretrained model, SmolLM2-135M-Instruct, on CPU
(.venv-verl): 2 GRPO steps on verl's default (V1) trainer path through the documented launcher
``python -m gmts.integrations.verl``, with ``actor_rollout_ref.model.path=smollm2-135m-instruct``
(the launcher resolves the name to the converted folder). 2 questions x 4 answers x 16 new
tokens, GMTS top 20%, gmts's ``math`` reward. The CPU scaffolding is that of
test_verl_e2e_on_cpu.py (``verl_cpu/``), with the real model's data (``scaffold.prepare_real``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from file_modules import load_module

pytest.importorskip("verl.trainer.main_ppo", reason="verl is installed in .venv-verl only")
pytest.importorskip("transfer_queue", reason="verl's V1 trainer needs TransferQueue (.venv-verl)")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "verl_cpu"))

import scaffold  # noqa: E402
from test_verl_e2e_on_cpu import _run, _two_gmts_steps  # noqa: E402

_real = load_module(HERE.parent / "real_model" / "_real.py", "_real")

pytestmark = pytest.mark.slow

REAL = (
    f"actor_rollout_ref.model.path={_real.MODEL_NAME}",
    f"gmts.ratio={_real.RATIO}",
    "data.train_batch_size=2",
    "data.max_prompt_length=64",
    "data.max_response_length=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.temperature=0.7",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "trainer.total_epochs=2",  # 2 questions, 2 a batch: one step an epoch
)


def test_gmts_on_verl_main_ppo_on_smollm2(tmp_path, real_model):
    questions = [(f"What is {a} + {b}?", str(a + b)) for a, b in _real.QUESTIONS]
    folder = scaffold.prepare_real(tmp_path / "run", questions)
    rc, log, seconds = _run(folder, use_v1=True, actor={}, extra=REAL)
    print(f"verl v1 on SmolLM2: rc={rc}, {seconds:.0f} s")
    assert rc == 0, log[-6000:]
    assert "actor loss replaced by GMTS selection" in log
    steps = _two_gmts_steps(log, _real.RATIO)
    for step in (1, 2):
        metrics = steps[step]
        assert 0.0 <= metrics["critic/score/mean"] <= 1.0
        assert metrics["response_length/mean"] <= 16
