"""Whose stop tokens a top-20% selection trains: of the answers that ended with a stop token
(not cut at the budget) and carry an advantage, the share whose stop token GMTS's and ETS's
top 20% of the batch hold, right answers apart from wrong ones; and the stop token's entropy.

    GMTS_CACHE=<cache> HF_HUB_OFFLINE=1 python benchmarks/stop_token_selection.py \\
        [--config configs/smollm2-135m-instruct-word-problems/dapo-gmts.yaml] [--steps 6]

The question it answers (docs/results.md section 14, task2): whether a selection trains the
stop token of wrong answers (pushing it down: answers that do not end) more often than that of
right ones. The batches are the trainer's own (``Trainer.collect``: the config's questions,
sampling, rewards and group advantages for its seed), scored once by the base model; the
selections are the top 20% of the batch's response tokens by ``|E x A|`` (GMTS at ratio 1,
where omega is the advantage times a constant of the batch) and by ``E`` (ETS). It describes
the policy before training, not a run's later one. No record is written.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smollm2-135m-instruct-word-problems" / "dapo-gmts.yaml"


def top_share(score: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """``(B, T)`` bool: the top ``ratio`` of the ``mask`` positions by ``score`` (ties at the
    threshold included)."""
    k = max(1, int(ratio * int(mask.sum())))
    ranked = torch.where(mask, score, torch.full_like(score, -float("inf")))
    threshold = ranked.flatten().topk(k).values[-1]
    return (ranked >= threshold) & mask


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ratio", type=float, default=0.2)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: beside other work)"
    )
    args = parser.parse_args(argv)
    import tempfile

    from gmts.train.config import load_config
    from gmts.train.trainer import Trainer

    counts = {f"{s} {side}": [0, 0] for s in ("GMTS", "ETS") for side in ("right", "wrong")}
    entropy: dict[str, list[float]] = {"right": [], "wrong": []}
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"seed={args.seed}", f"logging.output_dir={tmp}/run"]
        overrides += ["logging.progress=false", "checkpoint.every=0", "checkpoint.save_final=false"]
        overrides += [f"threads={args.threads}"]
        cfg = load_config(str(args.config), overrides)
        trainer = Trainer(cfg, overwrite=True)
        trainer.model.eval()
        budget = cfg.rollout.max_response_length
        for step in range(1, args.steps + 1):
            batch = trainer.collect(step).batch
            with torch.no_grad():
                stats = trainer.scorer(trainer.model, batch)
            E, mask = stats.entropy.float(), batch.response_mask  # (B, T)
            A = batch.advantages.float()[:, None].expand_as(E)  # (B, T)
            lengths = mask.sum(1).tolist()
            for name, score in (("GMTS", (E * A).abs()), ("ETS", E)):
                selected = top_share(score, mask, args.ratio)
                for i, n in enumerate(lengths):
                    a = float(batch.advantages[i])
                    if a == 0 or n == 0 or n >= budget:  # no gradient, or cut: no stop token
                        continue
                    side = "right" if a > 0 else "wrong"
                    counts[f"{name} {side}"][0] += int(selected[i, n - 1])
                    counts[f"{name} {side}"][1] += 1
                    if name == "GMTS":
                        entropy[side].append(float(E[i, n - 1]))
        trainer.close()
    print(f"{args.config.name}, seed {args.seed}, {args.steps} batches, the base model:")
    for key, (hit, total) in counts.items():
        share = f"{100 * hit / total:.0f}%" if total else "-"
        print(f"  {key} answers' stop token selected: {hit} of {total} ({share})")
    for side, values in entropy.items():
        if values:
            print(f"  stop-token entropy, {side} answers: {statistics.mean(values):.2f} nats")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
