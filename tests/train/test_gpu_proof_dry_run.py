"""The GPU training proof (benchmarks/gpu_train.py, run by benchmarks/gpu.sh) runs end to end on
the CPU with tiny shapes (about 5 s), so it is not broken when a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_train_dry_run(tmp_path):
    out = tmp_path / "train.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_train.py"), "--dry-run", "--out", str(out)],
        check=True,
        env=env,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert "dry run: the whole run on the CPU" in done.stdout  # it says what it did not check
    result = json.loads(out.read_text())
    assert len(result["steps"]) == 3
    assert result["master_dtypes"] == ["torch.float32"]  # bf16 compute, float32 master weights
    assert result["moved_fraction"] > 0.9  # lr 1e-6 updates are kept
    assert all(s["update/skipped_nonfinite"] == 0 for s in result["steps"])
    assert all(0.15 < s["select/fraction"] < 0.3 for s in result["steps"])  # GMTS top 20%
    assert result["plan_bytes"]["update"] > 0
