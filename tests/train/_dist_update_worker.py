"""Worker for test_train_distributed.py (run directly or under torchrun; not a test module).

Loads a tiny model and a saved batch, selects (select_minibatch) and runs ONE update_minibatch
on this rank's contiguous share of the rows (global selection and denominators over the process
group), and saves the parameters, this rank's selection mask and the global metrics.

    python _dist_update_worker.py MODEL_DIR BATCH.pt OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main() -> None:
    torch.set_num_threads(1)
    from gmts.core.config import SelectionConfig
    from gmts.core.loss import LossConfig
    from gmts.core.objectives import ObjectiveConfig
    from gmts.scale.distributed import init_distributed, shutdown
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import Replicate
    from gmts.train.scoring import TokenScorer
    from gmts.train.update import select_minibatch, update_metrics, update_minibatch

    model_dir, batch_path, out_dir = sys.argv[1:4]
    info = init_distributed("cpu")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    batch = torch.load(batch_path, weights_only=False)
    rows = batch.num_rows // info.world_size
    mine = batch.rows(slice(info.rank * rows, (info.rank + 1) * rows))
    objective = ObjectiveConfig.preset("grpo", kl_coef=0.05)
    selection = SelectionConfig(score="gmts", ratio=0.25)
    scorer = TokenScorer()
    current = scorer.no_grad(model, mine, micro_batch_size=3)
    chosen = select_minibatch(
        mine, current, selection, objective, micro_batch_size=3, info=info, step=0
    )
    selected = chosen.selected
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    result = update_minibatch(
        model,
        opt,
        mine,
        chosen,
        scorer=scorer,
        loss=LossConfig.of(objective, selection),
        micro_batch_size=3,
        grad_clip=1.0,
        strategy=Replicate(info, Precision(), torch.device("cpu")),
    )
    metrics = update_metrics([result])
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.save(
        {"params": params, "selected": selected, "metrics": metrics},
        Path(out_dir) / f"rank{info.rank}.pt",
    )
    shutdown(info, drain=True)


if __name__ == "__main__":
    main()
