"""Worker for test_train_distributed.py (run under torchrun; not a test module).

Joins the process group as the trainer does, builds a model with transformers (which imports
``torch.distributed.nn`` on the way), leaves the group, and writes how many references to the
default group are still held anywhere: a holder keeps the group's threads alive into interpreter
finalization, where they abort the process now and then.

    torchrun --nproc_per_node 2 _dist_shutdown_worker.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path


def main() -> None:
    import torch.distributed as dist

    from gmts.scale.distributed import init_distributed, shutdown

    model_dir, out_dir = sys.argv[1:3]
    info = init_distributed("cpu")
    group = dist.group.WORLD
    before = sys.getrefcount(group)
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    import torch.distributed.nn  # noqa: F401  (whoever imports it first)

    during = sys.getrefcount(group)
    shutdown(info, drain=True)
    gc.collect()
    # getrefcount's own argument and the local name `group` are the only holders left
    after = sys.getrefcount(group) - 2
    Path(out_dir, f"rank{info.rank}.json").write_text(
        json.dumps({"before": before, "during": during, "other_holders": after})
    )


if __name__ == "__main__":
    main()
