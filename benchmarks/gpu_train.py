"""Three training steps of a Qwen2.5-1.5B-shaped model: bf16 mixed precision, FSDP2, DAPO + GMTS.

    python benchmarks/gpu_train.py --out benchmarks/results/gpu/train.json        # CUDA GPU
    python benchmarks/gpu_train.py --engine vllm --out benchmarks/results/gpu/train_vllm.json
    python benchmarks/gpu_train.py --dry-run --out /tmp/train.json                # CPU, tiny

The GPU proof of the standalone trainer at real scale (issue 11, item 6). The model is
benchmarks/gpu_model.py's randomly initialised Qwen2.5-1.5B shape (28 layers, hidden 1536,
vocabulary 151,936) with a tokenizer that has one character per vocabulary id, so that every
sampled token shows up in the text. It trains with the trainer's own code (``Trainer``):
``model.dtype=bfloat16`` (float32 master weights), ``distributed.strategy=fsdp`` on one GPU,
gradient checkpointing, DAPO with GMTS top 20% and the paper's clip 0.2 / 0.28, lr 1e-6,
AdamW (0.9, 0.999), weight decay 0.01 -- scaled down to 8 questions x 8 answers and 512 new
tokens per answer so that three steps fit in a few minutes.

A random model cannot earn a meaningful reward, so the reward is a pseudo-random number in
[0, 1) from a hash of the completion: every group gets a spread of rewards (DAPO keeps it) and
the update has real advantages. Answers almost never sample the end token (1 in 151,936), so
every answer runs to the budget: the worst case for time and memory.

``--engine vllm`` samples the rollouts with the trainer's colocated vLLM engine instead
(``rollout.engine=vllm``: bf16 engine, sleep mode level 2 between rollouts, the policy's
weights synced in place before every rollout that follows an update, and before the first
under sleep level 2, the GPU default); it needs vllm importable.

Printed and written to ``--out``: each step's time split into rollout and update, generation
tokens per second of the rollout (response tokens / rollout time), the weight sync time
(vllm), the peak memory of the rollout and of the update against the memory plan's (PyTorch's
``max_memory_allocated``, and the device's own used memory polled every 20 ms, which also sees
what vLLM and the CUDA context hold), and the fraction of float32 master weights that the
steps moved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

SETTINGS = (
    "algorithm=dapo",
    "selection.score=gmts",
    "selection.ratio=0.2",
    "objective.clip_low=0.2",
    "objective.clip_high=0.28",
    "optim.lr=1e-6",
    "optim.betas=[0.9, 0.999]",
    "optim.weight_decay=0.01",
    "optim.grad_clip=1.0",
    "model.dtype=bfloat16",
    "model.gradient_checkpointing=true",
    "model.logits_chunk_size=1024",
    "distributed.strategy=fsdp",
    "rollout.max_sampling_rounds=1",
    "data.task=addition",
    "data.eval_questions=0",
    "checkpoint.save_final=false",
    "logging.progress=false",
)
FULL = (
    "rollout.questions_per_batch=8",
    "rollout.group_size=8",
    "rollout.max_response_length=512",
    "optim.micro_batch_size=8",
)
TINY = (
    "rollout.questions_per_batch=2",
    "rollout.group_size=4",
    "rollout.max_response_length=16",
    "optim.micro_batch_size=4",
    "threads=1",
)


def hashed_reward(completion: str, answer: str) -> float:
    """A pseudo-random reward in [0, 1), fixed for a given completion."""
    digest = hashlib.sha256(f"{answer}|{completion}".encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32


def master_weights(model) -> list:
    """Copies of this rank's float32 master weights (FSDP shards are local tensors)."""
    out = []
    for p in model.parameters():
        local = p.detach().to_local() if hasattr(p, "to_local") else p.detach()
        out.append(local.to("cpu", copy=True))
    return out


def generation_rate(metrics: dict) -> float:
    """Response tokens per second of the rollout, the weight sync (vllm) not counted."""
    seconds = metrics["time/rollout_s"] - metrics.get("time/weight_sync_s", 0.0)
    return metrics["response/tokens"] / max(seconds, 1e-9)


class DevicePoller:
    """The device's used memory (total - free, ``torch.cuda.mem_get_info``) polled every 20 ms
    from a thread until :meth:`stop`, which returns the highest value seen."""

    def __init__(self) -> None:
        import threading

        import torch

        self._torch = torch
        self._peak = 0.0
        self._done = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        free, total = self._torch.cuda.mem_get_info(0)
        self._peak = max(self._peak, float(total - free))

    def _loop(self) -> None:
        while not self._done.wait(0.02):
            self._sample()

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        self._sample()
        return self._peak


class PhasePeaks:
    """The highest memory of each phase ("rollout", "update") over the steps on CUDA: PyTorch's
    ``max_memory_allocated`` in :attr:`peaks`, the device's used memory (polled) in
    :attr:`device_peaks`; on the CPU a phase runs unmeasured."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.peaks: dict[str, float] = {}
        self.device_peaks: dict[str, float] = {}

    def measure(self, phase: str, fn, *a):
        """``fn(*a)``, its peaks folded into ``phase``'s."""
        import torch

        poller = DevicePoller() if self.cuda else None
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        out = fn(*a)
        if self.cuda:
            torch.cuda.synchronize()
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
            self.device_peaks[phase] = max(self.device_peaks.get(phase, 0.0), poller.stop())
        return out


def step_line(step: int, metrics: dict) -> str:
    """What is printed of one step: its times, tokens, rates, weight sync, reward, selection."""
    sync = metrics.get("time/weight_sync_s")
    return (
        f"step {step + 1}: {metrics['time/step_s']:.1f} s (rollout "
        f"{metrics['time/rollout_s']:.1f} s, update {metrics['time/update_s']:.1f} s), "
        f"{metrics['response/tokens']:.0f} response tokens, "
        f"{generation_rate(metrics):.0f} generated tokens/s, "
        f"{metrics['time/tokens_per_s']:.0f} tokens/s per step, "
        + (f"weight sync {sync:.2f} s, " if sync is not None else "")
        + f"reward {metrics['reward/mean']:.3f}, "
        f"selected {metrics.get('select/fraction', 1.0):.3f}"
    )


def train_steps(trainer, steps: int, peaks: PhasePeaks) -> list[dict]:
    """``steps`` training steps of ``trainer``, each printed; the rollout's and the whole
    step's memory peaks measured into ``peaks``."""
    collect = trainer.collect
    trainer.collect = lambda step: peaks.measure("rollout", collect, step)  # type: ignore[method-assign]
    out = []
    for step in range(steps):
        metrics = peaks.measure("update", trainer.train_step, step)  # rollout peak taken inside
        out.append(metrics)
        print(step_line(step, metrics), flush=True)
    return out


def print_memory(plan, peaks: PhasePeaks) -> None:
    """The memory plan's table and each phase's measured peaks against it."""
    from gmts.scale.memory_plan import GIB

    print(plan.table())
    for phase in ("rollout", "update"):
        if phase in peaks.peaks:
            planned = (
                plan.total(phase)
                if phase == "rollout"
                else max(plan.total(p) for p in ("scoring", "update", "step"))
            )
            print(
                f"peak {phase}: measured {peaks.peaks[phase] / GIB:.2f} GiB "
                f"(torch.cuda.max_memory_allocated), {peaks.device_peaks[phase] / GIB:.2f} GiB "
                f"(device used, polled), planned {planned / GIB:.2f} GiB"
            )


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--model-dir", type=Path, default=None, help="reuse a built model")
    parser.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="rollout.engine (default hf)"
    )
    return parser


def train_config(args: argparse.Namespace, model_dir: Path, device: str, work: Path):
    """The run's TrainConfig: :data:`SETTINGS`, the shapes (tiny on a dry run) and the paths."""
    from gmts.train.config import load_config

    return load_config(
        None,
        [
            *SETTINGS,
            *(TINY if args.dry_run else FULL),
            f"model.path={model_dir}",
            f"model.device={device}",
            f"optim.steps={args.steps}",
            f"logging.output_dir={work / 'run'}",
            f"rollout.engine={args.engine}",
        ],
    )


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)

    import torch
    from gpu_model import TINY as TINY_SHAPE
    from gpu_model import build

    from gmts.train.trainer import Trainer

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_train: no CUDA device (use --dry-run for the CPU path)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gmts-gpu-train-"))
    t0 = time.perf_counter()
    model_dir = args.model_dir or work / "model"
    build(model_dir, full_vocabulary=True, **(TINY_SHAPE if args.dry_run else {}))
    build_s = time.perf_counter() - t0
    cfg = train_config(args, model_dir, device, work)
    start = time.perf_counter()
    trainer = Trainer(cfg, reward_fn=hashed_reward)
    init_s = time.perf_counter() - start
    plan = trainer.memory_plan
    cuda = device == "cuda"
    peaks = PhasePeaks(cuda)
    before = master_weights(trainer.model)
    steps = train_steps(trainer, args.steps, peaks)
    trainer.close()
    after = master_weights(trainer.model)
    moved = sum(int((a != b).sum()) for a, b in zip(after, before))
    total = sum(b.numel() for b in before)
    dtypes = sorted({str(b.dtype) for b in before})
    result = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (dry run)",
        "torch": torch.__version__,
        "engine": args.engine,
        "model_build_s": build_s,
        "trainer_init_s": init_s,
        "generation_tokens_per_s": [generation_rate(m) for m in steps[1:] or steps],
        "parameters": total,
        "master_dtypes": dtypes,
        "moved_fraction": moved / total,
        "steps": steps,
        "peak_bytes": peaks.peaks,
        "device_peak_bytes": peaks.device_peaks,
        "plan_bytes": {k: plan.total(k) for k in plan.phases} if plan else None,
        "plan_table": plan.table() if plan else None,
    }
    print(
        f"master weights {dtypes}: {moved / total:.4f} of {total:,} elements moved in {args.steps} steps"
    )
    if not cuda:
        print(
            "dry run: the whole run on the CPU with tiny shapes; the CUDA peak memory against "
            "the plan (torch.cuda.max_memory_allocated) needs a GPU and was not measured"
        )
    if plan is not None:
        print_memory(plan, peaks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
