"""The prepared GPU scripts cannot rot unseen: benchmarks/gpu.sh (docs/results.md section 6,
the plan's GPU check in docs/training.md) and scripts/gpu/verl_e2e.sh (docs/integrations.md)
parse, and their ``--dry-run`` runs every entry point, flag and config they use on the CPU;
so does scripts/gpu/lora_check.py's (docs/training.md, LoRA on one GPU).

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


def _lora_parameters(shape: dict[str, int], rank: int) -> int:
    """Adapter parameters of rank ``rank`` on every linear layer of a Qwen2 block stack."""
    hidden, mlp = shape["hidden_size"], shape["intermediate_size"]
    kv = hidden // shape["num_attention_heads"] * shape["num_key_value_heads"]
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden)]  # q, k, v, o
    shapes += [(hidden, mlp), (hidden, mlp), (mlp, hidden)]  # gate, up, down
    return shape["num_hidden_layers"] * sum(rank * (a + b) for a, b in shapes)


def test_lora_check_dry_run(tmp_path: Path) -> None:
    # scripts/gpu/lora_check.py --dry-run: full fine-tuning, then rank-64 LoRA, 2 steps each
    # on the CPU with gpu_model's tiny shape (~10 s on 2 idle cores)
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_model

    out = tmp_path / "lora_check.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu" / "lora_check.py"), "--dry-run"]
        + ["--skip-tests", "--out", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["device"] == "cpu" and record["dry_run"] is True
    assert "tests_rc" not in record  # --skip-tests
    full, lora = record["full"], record["lora-r64"]
    for run in (full, lora):
        assert len(run["step_s"]) == 2 and all(t > 0 for t in run["step_s"])
        assert run["peak_bytes"] == {}  # CUDA's peak memory is not measured on the CPU
        assert run["plan_bytes"]["rollout"] > 0 and run["plan_bytes"]["update"] > 0
    # the LoRA run trains rank-64 adapters on every linear layer and nothing else
    assert lora["trainable_parameters_local"] == _lora_parameters(gpu_model.TINY, 64)
    assert lora["trainable_parameters_local"] < full["trainable_parameters_local"]
    assert lora["plan_bytes"]["update"] < full["plan_bytes"]["update"]
