"""Worker for test_train_distributed.py (run under torchrun; not a test module).

Joins the process group as the trainer does, builds a model with transformers (which imports
``torch.distributed.nn`` on the way), with ``fsdp`` shards it as the fsdp strategy does and runs
a forward and backward pass (DTensor ops, whose shardings torch caches), drops the model, leaves
the group, and writes how many references to the default group are still held anywhere: a
holder keeps the group's threads alive into interpreter finalization, where they abort the
process now and then.

    torchrun --nproc_per_node 2 _dist_shutdown_worker.py MODEL_DIR OUT_DIR [fsdp]
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path


def main() -> None:
    import torch
    import torch.distributed as dist

    from gmts.scale.distributed import init_distributed, shutdown

    model_dir, out_dir, *mode = sys.argv[1:]
    info = init_distributed("cpu")
    group = dist.group.WORLD
    before = sys.getrefcount(group)
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    import torch.distributed.nn  # noqa: F401  (whoever imports it first)

    during = sys.getrefcount(group)
    if mode == ["fsdp"]:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        from gmts.scale.fsdp import shard

        model = shard(model, MixedPrecisionPolicy(), torch.device("cpu"))
        model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    del model
    shutdown(info, drain=True)
    gc.collect()
    # getrefcount's own argument and the local name `group` are the only holders left
    after = sys.getrefcount(group) - 2
    Path(out_dir, f"rank{info.rank}.json").write_text(
        json.dumps({"before": before, "during": during, "other_holders": after})
    )


if __name__ == "__main__":
    main()
