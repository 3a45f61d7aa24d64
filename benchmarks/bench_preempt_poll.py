"""What the preemption poll costs next to a training step (issue 21).

    torchrun --nproc_per_node 2 benchmarks/bench_preempt_poll.py [--repeats 7] [--polls 500]
        [--out benchmarks/results/preempt_poll.json] [--quick]

Every step boundary of a multi-process run calls ``PreemptionGuard.stop_requested`` once: one
all-reduce of a one-element tensor. This runs the demo recipe's training step (the embedded
warm start, 32 questions x 8 answers, split over the ranks: the smallest step the project
ships) and, round-robin with it, blocks of ``--polls`` polls, on the same process group
(gloo on CPU, NCCL on GPUs), and reports both medians and their ratio. A real model's step is
seconds to minutes, so the ratio printed here is an upper bound for them.

``--quick`` only checks that the script runs (CI: tests/benchmarks/test_preempt_poll.py): a step
of 8 questions x 4 answers, 2 timed rounds of 50 polls; its figures mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


QUICK = {"repeats": 2, "polls": 50, "questions": 8, "group_size": 4}
"""``--quick``'s sizes: timed rounds, polls per block, and the step's questions x answers."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="training steps timed (7)")
    parser.add_argument("--polls", type=int, default=None, help="polls per timed block (500)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: only checks it runs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per rank)")
    parser.add_argument("--out", type=Path, default=None, help="write the record here (JSON)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else {"repeats": 7, "polls": 500}
    repeats = args.repeats if args.repeats is not None else defaults["repeats"]
    polls = args.polls if args.polls is not None else defaults["polls"]

    import torch
    from bench_common import git_commit, machine_description, summarize_times, utc_now
    from tiny_setup import StepShape, train_config, warm_model_path

    from gmts.scale.distributed import barrier, shutdown
    from gmts.train.preemption import PreemptionGuard
    from gmts.train.trainer import Trainer

    torch.set_num_threads(args.threads)
    model = warm_model_path()  # built and cached on first use
    with tempfile.TemporaryDirectory() as tmp:
        shape = StepShape(QUICK["questions"], QUICK["group_size"]) if args.quick else StepShape()
        cfg = train_config(
            model, Path(tmp) / "run", shape=shape, steps=repeats + 1, device=args.device
        )
        trainer = Trainer(cfg)
        guard = PreemptionGuard(None, trainer.info, trainer.device)
        sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
        step_times, poll_times = [], []
        for step in range(repeats + 1):  # the first round warms up
            barrier(trainer.info)
            sync()
            start = time.perf_counter()
            trainer.train_step(step)
            sync()
            step_s = time.perf_counter() - start
            barrier(trainer.info)
            start = time.perf_counter()
            for _ in range(polls):
                guard.stop_requested()
            poll_s = (time.perf_counter() - start) / polls
            if step:
                step_times.append(step_s)
                poll_times.append(poll_s)
        info = trainer.info
    step = summarize_times(step_times)
    poll = summarize_times(poll_times)
    record = {
        "benchmark": "preempt_poll",
        "command": " ".join(["torchrun", f"--nproc_per_node {info.world_size}", *sys.argv]),
        "date": utc_now(),
        "commit": git_commit(),
        "machine": machine_description(),
        "world_size": info.world_size,
        "device": str(trainer.device),
        "quick": args.quick,
        "threads_per_rank": args.threads,
        "questions": shape.questions,
        "group_size": shape.group_size,
        "polls_per_block": polls,
        "step": step,
        "poll": poll,
        "poll_over_step_median": poll["median_s"] / step["median_s"],
        "poll_us_spread": [round(t * 1e6, 1) for t in sorted(poll_times)],
    }
    if info.is_main:
        print(
            f"{info.world_size} ranks on {trainer.device}: step median "
            f"{step['median_s'] * 1e3:.1f} ms (min {step['min_s'] * 1e3:.1f}, max "
            f"{step['max_s'] * 1e3:.1f}); poll median {poll['median_s'] * 1e6:.1f} us (min "
            f"{poll['min_s'] * 1e6:.1f}, max {poll['max_s'] * 1e6:.1f}); poll / step = "
            f"{record['poll_over_step_median']:.2e} (median of {len(step_times)} rounds)"
        )
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2) + "\n")
    shutdown()


if __name__ == "__main__":
    main()
