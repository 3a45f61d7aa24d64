"""LoRA on one CUDA GPU: the LoRA tests on CUDA, then full fine-tuning vs rank-64 LoRA of a
Qwen2.5-1.5B-shaped model, peak memory measured against the memory plan.

    python scripts/gpu/lora_check.py --out /tmp/lora_check.json          # one CUDA GPU
    python scripts/gpu/lora_check.py --dry-run --out /tmp/lora_check.json  # CPU, tiny shapes

Not run on a GPU yet: none was available. The CPU dry run (``--dry-run``: the same two runs
with benchmarks/gpu_model.py's tiny shape on the CPU, no CUDA peak memory) runs in CI
(tests/benchmarks/test_gpu_scripts.py), so its imports, overrides and plan cannot rot unseen.

1. ``pytest tests/train/test_lora.py -m ""``: with CUDA visible the trainer's ``model.device``
   is ``auto``, so the tests run on the GPU (bf16 autocast over float32 adapters, the adapters-
   off reference against a frozen copy of the base, checkpoints, resume).
2. Two runs of 2 steps each with the trainer's own code and benchmarks/gpu_train.py's settings
   (bf16 mixed precision, FSDP2 on one GPU, gradient checkpointing, DAPO + GMTS 20%, 8 x 8
   answers of 512 tokens) on benchmarks/gpu_model.py's random Qwen2.5-1.5B shape: full
   fine-tuning, then ``model.lora.rank=64`` (all linear layers, lr 1e-5). Printed and written
   to ``--out``: per run the plan's table and, per phase, ``torch.cuda.max_memory_allocated``
   against the plan (rollout; the largest of scoring / update / step).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

RUNS = {"full": (), "lora-r64": ("model.lora.rank=64", "model.lora.alpha=32", "optim.lr=1e-5")}


def _run(name: str, overrides: tuple[str, ...], model_dir: Path, dry_run: bool) -> dict:
    import torch
    from gpu_train import FULL, SETTINGS, TINY, hashed_reward

    from gmts.scale.memory_plan import GIB
    from gmts.train.config import load_config
    from gmts.train.trainer import Trainer

    cuda = not dry_run
    cfg = load_config(
        None,
        [
            *SETTINGS,
            *(TINY if dry_run else FULL),
            *overrides,
            f"model.path={model_dir}",
            f"model.device={'cuda' if cuda else 'cpu'}",
            "optim.steps=2",
            f"logging.output_dir={tempfile.mkdtemp(prefix=f'gmts-lora-{name}-')}",
        ],
    )
    trainer = Trainer(cfg, reward_fn=hashed_reward)
    peaks: dict[str, float] = {}

    def measured(phase: str, fn, *args):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        out = fn(*args)
        if cuda:
            torch.cuda.synchronize()
            peaks[phase] = max(peaks.get(phase, 0.0), torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        return out

    collect = trainer.collect
    trainer.collect = lambda step: measured("rollout", collect, step)  # type: ignore[method-assign]
    step_s = []
    for step in range(2):
        metrics = measured("update", trainer.train_step, step)
        step_s.append(metrics["time/step_s"])
        print(f"{name} step {step + 1}: {metrics['time/step_s']:.1f} s", flush=True)
    trainer.close()
    plan = trainer.memory_plan
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    result = {"trainable_parameters_local": trainable, "step_s": step_s, "peak_bytes": peaks}
    if plan is not None:
        print(plan.table())
        planned = {
            "rollout": plan.total("rollout"),
            "update": max(plan.total(p) for p in ("scoring", "update", "step")),
        }
        result["plan_bytes"] = planned
        for phase, value in peaks.items():
            print(
                f"{name} peak {phase}: measured {value / GIB:.2f} GiB, planned "
                f"{planned[phase] / GIB:.2f} GiB ({value / planned[phase]:.2f})"
            )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from gpu_model import TINY as TINY_SHAPE
    from gpu_model import build

    if not args.dry_run and not torch.cuda.is_available():
        print("lora_check: no CUDA device (use --dry-run for the CPU path)", file=sys.stderr)
        return 2
    out: dict = {
        "device": torch.cuda.get_device_name(0) if not args.dry_run else "cpu",
        "dry_run": args.dry_run,
    }
    if not args.skip_tests:
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/train/test_lora.py", "-m", "", "-q"],
            cwd=REPO,
        )
        out["tests_rc"] = tests.returncode
    model_dir = Path(tempfile.mkdtemp(prefix="gmts-lora-model-")) / "model"
    build(model_dir, full_vocabulary=True, **(TINY_SHAPE if args.dry_run else {}))
    for name, overrides in RUNS.items():
        out[name] = _run(name, overrides, model_dir, args.dry_run)
        if not args.dry_run:
            torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if out.get("tests_rc", 0) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
