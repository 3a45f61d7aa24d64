"""``model.dtype: auto``: bf16 where the device computes it natively, float32 elsewhere, said in
the run's first lines and recorded in its folder (gmts.scale.auto_dtype).

The decision is tested on every combination of what it reads (mocked), the reader on this
machine's real torch under the environment variables that force AVX2 kernels, and the trainer
end to end with the reader replaced: the dtype it trains in, its first line, ``config.yaml``,
``starts.jsonl``, and the refusal of a resume on a machine where ``auto`` picks otherwise."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gmts.scale import auto_dtype
from gmts.scale.auto_dtype import Bf16Signals, choose_dtype, planned_dtype

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")

CPU = torch.device("cpu")
NATIVE = Bf16Signals("cpu", "avx512_bf16", "AVX512", onednn_bf16=True)
"""An AMD EPYC with AVX512-BF16 under torch's default kernels (the machine of issue 34)."""
AVX2_ONLY = Bf16Signals("cpu", None, "AVX2", onednn_bf16=False)
"""An AVX2-only CPU (docs/results.md section 8)."""


@pytest.mark.parametrize(
    ("signals", "dtype", "why"),
    [
        (NATIVE, "bfloat16", "natively"),
        (dataclasses.replace(NATIVE, cpu_flag="amx_bf16"), "bfloat16", "natively"),
        (AVX2_ONLY, "float32", "no bf16 instructions"),
        (dataclasses.replace(NATIVE, cpu_flag=None), "float32", "no bf16 instructions"),
        (
            dataclasses.replace(NATIVE, cpu_flag="bf16", torch_kernels="DEFAULT"),
            "float32",
            "Arm",
        ),
        (
            dataclasses.replace(NATIVE, torch_kernels="AVX2", aten_env="ATEN_CPU_CAPABILITY=avx2"),
            "float32",
            "AVX2 kernels",
        ),
        (
            dataclasses.replace(NATIVE, onednn_isa="ONEDNN_MAX_CPU_ISA=AVX2", onednn_bf16=False),
            "float32",
            "below AVX512_CORE_BF16",
        ),
        (
            dataclasses.replace(NATIVE, onednn_isa="ONEDNN_MAX_CPU_ISA=avx512_core"),
            "float32",
            "below AVX512_CORE_BF16",
        ),
        (
            dataclasses.replace(NATIVE, onednn_isa="DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI"),
            "float32",
            "below AVX512_CORE_BF16",
        ),
        (
            dataclasses.replace(NATIVE, onednn_isa="ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16"),
            "bfloat16",
            "natively",
        ),
        (
            dataclasses.replace(NATIVE, onednn_isa="ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX"),
            "bfloat16",
            "natively",
        ),
        (dataclasses.replace(NATIVE, onednn_isa="ONEDNN_MAX_CPU_ISA=ALL"), "bfloat16", "natively"),
        (
            dataclasses.replace(NATIVE, onednn_isa="ONEDNN_MAX_CPU_ISA=AVX9000"),
            "float32",
            "not an ISA name",
        ),
        (dataclasses.replace(NATIVE, onednn_bf16=False), "float32", "oneDNN does not"),
        (
            Bf16Signals("cuda", gpu="H100 (compute capability 9.0)", gpu_bf16=True),
            "bfloat16",
            "tensor cores",
        ),
        (
            Bf16Signals("cuda", gpu="T4 (compute capability 7.5)", gpu_bf16=False),
            "float32",
            "< 8.0",
        ),
    ],
)
def test_auto_takes_bf16_only_where_it_is_native(signals, dtype, why):
    choice = choose_dtype("auto", torch.device(signals.device), signals)
    assert (choice.asked, choice.dtype) == ("auto", dtype)
    assert why in choice.reason
    line = choice.line()
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    # the first-lines report: the choice, why, what was read, and the key that changes it
    assert line.startswith(f"model.dtype: auto -> {dtype} (") and why in line
    assert signals.describe() in line and line.endswith(f"model.dtype={other} to change")
    for env in (signals.aten_env, signals.onednn_isa):
        if env:
            assert env in line
    record = choice.record()
    assert record["dtype"] == dtype and record["signals"] == dataclasses.asdict(signals)
    json.dumps(record)  # plain JSON types


def test_a_dtype_set_by_hand_is_kept_and_says_when_bf16_is_emulated():
    for signals in (NATIVE, AVX2_ONLY):
        for name in ("float32", "bfloat16"):
            choice = choose_dtype(name, CPU, signals)
            assert (choice.asked, choice.dtype) == (name, name)
            assert choice.line().startswith(f"model.dtype: {name} (as set; ")
    assert "slower than float32 here" in choose_dtype("bfloat16", CPU, AVX2_ONLY).reason
    assert "auto would take bfloat16" in choose_dtype("float32", CPU, NATIVE).reason
    with pytest.raises(ValueError, match=r"model.dtype: expected one of \['auto', 'float32'"):
        choose_dtype("float16", CPU, NATIVE)


def test_the_reader_reads_the_flags_and_the_environment(monkeypatch):
    monkeypatch.setattr(auto_dtype, "cpu_bf16_support", lambda: "amx_bf16")
    for name in ("ATEN_CPU_CAPABILITY", *auto_dtype.ONEDNN_ISA_ENV):
        monkeypatch.delenv(name, raising=False)
    signals = auto_dtype.read_bf16_signals(CPU)
    assert signals.cpu_flag == "amx_bf16" and signals.onednn_isa is None
    assert signals.torch_kernels == torch.backends.cpu.get_cpu_capability()
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert auto_dtype.read_bf16_signals(CPU).onednn_isa == "DNNL_MAX_CPU_ISA=AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # oneDNN's first name wins
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    signals = auto_dtype.read_bf16_signals(CPU)
    assert signals.onednn_isa == "ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX"
    assert signals.aten_env == "ATEN_CPU_CAPABILITY=avx2"


_PROBE = (
    "import json, torch; from gmts.scale.auto_dtype import choose_dtype; "
    "c = choose_dtype('auto', torch.device('cpu')); print(json.dumps(c.record()))"
)


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="x86 kernels only"
)
@pytest.mark.parametrize(
    ("env", "signal", "value"),
    [
        ({"ATEN_CPU_CAPABILITY": "avx2"}, "torch_kernels", "AVX2"),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "onednn_bf16", False),
    ],
)
def test_forcing_avx2_kernels_keeps_auto_at_float32(env, signal, value):
    """The real torch under the README's AVX2 environment (whatever this CPU has): the kernels
    torch and oneDNN then run are read as AVX2, and auto stays float32."""
    run_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=run_env, capture_output=True, text=True, check=True
    ).stdout
    record = json.loads(out.strip().splitlines()[-1])
    assert record["signals"][signal] == value
    assert record["dtype"] == "float32"


def test_ranks_that_pick_different_dtypes_are_refused(monkeypatch, tmp_path):
    import torch.distributed as dist

    from gmts.scale.distributed import DistInfo
    from gmts.train.policy import resolve_dtype

    cfg = _tiny.small_config(tmp_path / "m", tmp_path / "run", "model.dtype=auto")
    monkeypatch.setattr(auto_dtype, "read_bf16_signals", lambda device: NATIVE)
    picked = {"rank 1": "float32"}

    def all_gather_object(out, value, group=None):
        out[:] = [value, picked["rank 1"]]

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(DistInfo, "group", property(lambda self: None))
    two = DistInfo(rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank 0: bfloat16, rank 1: float32"):
        resolve_dtype(cfg, CPU, two)
    picked["rank 1"] = "bfloat16"
    resolved, choice = resolve_dtype(cfg, CPU, two)
    assert resolved.model.dtype == "bfloat16" and choice.asked == "auto"
    assert resolved == dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, dtype="bfloat16")
    )


def test_the_plan_counts_auto_as_what_it_resolves_to(monkeypatch):
    assert planned_dtype("auto", gpu=True) == "bfloat16"  # planned for bf16 GPUs
    assert planned_dtype("float32", gpu=True) == "float32"
    monkeypatch.setattr(auto_dtype, "read_bf16_signals", lambda device: NATIVE)
    assert planned_dtype("auto", gpu=False) == "bfloat16"
    monkeypatch.setattr(auto_dtype, "read_bf16_signals", lambda device: AVX2_ONLY)
    assert planned_dtype("auto", gpu=False) == "float32"
    with pytest.raises(ValueError, match="model.dtype"):
        planned_dtype("half", gpu=True)


@pytest.mark.parametrize(("signals", "dtype"), [(NATIVE, "bfloat16"), (AVX2_ONLY, "float32")])
def test_the_trainer_trains_in_the_dtype_auto_picked_and_records_it(
    tmp_path, capsys, monkeypatch, signals, dtype
):
    from gmts.train.config import load_config
    from gmts.train.trainer import Trainer

    monkeypatch.setattr(auto_dtype, "read_bf16_signals", lambda device: signals)
    tiny_dir = _tiny.save_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    cfg = _tiny.small_config(tiny_dir, run_dir, "model.dtype=auto", "optim.steps=1")
    capsys.readouterr()
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    first = capsys.readouterr().err.splitlines()[:2]  # the settings line, then the dtype's
    assert first[0].startswith("gmts train: template ")
    assert first[1] == choose_dtype("auto", CPU, signals).line()
    assert trainer.cfg.model.dtype == dtype
    assert trainer.strategy.precision.compute == getattr(torch, dtype)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # the masters
    trainer.run()
    saved = load_config(run_dir / "config.yaml")  # the dtype the run computed in
    assert saved.model.dtype == dtype
    (start,) = [json.loads(line) for line in (run_dir / "starts.jsonl").read_text().splitlines()]
    assert start["step"] == 0 and start["checkpoint"] is None
    assert start["precision"] == choose_dtype("auto", CPU, signals).record()


def test_a_resume_where_auto_picks_another_dtype_is_a_config_change(tmp_path, monkeypatch):
    from gmts.train.run_folder import RunFolderError
    from gmts.train.trainer import Trainer

    tiny_dir = _tiny.save_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    cfg = _tiny.small_config(
        tiny_dir, run_dir, "model.dtype=auto", "optim.steps=1", "checkpoint.save_final=true"
    )
    monkeypatch.setattr(auto_dtype, "read_bf16_signals", lambda device: NATIVE)
    Trainer(cfg, reward_fn=_tiny.partial_credit).run()
    monkeypatch.setattr(auto_dtype, "read_bf16_signals", lambda device: AVX2_ONLY)
    with pytest.raises(RunFolderError, match=r"model.dtype \('bfloat16' -> 'float32'\)"):
        Trainer(cfg, resume=True, reward_fn=_tiny.partial_credit)
    resumed = Trainer(cfg, resume=True, allow_config_change=True, reward_fn=_tiny.partial_credit)
    assert resumed.cfg.model.dtype == "float32"
    starts = [json.loads(line) for line in (run_dir / "starts.jsonl").read_text().splitlines()]
    assert [s["precision"]["dtype"] for s in starts] == ["bfloat16", "float32"]
    assert starts[1]["checkpoint"] is not None and starts[1]["step"] == 1
