"""The trainer with ``rollout.engine=vllm`` against the real engine (CPU, .venv-vllm).

- the demo recipe learns with vllm as it does with hf, with the engine's log-probs within
  1e-4 of the trainer's at every step (fp32);
- a skipped weight sync shows in ``rollout/logprob_gap_max``;
- SIGKILL + ``--resume`` samples and logs exactly what the uninterrupted run did;
- 2 processes under torchrun (replicate and fsdp): each rank samples its own rows through its
  own engine, every rank's engine follows the policy, and the global selection count is exact.

Every run is a separate process (one engine each); all are slow (an engine starts in 5-20 s).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_tiny import SKIP_REASON, save_vllm_tiny_model, vllm_installed  # noqa: E402

from gmts.train.checkpoint import list_checkpoints  # noqa: E402
from gmts.train.metrics_log import TIMING_KEYS, read_metrics  # noqa: E402

pytestmark = [pytest.mark.skipif(not vllm_installed(), reason=SKIP_REASON), pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = str(HERE / "_vllm_train_script.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
GAP_FP32 = 1e-4
TINY = (  # the trainer tests' small run (tests/train/_tiny.py: small_config)
    "logging.progress=false",
    "data.eval_questions=0",
    "rollout.questions_per_batch=4",
    "rollout.group_size=4",
    "optim.lr=1e-3",
    "optim.micro_batch_size=8",
    "checkpoint.save_final=false",
)


def _run(*args: str, env: dict[str, str] | None = None, timeout: int = 900) -> None:
    subprocess.run([sys.executable, SCRIPT, *args], check=True, env=env or ENV, timeout=timeout)


def _torchrun(*args: str, env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += [f"--master_port={port}", SCRIPT, *args]
    subprocess.run(command, check=True, env=env, timeout=900)


def _rows(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_metrics(run_dir)]


def _steps(run_dir: Path, key: str) -> list[float]:
    return [row[key] for row in read_metrics(run_dir)]


def test_demo_learns_with_vllm_as_with_hf(tmp_path):
    """`gmts train --config configs/demo.yaml rollout.engine=vllm`, 20 steps, against the
    same recipe with hf (same seed and budget).

    Criterion (the two engines draw different random numbers, so the curves differ by
    sampling noise): in both runs the mean reward of steps 11-20 exceeds that of steps 1-5 by
    at least 0.05 (measured 2026-12-01: +0.094 hf, +0.116 vllm), and the two runs' means over
    steps 11-20 are within 0.06 of each other (measured 0.227 and 0.236). 0.06 is 3 standard
    errors of the difference of two 10-step means, from the spread of the per-step rewards
    over steps 11-20 in these runs (standard deviations 0.035 hf and 0.050 vllm). In fp32 the
    engine's log-probs are within 1e-4 of the trainer's at every step (measured at most
    1.3e-5), and the weights are synced before every rollout after the first.
    """
    runs = {}
    for engine in ("hf", "vllm"):
        run_dir = tmp_path / engine
        command = [
            sys.executable,
            "-m",
            "gmts",
            "train",
            "--config",
            str(REPO / "configs/demo.yaml"),
        ]
        command += [
            f"rollout.engine={engine}",
            "optim.steps=20",
            "data.eval_questions=0",
            "logging.progress=false",
            f"logging.output_dir={run_dir}",
        ]
        subprocess.run(command, check=True, env=ENV, timeout=1200)
        runs[engine] = run_dir
    rewards = {e: _steps(d, "reward/mean") for e, d in runs.items()}
    for engine, curve in rewards.items():  # shown with -s; docs/training.md quotes a run
        print(engine, " ".join(f"{r:.3f}" for r in curve))
    early = {e: sum(c[:5]) / 5 for e, c in rewards.items()}
    late = {e: sum(c[10:]) / 10 for e, c in rewards.items()}
    for engine in runs:
        assert late[engine] - early[engine] >= 0.05, (engine, early[engine], late[engine])
    assert abs(late["vllm"] - late["hf"]) <= 0.06, late

    gaps = _steps(runs["vllm"], "rollout/logprob_gap_max")
    assert len(gaps) == 20 and max(gaps) <= GAP_FP32, gaps
    sync = _steps(runs["vllm"], "time/weight_sync_s")
    assert sync[0] == 0.0 and all(s > 0 for s in sync[1:])  # synced after every update
    assert "rollout/logprob_gap_max" not in read_metrics(runs["hf"])[0]


def test_a_skipped_weight_sync_shows_in_the_gap(tmp_path):
    """With every sync skipped the engine keeps sampling from the starting weights: the gap is
    tiny at step 1 (nothing has changed yet) and far above 1e-4 once the policy moved. (With
    the sync it stays within 1e-4: the demo and torchrun tests check that at every step.)"""
    model = save_vllm_tiny_model(tmp_path / "model")
    _run(
        "--partial-credit",
        *TINY,
        f"model.path={model}",
        "rollout.engine=vllm",
        "optim.steps=3",
        f"logging.output_dir={tmp_path / 'stale'}",
        env={**ENV, "GMTS_TEST_SKIP_SYNC": "1"},
    )
    stale = _steps(tmp_path / "stale", "rollout/logprob_gap_max")
    assert stale[0] <= GAP_FP32 and min(stale[1:]) > 1e-3, stale


def _dumps(folder: Path) -> dict[str, dict]:
    return {p.name: torch.load(p, weights_only=False) for p in sorted(folder.glob("*.pt"))}


def _same_samples(a: dict[str, dict], b: dict[str, dict]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        for key, value in a[name].items():
            assert torch.equal(value, b[name][key]), (name, key)


def test_sigkill_and_resume_samples_the_same(tmp_path):
    """The demo recipe with vllm, a checkpoint every step: a run SIGKILLed after its first
    checkpoint and resumed samples the same answers (token for token, log-probs bit for bit)
    and logs the same metrics as an uninterrupted run, and ends with the same weights."""
    common = [
        "--config",
        str(REPO / "configs/demo.yaml"),
        "rollout.engine=vllm",
        "optim.steps=5",
        "data.eval_questions=0",
        "logging.progress=false",
        "checkpoint.every=1",
        "checkpoint.keep=2",
        "checkpoint.save_final=true",
    ]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for d in ("d_straight", "d_killed"):
        (tmp_path / d).mkdir()
    env_s = {**ENV, "GMTS_TEST_ROLLOUT_DIR": str(tmp_path / "d_straight")}
    env_k = {**ENV, "GMTS_TEST_ROLLOUT_DIR": str(tmp_path / "d_killed")}
    _run(*common, f"logging.output_dir={straight}", env=env_s)

    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *common, f"logging.output_dir={killed}"], env=env_k
    )
    deadline = time.monotonic() + 900
    while not list_checkpoints(killed) and time.monotonic() < deadline:
        assert proc.poll() is None, "run ended before its first checkpoint"
        time.sleep(0.02)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert max(s for s, _ in list_checkpoints(killed)) < 5

    _run(*common, f"logging.output_dir={killed}", "--resume", env=env_k)
    assert [r["step"] for r in read_metrics(killed)] == list(range(1, 6))
    assert _rows(straight) == _rows(killed)
    _same_samples(_dumps(tmp_path / "d_straight"), _dumps(tmp_path / "d_killed"))

    from transformers import AutoModelForCausalLM

    def weights(run_dir: Path) -> list[torch.Tensor]:
        (_, path), *_ = reversed(list_checkpoints(run_dir))
        return [
            p.detach() for p in AutoModelForCausalLM.from_pretrained(path / "model").parameters()
        ]

    assert all(torch.equal(a, b) for a, b in zip(weights(straight), weights(killed)))


CORRECTION_CAP = 1.02


def _correction_run(tmp_path: Path, level: str) -> Path:
    """2 steps with every weight sync skipped: at step 2 the engine still samples from the
    starting weights while pi_old has moved (lr 1e-2), so the weights pi_old / pi_engine are
    far from 1 and the cap acts. Writes the scored batches under ``<run>/scored``."""
    model = save_vllm_tiny_model(tmp_path / "model")
    run = tmp_path / level
    (run / "scored").mkdir(parents=True)
    _run(
        "--partial-credit",
        *TINY,
        f"model.path={model}",
        "rollout.engine=vllm",
        f"rollout.correction={level}",
        f"rollout.correction_cap={CORRECTION_CAP}",
        "optim.lr=1e-2",
        "optim.steps=2",
        f"logging.output_dir={run}",
        env={**ENV, "GMTS_TEST_SKIP_SYNC": "1", "GMTS_TEST_SCORED_DIR": str(run / "scored")},
    )
    return run


@pytest.fixture(scope="module")
def uncorrected(tmp_path_factory) -> Path:
    return _correction_run(tmp_path_factory.mktemp("uncorrected"), "none")


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_correction_acts_with_the_real_engine(tmp_path, uncorrected, level):
    """rollout.correction from vLLM's own log-probs, with the engine left stale so that the
    weights min(pi_old/pi_engine, C) matter: the logged weights are those of the recorded
    pi_old and engine log-probs, the cap acts, and the update's loss moves with them (their
    math and omega: tests/train/test_rollout_correction.py)."""
    run = _correction_run(tmp_path, level)
    rows, plain = read_metrics(run), read_metrics(uncorrected)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        recorded = torch.load(run / "scored" / f"rank0_step{row['step']}.pt")
        mask = recorded["response_mask"]
        diff = torch.where(mask, recorded["old_logprobs"] - recorded["engine_logprobs"], 0.0)
        if level == "sequence":
            diff = diff.double().sum(-1, keepdim=True).expand_as(diff)
        w = torch.exp(diff.double())[mask]
        capped = w > CORRECTION_CAP
        w = w.clamp(max=CORRECTION_CAP)
        assert row["rollout/is_weight_mean"] == pytest.approx(float(w.mean()), rel=1e-6)
        assert row["rollout/is_weight_capped_fraction"] == pytest.approx(
            float(capped.double().mean()), abs=1e-9
        )
        assert row["update/skipped_nonfinite"] == 0
        if row["step"] == 2:  # the stale engine: weights far from 1, some capped
            assert float((w - 1).abs().max()) > 1e-2
            assert 0 < row["rollout/is_weight_capped_fraction"] < 1
    # same samples at step 2 (the engine never moved; seeds by step): the loss differs from
    # the uncorrected run's by much more than at step 1, where the weights are ~1
    step1 = abs(rows[0]["update/loss"] - plain[0]["update/loss"])
    step2 = abs(rows[1]["update/loss"] - plain[1]["update/loss"])
    assert step2 > 1e-4 and step2 > 100 * step1, (step1, step2)


def test_lora_syncs_the_merged_weights(tmp_path):
    """model.lora with the vLLM engine: the engine holds W + s B A, sent merged before every
    rollout. With the sync the gap stays within 1e-4 while the adapters move the policy; with
    the sync skipped (the engine keeps the base) it does not."""
    model = save_vllm_tiny_model(tmp_path / "model")
    common = (
        "--partial-credit",
        *TINY,
        f"model.path={model}",
        "rollout.engine=vllm",
        "model.lora.rank=4",
        "model.lora.alpha=8",
        "optim.lr=2e-2",
        "optim.steps=3",
    )
    _run(*common, f"logging.output_dir={tmp_path / 'lora'}")
    gaps = _steps(tmp_path / "lora", "rollout/logprob_gap_max")
    assert max(gaps) <= GAP_FP32, gaps
    assert all(s > 0 for s in _steps(tmp_path / "lora", "time/weight_sync_s"))
    _run(
        *common, f"logging.output_dir={tmp_path / 'stale'}", env={**ENV, "GMTS_TEST_SKIP_SYNC": "1"}
    )
    stale = _steps(tmp_path / "stale", "rollout/logprob_gap_max")
    assert min(stale[1:]) > 1e-3, stale


@pytest.mark.parametrize("strategy", ["replicate", "fsdp"])
def test_two_ranks_each_sample_their_own_rows(tmp_path, strategy):
    """torchrun, 2 processes, one engine each (external_launcher). GRPO (a reference model,
    sharded too under fsdp), one mini-batch per step so the selection is one global top-k."""
    from gmts.core.selection import selection_count
    from gmts.embedded.tasks import get_task
    from gmts.embedded.tokenizer import build_char_tokenizer
    from gmts.train.sources import TaskSource

    model = save_vllm_tiny_model(tmp_path / "model")
    run_dir, dumps = tmp_path / "run", tmp_path / "dumps"
    dumps.mkdir()
    ratio, steps = 0.3, 3
    _torchrun(
        "--partial-credit",
        *TINY,
        f"model.path={model}",
        f"logging.output_dir={run_dir}",
        "rollout.engine=vllm",
        f"distributed.strategy={strategy}",
        "algorithm=grpo",
        "selection.score=gmts",
        f"selection.ratio={ratio}",
        "selection.zero_scores=select",  # the exact count, whatever ties at zero
        f"optim.steps={steps}",
        env={**ENV, "GMTS_TEST_ROLLOUT_DIR": str(dumps)},
    )
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:
        # every rank's engine samples from the current policy (max over both ranks)
        assert row["rollout/logprob_gap_max"] <= GAP_FP32, row
        # ONE selection over both ranks' tokens: exactly ceil(ratio * N) of them
        tokens = row["response/tokens"]
        assert round(row["select/fraction"] * tokens) == selection_count(int(tokens), ratio), row
    assert all(r["time/weight_sync_s"] > 0 for r in rows[1:])

    # each rank sampled G answers for its own slice of the step's questions
    tokenizer = build_char_tokenizer()
    source = TaskSource(get_task("addition"), seed=0)  # the trainer's source, seed 0
    saved = _dumps(dumps)
    for step in range(steps):
        questions = [p.prompt for p in source.next(4)]
        for rank in (0, 1):
            batch = saved[f"rank{rank}_step{step}.pt"]
            prompts = [
                tokenizer.decode(ids[mask].tolist())
                for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])
            ]
            mine = questions[2 * rank : 2 * rank + 2]
            assert prompts == [q for q in mine for _ in range(4)], (step, rank)
        a, b = saved[f"rank0_step{step}.pt"], saved[f"rank1_step{step}.pt"]
        assert a["response_ids"].shape != b["response_ids"].shape or not torch.equal(
            a["response_ids"], b["response_ids"]
        )


def test_gpu_script_dry_run_with_vllm(tmp_path):
    """benchmarks/gpu_train.py --engine vllm (benchmarks/gpu.sh's vllm part) runs end to end on
    the CPU with tiny shapes: a Qwen2 model (fused qkv / gate-up weights in vLLM), bf16 engine
    over float32 master weights, FSDP on one process, so it is not broken when a GPU is lent."""
    out = tmp_path / "train_vllm.json"
    command = [sys.executable, str(REPO / "benchmarks" / "gpu_train.py"), "--dry-run"]
    subprocess.run(
        [*command, "--engine", "vllm", "--out", str(out)], check=True, env=ENV, timeout=900
    )
    import json

    result = json.loads(out.read_text())
    steps = result["steps"]
    assert result["engine"] == "vllm" and len(steps) == 3
    assert result["master_dtypes"] == ["torch.float32"]
    assert all(s["time/weight_sync_s"] > 0 for s in steps[1:])
    # bf16 engine vs the trainer's bf16 autocast: measured 0.0039 at every step
    assert all(s["rollout/logprob_gap_max"] < 0.05 for s in steps)
    assert "engine weights" in result["plan_table"] and result["generation_tokens_per_s"][0] > 0
