"""Whose stop tokens a top-20% selection trains: of the answers that ended with a stop token
(not cut at the budget) and carry an advantage, the share whose stop token GMTS's and ETS's
top 20% of the batch hold, right answers apart from wrong ones; and the stop token's entropy.

    GMTS_CACHE=<cache> HF_HUB_OFFLINE=1 python benchmarks/stop_token_selection.py \\
        [--config configs/smollm2-135m-instruct-word-problems/dapo-gmts.yaml] [--steps 6]

The question it answers (docs/results.md section 14, task2): whether a selection trains the
stop token of wrong answers (pushing it down: answers that do not end) more often than that of
right ones. The batches are the trainer's own (``Trainer.collect``: the config's questions,
sampling, rewards and group advantages for its seed), scored once by the base model
(``score_rollout``), and the selections are the trainer's own step
(``gmts.train.update.select_minibatch``: the config's selection settings and objective, its
omega, ratio and count), with the config's score and with ``entropy`` (ETS) in its place. It describes
the policy before training, not a run's later one. No record is written.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smollm2-135m-instruct-word-problems" / "dapo-gmts.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: beside other work)"
    )
    args = parser.parse_args(argv)
    import dataclasses
    import tempfile

    from gmts.train.config import load_config
    from gmts.train.step import score_rollout
    from gmts.train.trainer import Trainer
    from gmts.train.update import select_minibatch

    entropy: dict[str, list[float]] = {"right": [], "wrong": []}
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"seed={args.seed}", f"logging.output_dir={tmp}/run"]
        overrides += ["logging.progress=false", "checkpoint.every=0", "checkpoint.save_final=false"]
        overrides += [f"threads={args.threads}"]
        cfg = load_config(str(args.config), overrides)
        print(f"loading {cfg.model.path} (then {args.steps} batches)", flush=True)
        trainer = Trainer(cfg, overwrite=True)
        trainer.model.eval()
        parts, budget = trainer.parts.optimization, cfg.rollout.max_response_length
        micro = cfg.optim.micro_batch_size
        rules = {cfg.selection.score: cfg.selection}  # the config's (gmts), then ETS's
        rules["entropy (ETS)"] = dataclasses.replace(cfg.selection, score="entropy")
        counts = {f"{rule} {side}": [0, 0] for rule in rules for side in ("right", "wrong")}
        for step in range(1, args.steps + 1):
            print(f"batch {step} of {args.steps}: sampling and scoring", flush=True)
            batch, _ = score_rollout(
                trainer.model,
                trainer.ref_model,
                trainer.collect(step).batch,
                scorer=parts.scorer,
                selection=cfg.selection,
                correction=parts.correction,
                micro_batch_size=micro,
                single_pass=False,
            )
            E = batch.old.entropy.float()  # (B, T)
            lengths = batch.response_mask.sum(1).tolist()
            for name, rule in rules.items():
                chosen = select_minibatch(
                    batch, batch.old, rule, parts.loss.objective,
                    micro_batch_size=micro, info=trainer.info, step=step,
                )  # fmt: skip
                selected = chosen.selected  # (B, T) bool
                for i, n in enumerate(lengths):
                    a = float(batch.advantages[i])
                    if a == 0 or n == 0 or n >= budget:  # no gradient, or cut: no stop token
                        continue
                    side = "right" if a > 0 else "wrong"
                    counts[f"{name} {side}"][0] += int(selected[i, n - 1])
                    counts[f"{name} {side}"][1] += 1
                    if name == cfg.selection.score:
                        entropy[side].append(float(E[i, n - 1]))
            print(f"batch {step} of {args.steps}: {len(lengths)} answers selected", flush=True)
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
