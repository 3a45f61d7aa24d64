"""Two CPU processes (gloo) select the same tokens and make the same update as one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from file_modules import load_module

HERE = Path(__file__).resolve().parent
_tiny = load_module(HERE / "_tiny.py", "_tiny")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str, env: dict[str, str], timeout: int) -> None:
    """``torchrun --nproc_per_node 2 ARGS`` on a free port; raises if it fails."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={_free_port()}",
            *args,
        ],
        check=True,
        env=env,
        timeout=timeout,
    )


def _make_batch(model_dir: Path, path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    import dataclasses

    batch = _tiny.rollout_batch(model, tokenizer, problem_seed=1, sample_seed=5)
    # a reference policy different from the current one, so the KL term has a gradient
    ref = batch.old_logprobs + 0.1 * torch.randn(
        batch.old_logprobs.shape, generator=torch.Generator().manual_seed(0)
    )
    torch.save(dataclasses.replace(batch, ref_logprobs=ref), path)


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    _make_batch(model_dir, tmp_path / "batch.pt")
    worker = str(HERE / "_dist_update_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    subprocess.run(
        [sys.executable, worker, str(model_dir), str(tmp_path / "batch.pt"), str(tmp_path / "one")],
        check=True,
        env=env,
        timeout=300,
    )
    _torchrun(
        worker,
        str(model_dir),
        str(tmp_path / "batch.pt"),
        str(tmp_path / "two"),
        env=env,
        timeout=300,
    )
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=False)
    r0 = torch.load(tmp_path / "two" / "rank0.pt", weights_only=False)
    r1 = torch.load(tmp_path / "two" / "rank1.pt", weights_only=False)
    # the same tokens are selected: the ranks' masks concatenated are the one-process mask
    assert torch.equal(torch.cat([r0["selected"], r1["selected"]]), one["selected"])
    assert (
        0
        < int(one["selected"].sum())
        < int(torch.load(tmp_path / "batch.pt", weights_only=False).response_mask.sum())
    )
    # the same update on every rank, equal to the one-process update
    assert torch.equal(r0["params"], r1["params"])
    assert torch.allclose(r0["params"], one["params"], atol=1e-6, rtol=0)
    start = _tiny.params_vector(
        __import__("transformers").AutoModelForCausalLM.from_pretrained(model_dir)
    ).float()
    assert not torch.equal(start, one["params"])
    assert r0["metrics"]["select/fraction"] == pytest.approx(one["metrics"]["select/fraction"])
    assert r0["metrics"]["update/loss"] == pytest.approx(one["metrics"]["update/loss"], abs=1e-6)


@pytest.mark.slow
def test_torchrun_two_processes_end_to_end(tmp_path):
    """`torchrun --nproc_per_node 2 -m gmts train` runs DAPO (collective dynamic sampling),
    writes one metrics row per step from rank 0 and a checkpoint."""
    from gmts.train.checkpoint import list_checkpoints
    from gmts.train.metrics_log import read_metrics

    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    _torchrun(
        "-m",
        "gmts",
        "train",
        f"model.path={model_dir}",
        f"logging.output_dir={run_dir}",
        "logging.progress=false",
        "algorithm=dapo",
        "rollout.questions_per_batch=4",
        "rollout.group_size=4",
        "rollout.max_sampling_rounds=2",
        "optim.mini_batch_questions=2",
        "optim.micro_batch_size=4",
        "optim.steps=2",
        "data.eval_questions=4",
        "data.eval_samples=2",
        env=env,
        timeout=600,
    )
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    # at most ceil(20%); 0 when every group of the random model earned the same reward (the
    # paper preset never selects a zero GMTS score)
    assert all(0 <= r["select/fraction"] <= 0.3 for r in rows)
    assert [s for s, _ in list_checkpoints(run_dir)] == [2]
    assert len(read_metrics(run_dir, "eval.jsonl")) == 2  # before and after


@pytest.mark.slow
@pytest.mark.parametrize("sharded", [False, True], ids=["replicate", "fsdp"])
def test_nothing_holds_the_process_group_after_shutdown(tmp_path, sharded):
    """Building a model after joining the group, and sharding it with FSDP2 (whose DTensor ops
    torch caches with the mesh), leaves no reference to the group behind: a group that outlives
    shutdown is freed during interpreter finalization, where its gloo threads abort the process
    now and then ("terminate called without an active exception")."""
    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    worker = [str(HERE / "_dist_shutdown_worker.py"), str(model_dir), str(tmp_path)]
    _torchrun(*worker, *(["fsdp"] if sharded else []), env=env, timeout=300)
    for rank in range(2):
        counts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert counts["during"] == counts["before"], counts  # the model build kept no reference
        assert counts["other_holders"] == 0, counts
