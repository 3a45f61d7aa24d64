"""Every step's metrics of a few small trainer runs, as JSON: to compare two versions of the
trainer's step (a refactor must give the same numbers, step by step).

Run it with each version's ``src`` first on the path and compare the two files::

    PYTHONPATH=<old checkout>/src python benchmarks/step_metrics.py /tmp/old.json
    PYTHONPATH=$PWD/src python benchmarks/step_metrics.py /tmp/new.json --compare /tmp/old.json

``--set section.field=value`` adds an override to every run (e.g. ``model.forward_layout=padded``
to compare a checkout from before that setting with the same layout). Rows the old file does
not have (metrics added since) are listed apart; they are not differences.

The runs are the trainer tests' small run (tests/train/_tiny.py: a 2-layer tiny model,
4 questions x 4 answers, 3 steps) in both update layouts — one update on one micro-batch (the
old log-probs come from the loss's own forward) and several mini-batches, epochs and
micro-batches (a separate no-grad pass) — with and without a rollout correction. The
correction needs an engine's log-probs: the ``hf`` sampler here is wrapped so that it attaches
fixed pseudo-random ones (seeded by the step's sampling seed), enough to make the weights
differ from 1 and reach the cap. Timing rows (``time/*``) are left out: they are the only
rows that may differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

RUNS: dict[str, tuple[str, ...]] = {
    # one update on one micro-batch: rows per rank (16) <= optim.micro_batch_size
    "one-pass gmts dapo": ("optim.micro_batch_size=16", "algorithm=dapo"),
    "one-pass gmts grpo-kl": ("optim.micro_batch_size=16", "algorithm=grpo"),
    "one-pass entropy": ("optim.micro_batch_size=16", "selection.score=entropy"),
    "one-pass none": ("optim.micro_batch_size=16", "selection.score=none"),
    "one-pass gmts token-correction": (
        "optim.micro_batch_size=16",
        "rollout.correction=token",
        "rollout.correction_cap=1.5",
    ),
    "one-pass entropy sequence-correction": (
        "optim.micro_batch_size=16",
        "selection.score=entropy",
        "rollout.correction=sequence",
        "rollout.correction_cap=1.5",
    ),
    # two mini-batches of one micro-batch each
    "minibatches gmts grpo-kl": ("optim.mini_batch_questions=2", "algorithm=grpo"),
    # two mini-batches, two epochs, two micro-batches each
    "epochs gmts": (
        "optim.mini_batch_questions=2",
        "optim.epochs=2",
        "optim.micro_batch_size=4",
    ),
    "epochs entropy micro-unit": (
        "optim.mini_batch_questions=2",
        "optim.epochs=2",
        "optim.micro_batch_size=4",
        "selection.score=entropy",
        "selection.unit=micro-batch",
    ),
    "epochs gmts token-correction": (
        "optim.mini_batch_questions=2",
        "optim.epochs=2",
        "optim.micro_batch_size=4",
        "rollout.correction=token",
        "rollout.correction_cap=1.5",
    ),
    "one micro-batch over two, sequence-correction": (
        "optim.micro_batch_size=8",
        "selection.score=entropy",
        "rollout.correction=sequence",
        "rollout.correction_cap=1.5",
    ),
}
ENGINE = "hf-with-logprobs"


def _register_engine() -> None:
    """The hf sampler with fixed pseudo-random engine log-probs (see the module docstring)."""
    import torch

    from gmts.sampling.sampler import SAMPLERS, HFSampler

    class HFWithLogprobs(HFSampler):
        name = ENGINE

        def sample(self, problems: Any, **kw: Any) -> Any:
            roll = super().sample(problems, **kw)
            g = torch.Generator().manual_seed(int(kw["seed"]) % (1 << 62))
            shape = tuple(roll.response_ids.shape)
            engine = -2.3 - 1.2 * torch.rand(shape, generator=g)  # (B, T), near the tiny model's
            engine = torch.where(roll.response_mask, engine, 0.0)
            return dataclasses.replace(roll, engine_logprobs=engine)

    if ENGINE not in SAMPLERS.names():
        SAMPLERS.add(ENGINE, HFWithLogprobs)


def run_all(
    steps: int = 3, overrides_for_all: tuple[str, ...] = ()
) -> dict[str, list[dict[str, float]]]:
    """``{run name: [metrics of step 1, 2, ...]}`` without the timing rows;
    ``overrides_for_all`` added to every run's."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "train"))
    import _tiny

    from gmts.train.trainer import Trainer

    torch.set_num_threads(1)
    _register_engine()
    out = {}
    with tempfile.TemporaryDirectory(prefix="gmts-step-metrics-") as tmp:
        model_dir = _tiny.save_tiny_model(Path(tmp) / "model")
        for name, overrides in RUNS.items():
            extra = [f"optim.steps={steps}"]
            if any(o.startswith("rollout.correction=") for o in overrides):
                extra.append(f"rollout.engine={ENGINE}")
            run_dir = Path(tmp) / name.replace(" ", "_").replace(",", "")
            cfg = _tiny.small_config(model_dir, run_dir, *overrides, *extra, *overrides_for_all)
            trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
            try:
                history = trainer.run().history
            finally:
                trainer.close()
            out[name] = [
                {k: v for k, v in row.items() if not k.startswith("time/")} for row in history
            ]
            print(f"{name}: {len(history)} steps", file=sys.stderr)
    return out


def added_rows(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """The metric names ``new`` has and ``old`` never had (in any run or step)."""
    seen_old = {key for runs in old.values() for row in runs for key in row}
    return sorted({key for runs in new.values() for row in runs for key in row} - seen_old)


def differences(new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Every value of ``old`` that ``new`` does not reproduce exactly (nan equals nan); rows
    ``old`` never had are left out (:func:`added_rows`)."""
    added = set(added_rows(new, old))
    found = []
    for name in sorted(set(old) | set(new)):
        a, b = new.get(name), old.get(name)
        if a is None or b is None or len(a) != len(b):
            found.append(f"{name}: runs differ ({a is None}, {b is None})")
            continue
        for step, (row_a, row_b) in enumerate(zip(a, b), 1):
            for key in sorted((set(row_a) | set(row_b)) - added):
                x, y = row_a.get(key), row_b.get(key)
                same = x == y or (
                    isinstance(x, float)
                    and isinstance(y, float)
                    and math.isnan(x)
                    and math.isnan(y)
                )
                if not same:
                    found.append(f"{name} step {step} {key}: {x!r} != {y!r}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=Path, help="a file this script wrote earlier")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run"
    )
    args = parser.parse_args()
    metrics = run_all(args.steps, tuple(args.set))
    args.out.write_text(json.dumps(metrics, indent=1))
    if args.compare is not None:
        old = json.loads(args.compare.read_text())
        found = differences(metrics, old)
        rows = sum(len(v) for v in metrics.values())
        print(f"{len(metrics)} runs, {rows} steps: {len(found)} differences")
        added = added_rows(metrics, old)
        if added:
            print(f"rows the old file does not have: {', '.join(added)}")
        for line in found:
            print(line)
        sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
