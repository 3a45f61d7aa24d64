"""Worker for test_train_distributed.py (run directly or under torchrun; not a test module).

Loads a tiny model and a saved batch, runs ONE update_minibatch on this rank's contiguous
share of the rows (global selection and denominator over the process group), and saves the
parameters and this rank's selection mask.

    python _dist_update_worker.py MODEL_DIR BATCH.pt OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main() -> None:
    torch.set_num_threads(1)
    from gmts.core.config import SelectionConfig
    from gmts.core.objectives import ObjectiveConfig
    from gmts.train.distributed import init_distributed, shutdown
    from gmts.train.update import UpdateSettings, update_minibatch

    model_dir, batch_path, out_dir = sys.argv[1:4]
    info = init_distributed("cpu")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    batch = torch.load(batch_path, weights_only=False)
    rows = batch.num_rows // info.world_size
    mine = batch.rows(slice(info.rank * rows, (info.rank + 1) * rows))
    settings = UpdateSettings(
        objective=ObjectiveConfig.preset("grpo", kl_coef=0.05),
        selection=SelectionConfig(score="gmts", ratio=0.25),
        micro_batch_size=3,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics, selected = update_minibatch(model, opt, mine, settings, info=info, step=0)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.save(
        {"params": params, "selected": selected, "metrics": metrics},
        Path(out_dir) / f"rank{info.rank}.pt",
    )
    shutdown(info)


if __name__ == "__main__":
    main()
