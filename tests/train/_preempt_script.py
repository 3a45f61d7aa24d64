"""A small deterministic training run for test_preemption_signals.py (not a test module).

python _preempt_script.py MODEL_DIR RUN_DIR [section.field=value ...] [--resume]

Runs as one process or under torchrun. A preempted run ends with the trainer's own
``TrainingPreempted`` (a SystemExit: status 75), as any script that does not catch it would.
Test hooks, from the environment:
  PREEMPT_TEST_PID_DIR    write this process's pid to <dir>/rank<RANK> before training
  PREEMPT_TEST_STEP_S     sleep this long inside every train_step (a window for a signal)
  PREEMPT_TEST_SLOW_SAVE  before each trainer_state.pt is written (the weights already are),
                          write the temporary folder's name to <RUN_DIR>/saving.txt and
                          sleep this long
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

RECIPE = [
    "algorithm=dapo",
    "selection.score=gmts",
    "optim.steps=6",
    "optim.mini_batch_questions=2",
    "optim.epochs=2",
    "optim.schedule=cosine",
    "optim.warmup_steps=2",
    "data.eval_questions=4",
    "data.eval_samples=2",
    "data.eval_every=2",
    "checkpoint.keep=2",
    "checkpoint.save_final=true",
]


def _install_hooks(run_dir: Path) -> None:
    from gmts.train.trainer import Trainer

    pid_dir = os.environ.get("PREEMPT_TEST_PID_DIR")
    if pid_dir:
        rank = os.environ.get("RANK", "0")
        (Path(pid_dir) / f"rank{rank}").write_text(str(os.getpid()))
    step_s = float(os.environ.get("PREEMPT_TEST_STEP_S", "0"))
    if step_s:
        train_step = Trainer.train_step

        @functools.wraps(train_step)
        def slow_step(self, step):
            time.sleep(step_s)
            return train_step(self, step)

        Trainer.train_step = slow_step
    save_s = float(os.environ.get("PREEMPT_TEST_SLOW_SAVE", "0"))
    if save_s:
        save = torch.save

        @functools.wraps(save)
        def slow_save(obj, f, *args, **kwargs):
            path = Path(f)
            if path.name == "trainer_state.pt":
                (run_dir / "saving.txt").write_text(path.parent.name)
                time.sleep(save_s)
            return save(obj, f, *args, **kwargs)

        torch.save = slow_save


def main() -> None:
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("_tiny", Path(__file__).with_name("_tiny.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    from gmts.scale.distributed import shutdown
    from gmts.train.preemption import TrainingPreempted
    from gmts.train.trainer import train

    model_dir, run_dir, *rest = sys.argv[1:]
    overrides = [a for a in rest if a != "--resume"]
    _install_hooks(Path(run_dir))
    cfg = tiny.small_config(Path(model_dir), Path(run_dir), *RECIPE, *overrides)
    finished = False  # preempted counts: every rank agreed to stop at the same step
    try:
        train(cfg, resume="--resume" in rest, reward_fn=tiny.partial_credit)
        finished = True
    except TrainingPreempted:
        finished = True
        raise
    finally:
        shutdown(drain=finished)


if __name__ == "__main__":
    main()
