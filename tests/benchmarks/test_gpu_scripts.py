"""The prepared GPU scripts cannot rot unseen: benchmarks/gpu.sh (docs/results.md section 6,
the plan's GPU check in docs/training.md) and scripts/gpu/verl_e2e.sh (docs/integrations.md)
parse, and their ``--dry-run`` runs every entry point, flag and config they use on the CPU.

What no CPU test can check is CUDA itself (devices, timings, torch.cuda peak memory) and vLLM.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHELL_SCRIPTS = [REPO / "benchmarks" / "gpu.sh", REPO / "scripts" / "gpu" / "verl_e2e.sh"]


def _env() -> dict[str, str]:
    src = str(REPO / "src")
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": src + (os.pathsep + path if path else ""),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }


def _verl_python() -> str | None:
    """A python with verl: this one, $GMTS_VERL_PYTHON, or the checkout's .venv-verl (what
    scripts/setup.sh verl builds and CI has)."""
    candidates = [
        sys.executable,
        os.environ.get("GMTS_VERL_PYTHON"),
        REPO / ".venv-verl/bin/python",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            probe = subprocess.run(
                [str(candidate), "-c", "import verl"], capture_output=True, timeout=120
            )
            if probe.returncode == 0:
                return str(candidate)
    return None


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shell_script_parses(script: Path) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run([bash, "-n", str(script)], check=True)


def test_gpu_model_tiny_is_the_gpu_architecture(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_model

    assert gpu_model.main([str(tmp_path / "model"), "--tiny"]) == 0
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert {k: config[k] for k in gpu_model.TINY} == gpu_model.TINY


@pytest.mark.slow  # five entry points on the CPU: ~25 s on 2 idle cores
def test_gpu_sh_dry_run(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), "--dry-run", str(tmp_path)],
        env={**_env(), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "dry run done" in done.stdout
    results = tmp_path / "results" / "gpu"
    for name in ("selection", "logprobs", "overhead"):
        record = json.loads((results / f"{name}.json").read_text())
        assert record["status"] == "ok", (name, record.get("error"))
        assert record["quick"] is True
    train = json.loads((results / "train.json").read_text())
    assert len(train["steps"]) == 3 and train["plan_bytes"]["update"] > 0
    page = (tmp_path / "results.md").read_text()  # report.py rendered the GPU blocks
    for block in ("gpu-selection", "gpu-logprobs", "gpu-overhead"):
        body = page.split(f"<!-- results:{block}:begin -->", 1)[1].split("<!-- results:", 1)[0]
        assert "not run" not in body, block


@pytest.mark.slow  # verl's imports and Hydra on 2 cores: ~20-60 s
def test_verl_e2e_dry_run(tmp_path: Path) -> None:
    python = _verl_python()
    if python is None:
        pytest.skip("no python with verl (bash scripts/setup.sh verl builds .venv-verl)")
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu" / "verl_e2e.sh"), "--dry-run", str(tmp_path)],
        env={**_env(), "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "dry run done" in done.stdout
    config = (tmp_path / "verl_config.yaml").read_text()  # verl's composed config
    assert "n_gpus_per_node: 1" in config and "name: vllm" in config
    assert str(tmp_path / "model") in config  # the scaffold's model, not the hub id
    # the check can fail: the same verl command with a key verl does not have is refused
    command = (tmp_path / "command.txt").read_text().splitlines()[1]
    bad = subprocess.run(
        [*shlex.split(command), "trainer.no_such_key=1", "--cfg", "job"],
        env={**_env(), "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert bad.returncode != 0 and "no_such_key" in bad.stdout + bad.stderr
