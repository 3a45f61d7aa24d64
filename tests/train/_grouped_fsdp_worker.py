"""Worker for test_grouped_forward.py's FSDP2 test (under torchrun, 2 ranks; not a test module).

Shards the tiny model with FSDP2 (gradient checkpointing on), then, for each forward layout,
runs on this rank's rows: a no-grad pass and a forward with gradients of a weighted log-prob
sum, then backward; saves the whole gradients (rank 0), this rank's log-probs and how many
model calls each grouped forward made against its own plan.

The ranks' rows are built so that their grouped plans need different numbers of calls:
batch "split": rank 0 has one bucket (equal lengths), rank 1 several (it must wait for nothing:
rank 0 splits its bucket); batch "filler": rank 1's responses all have one token (one prompt
call, nothing to split: it makes one-token calls).

    python _grouped_fsdp_worker.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_rows", HERE / "_rows.py")
_rows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rows)

VOCAB, EOS = 17, 15  # the embedded character tokenizer's
BATCHES = {
    "split": (
        dict(prompt_lengths=[5], response_lengths=[[6, 6, 6, 6]]),
        dict(prompt_lengths=[3, 7], response_lengths=[[8, 2], [5, 1]]),
    ),
    "filler": (
        dict(prompt_lengths=[4, 6], response_lengths=[[8, 3], [5, 2]]),
        dict(prompt_lengths=[6], response_lengths=[[1, 1, 1, 1]]),
    ),
}


def main() -> None:
    torch.set_num_threads(1)
    from gmts.models.loading import load_model
    from gmts.scale.distributed import init_distributed, shutdown
    from gmts.scale.fsdp import FullyShard
    from gmts.scale.precision import Precision
    from gmts.train.forward_plan import plan_forward
    from gmts.train.scoring import TokenScorer

    model_dir, out_dir = sys.argv[1:3]
    info = init_distributed("cpu")
    strategy = FullyShard(info, Precision(), torch.device("cpu"))
    out: dict = {}
    for layout in ("padded", "grouped"):
        model = strategy.prepare_policy(load_model(model_dir, gradient_checkpointing=True))
        calls: list[int] = []
        model.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
        scorer = TokenScorer(layout=layout, forward_group=info.group)
        logprobs, counts = {}, {}
        for name, per_rank in BATCHES.items():
            rows = _rows.grouped_rows(seed=info.rank, vocab=VOCAB, eos=EOS, **per_rank[info.rank])
            before = len(calls)
            scorer.no_grad(model, rows, micro_batch_size=rows.num_rows)
            stats = scorer(model, rows)
            weights = torch.linspace(-1.0, 1.0, rows.response_mask.numel()).view(
                -1, stats.logprobs.shape[1]
            )
            (stats.logprobs * weights * rows.response_mask).sum().backward()
            plan = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
            counts[name] = {"calls": (len(calls) - before) // 2, "planned": plan.calls}
            logprobs[name] = torch.where(rows.response_mask, stats.logprobs.detach(), 0.0)
        grads = {}
        for param_name, param in model.named_parameters():
            grad = param.grad
            grads[param_name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        out[layout] = {"grads": grads, "logprobs": logprobs, "calls": counts}
    torch.save(out, Path(out_dir) / f"rank{info.rank}.pt")
    shutdown(info, drain=True)


if __name__ == "__main__":
    main()
