"""What the GMTS-vs-ETS overlap metric (``logging.overlap_metrics``, on by default) costs, on
the embedded task's warm start with the demo recipe's batch (CPU, one thread).

1. The selection of one mini-batch with and without the overlap: ``select_minibatch`` on the
   batch of one real step (GMTS 20%, the whole batch one mini-batch), the two variants
   interleaved, ``--repeats`` calls each, in CPU time. Run it with an older ``src`` first on the path and the
   older code's overlap (a second ``select_minibatch`` through ``selection_overlap``) is timed
   instead.
2. One whole training step with ``logging.overlap_metrics`` on and off: two trainers from the
   same warm start, each restored to the same weights before each step, in alternating order,
   ``--steps`` paired rounds after one warm-up; ``time/update_s`` (everything after the
   rollout) and ``time/step_s``.

Prints medians and the spread (interquartile range) in milliseconds::

    PYTHONPATH=$PWD/src python benchmarks/overlap_cost.py --repeats 60 --steps 12
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tiny_setup import StepShape, train_config, warm_model_path


def _summary(seconds: list[float]) -> str:
    ms = sorted(1000 * s for s in seconds)
    q1, _, q3 = statistics.quantiles(ms, n=4)
    return f"median {statistics.median(ms):.3f} ms, IQR {q1:.3f}-{q3:.3f} ms (n={len(ms)})"


def _trainer(tmp: Path, name: str, overlap: bool) -> Any:
    from gmts.train.trainer import Trainer

    cfg = train_config(
        warm_model_path(),
        tmp / name,
        score="gmts",
        shape=StepShape(),
        overlap_metrics=overlap,
        dynamic_sampling=False,
    )
    return Trainer(cfg)


def selection_times(trainer: Any, repeats: int) -> dict[str, list[float]]:
    """CPU seconds of one mini-batch's selection without and with the overlap (the process's
    CPU time, one thread: steadier than wall time on a shared machine)."""
    import gmts.train.update as update

    cfg = trainer.cfg
    collected = trainer.collect(0)
    old = trainer.scorer.no_grad(
        trainer.model, collected.batch, micro_batch_size=cfg.optim.micro_batch_size
    )
    batch = collected.batch.scored(old, None)
    kw = dict(micro_batch_size=cfg.optim.micro_batch_size, info=trainer.info, step=0)
    args = (batch, batch.old, cfg.selection, cfg.objective)
    if hasattr(update, "selection_overlap"):  # the code before the overlap shared its inputs

        def plain() -> Any:
            return update.select_minibatch(*args, **kw)

        def with_overlap() -> Any:
            selected = update.select_minibatch(*args, **kw)
            return update.selection_overlap(batch, batch.old, selected, *args[2:], **kw)
    else:

        def plain() -> Any:
            return update.select_minibatch(*args, **kw)

        def with_overlap() -> Any:
            return update.select_minibatch(*args, **kw, overlap=True)

    times: dict[str, list[float]] = {"without": [], "with": []}
    for i in range(repeats + 3):  # 3 warm-up calls each
        for name, fn in (("without", plain), ("with", with_overlap))[:: 1 if i % 2 else -1]:
            t0 = time.process_time()
            fn()
            if i >= 3:
                times[name].append(time.process_time() - t0)
    return times


def step_times(on: Any, off: Any, steps: int) -> dict[str, dict[str, list[float]]]:
    """``time/update_s`` and ``time/step_s`` of paired steps with the overlap on and off."""
    states = {
        id(t): (copy.deepcopy(t.model.state_dict()), copy.deepcopy(t.optimizer.state_dict()))
        for t in (on, off)
    }
    out: dict[str, dict[str, list[float]]] = {
        "with": {"update": [], "step": []},
        "without": {"update": [], "step": []},
    }
    for i in range(steps + 1):  # round 0 is a warm-up
        order = [("with", on), ("without", off)][:: 1 if i % 2 else -1]
        for name, trainer in order:
            model_state, optim_state = states[id(trainer)]
            trainer.model.load_state_dict(model_state)
            trainer.optimizer.load_state_dict(optim_state)
            metrics = trainer.train_step(0)
            if i:
                out[name]["update"].append(metrics["time/update_s"])
                out[name]["step"].append(metrics["time/step_s"])
    return out


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="gmts-overlap-cost-") as name:
        tmp = Path(name)
        on, off = _trainer(tmp, "on", True), _trainer(tmp, "off", False)
        for variant, seconds in selection_times(on, args.repeats).items():
            print(f"selection of one mini-batch, {variant} overlap: {_summary(seconds)}")
        for variant, rows in step_times(on, off, args.steps).items():
            for part, seconds in rows.items():
                print(f"training step ({part}), {variant} overlap: {_summary(seconds)}")
        for trainer in (on, off):
            trainer.logger.close()


if __name__ == "__main__":
    main()
