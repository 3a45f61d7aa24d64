"""A small deterministic training run with the partial-credit reward (not a test module).

python _train_script.py MODEL_DIR RUN_DIR [section.field=value ...] [--resume]

Runs as one process or under torchrun (the trainer joins the process group itself).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch


def main() -> None:
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("_tiny", Path(__file__).with_name("_tiny.py"))
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    from gmts.scale.distributed import shutdown
    from gmts.train.trainer import Trainer

    model_dir, run_dir, *rest = sys.argv[1:]
    overrides = [a for a in rest if a != "--resume"]
    cfg = tiny.small_config(Path(model_dir), Path(run_dir), *overrides)
    finished = False
    try:
        _train(Trainer(cfg, resume="--resume" in rest, reward_fn=tiny.partial_credit))
        finished = True
    finally:
        shutdown(drain=finished)  # the trainer is gone by now: nothing holds the group


def _train(trainer) -> None:
    if os.environ.get("GMTS_TEST_SKEW_RNG") == "1":  # the ranks' RNG states differ from here
        torch.rand(97 * trainer.info.rank)
    try:
        trainer.run()
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
