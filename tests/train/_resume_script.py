"""Run for test_train_resume.py (not a test module): a small deterministic training run.

python _resume_script.py MODEL_DIR RUN_DIR [--resume]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch


def main() -> None:
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("_tiny", Path(__file__).with_name("_tiny.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    from gmts.train.trainer import train

    model_dir, run_dir = sys.argv[1:3]
    cfg = tiny.small_config(
        Path(model_dir),
        Path(run_dir),
        "algorithm=dapo",
        "selection.score=gmts",
        "optim.steps=8",
        "optim.mini_batch_questions=2",
        "optim.epochs=2",
        "optim.schedule=cosine",
        "optim.warmup_steps=2",
        "checkpoint.every=1",
        "checkpoint.keep=2",
        "checkpoint.save_final=true",
    )
    train(cfg, resume="--resume" in sys.argv, reward_fn=tiny.partial_credit)


if __name__ == "__main__":
    main()
