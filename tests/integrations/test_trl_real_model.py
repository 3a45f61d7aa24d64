"""GMTSGRPOTrainer (TRL's own ``train()``) on the real pretrained model, SmolLM2-135M-Instruct,
through the documented CPU recipe (docs/integrations.md, "TRL on a CPU"): the TRL script
``python -m gmts.integrations.trl_cli`` with ``--model_name_or_path smollm2-135m-instruct``,
offline, 2 steps of 2 questions x 4 answers x 16 new tokens, GMTS top 20%."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from file_modules import load_module

pytest.importorskip("trl")

REAL = Path(__file__).resolve().parents[1] / "real_model" / "_real.py"
_real = load_module(REAL, "_real")

CPU_RECIPE = (  # docs/integrations.md, "TRL on a CPU": the flags a CPU needs, explicitly
    "--use_cpu", "true", "--bf16", "false", "--use_vllm", "false",
    "--gradient_checkpointing", "false", "--report_to", "none",
)  # fmt: skip


@pytest.mark.slow
def test_gmts_trl_two_steps_on_smollm2_on_cpu(tmp_path, real_model):
    dataset = _real.write_additions(tmp_path / "additions.jsonl")
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "gmts.integrations.trl_cli",
        "--model_name_or_path", _real.MODEL_NAME,
        "--train_file", str(dataset), "--template", "plain", "--reward", "math",
        *CPU_RECIPE,
        "--output_dir", str(out),
        "--max_steps", "2", "--learning_rate", "1e-5",
        "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--max_completion_length", "16", "--temperature", "0.7",
        "--gmts_score", "gmts", "--gmts_ratio", str(_real.RATIO),
        "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", "2",
        "--save_only_model", "true", "--seed", "0",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run(command, check=True, env=env, timeout=900)

    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    logs = [e for e in state["log_history"] if "gmts/selected_fraction" in e]
    assert [e["step"] for e in logs] == [1, 2]
    for entry in logs:
        rewards = entry["rewards/math_reward/mean"]
        assert 0.0 <= rewards <= 1.0
        n = entry["gmts/valid_tokens"]
        assert 0 < n <= 8 * 16
        assert entry["gmts/selected_tokens"] == math.ceil(_real.RATIO * n)
    assert any(e["rewards/math_reward/mean"] > 0 for e in logs), "no reward: no signal"

    from safetensors.torch import load_file

    trained = load_file(out / "model.safetensors")  # trainer.save_model at the end
    start = load_file(Path(real_model) / "model.safetensors")
    common = [k for k in start if k in trained]
    assert len(common) >= len(start) - 1  # all, but perhaps a tied lm_head
    moved = [k for k in common if not torch.equal(trained[k].float(), start[k].float())]
    assert len(moved) > len(common) // 2, f"only {len(moved)} of {len(common)} tensors moved"
