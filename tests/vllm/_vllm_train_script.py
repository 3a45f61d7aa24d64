"""One training run for the vLLM tests (not a test module).

python _vllm_train_script.py [--config FILE] [--partial-credit] [--resume] section.field=value ...

The trainer itself (``gmts.train.trainer.Trainer``), as ``gmts train`` runs it, one process or
under torchrun. ``--partial-credit``: the partial-credit reward of tests/train/_tiny.py (a
random tiny model earns some), else the task's own. With GMTS_TEST_ROLLOUT_DIR set, every rank
also writes what it sampled at each step (``<dir>/rank<R>_step<S>.pt``: prompt and response
ids, the response mask and the engine's log-probs). GMTS_TEST_SKIP_SYNC=1 makes the vllm engine
skip every weight sync (it keeps its starting weights): the broken run a test must catch.
With GMTS_TEST_SCORED_DIR set, every rank writes the scored batch's log-probs at each step
(``<dir>/rank<R>_step<S>.pt``: the trainer's pi_old, the engine's log-probs, the response mask),
from which a test recomputes the rollout correction's weights.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=None)
    parser.add_argument("--partial-credit", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("_vllm_tiny", here / "_vllm_tiny.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    from gmts.scale.distributed import shutdown
    from gmts.train.config import load_config
    from gmts.train.trainer import Trainer

    torch.set_num_threads(1)
    cfg = load_config(args.config, args.overrides)
    reward = helpers.tiny.partial_credit if args.partial_credit else None
    trainer = Trainer(cfg, resume=args.resume, reward_fn=reward)
    rank = trainer.info.rank
    if os.environ.get("GMTS_TEST_SKIP_SYNC") == "1":
        trainer.rollout_engine.sync_weights = lambda: None
    dump = os.environ.get("GMTS_TEST_ROLLOUT_DIR")
    if dump:
        collect = trainer.collect

        def recorded(step: int):
            collected = collect(step)
            b = collected.batch
            torch.save(
                {
                    "prompt_ids": b.prompt_ids.cpu(),
                    "prompt_mask": b.prompt_mask.cpu(),
                    "response_ids": b.response_ids.cpu(),
                    "response_mask": b.response_mask.cpu(),
                    "engine_logprobs": b.engine_logprobs,
                },
                Path(dump) / f"rank{rank}_step{step}.pt",
            )
            return collected

        trainer.collect = recorded
    scored_dir = os.environ.get("GMTS_TEST_SCORED_DIR")
    if scored_dir:
        import gmts.train.step_row as step_row

        correction_metrics = step_row.correction_metrics
        steps = iter(range(trainer.step + 1, 1 << 30))  # called once per step, with its batch

        def record_scored(batch, correction, info):
            torch.save(
                {
                    "old_logprobs": batch.old_logprobs.cpu(),
                    "engine_logprobs": batch.engine_logprobs.cpu(),
                    "response_mask": batch.response_mask.cpu(),
                },
                Path(scored_dir) / f"rank{rank}_step{next(steps)}.pt",
            )
            return correction_metrics(batch, correction, info)

        step_row.correction_metrics = record_scored
    finished = False
    try:
        trainer.run()
        finished = True
    finally:
        trainer.close()
        del trainer  # nothing may hold the process group when it is left (fsdp's model does)
        shutdown(drain=finished)


if __name__ == "__main__":
    main()
