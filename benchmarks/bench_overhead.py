"""Item 3: the cost of token selection inside a full training step (tiny model, CPU).

Every variant is a ``gmts.train.trainer.Trainer`` built from the same warm start with the same
seed; they differ only in ``selection.score``:

- ``none``: all tokens (the baseline),
- ``entropy``: ETS top 20%,
- ``gmts``: GMTS top 20% (|entropy x omega|),
- ``gmts+metrics``: GMTS with the default selection logging on (GMTS-vs-ETS Jaccard overlap,
  which runs two more selections per step).

Each round restores every trainer to the same weights and optimizer state and then runs one
``train_step(0)`` per variant, the variants in rotating order. The same weights, the same
sampling seed and the same question stream make the rollouts of all variants identical, so the
difference between variants is the selection alone. "Rollout excluded" is the trainer's own
``time/update_s`` (old log-probs pass + scoring + selection + loss + backward + optimizer step);
"rollout included" is ``time/step_s`` (sampling and rewards too). Dynamic sampling is off, so
every step trains on all ``questions x group_size`` answers.

With ``--device cuda`` and ``GMTS_BENCH_MODEL`` set to ``benchmarks/gpu_model.py``'s randomly
initialised Qwen2.5-1.5B-shaped model, the same comparison runs on a GPU (item 6).

With ``--overhead-config FILE`` (and ``--overhead-set KEY=VALUE ...``) every variant is that
trainer config instead of the demo recipe, e.g. ``configs/smollm2-135m-instruct/base.yaml``: the
same comparison on a real model (issue 27, item 5: SmolLM2-135M, vocabulary 49,152), its own
questions, template, reward and lengths; only the selection, dynamic sampling (off), the held-out
evaluation (off) and the checkpoints (none) are changed.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench_common import BenchOptions, goal, ratio, summarize_times
from tiny_setup import StepShape, train_config, warm_model_path

VARIANTS = {  # name -> (selection score, selection logging on)
    "none": ("none", False),
    "entropy": ("entropy", False),
    "gmts": ("gmts", False),
    "gmts+metrics": ("gmts", True),
}


def variant_config(
    options: BenchOptions, name: str, output_dir: Path, shape: StepShape, model_path: Any
) -> Any:
    """``name``'s trainer config: the ``--overhead-config`` file's, or the demo recipe on the
    warm start at ``model_path`` with ``shape``."""
    score, metrics_on = VARIANTS[name]
    config_file = options.extra.get("overhead_config")
    if config_file:
        cfg = config_from_file(
            config_file, options.extra.get("overhead_set") or [], output_dir, score
        )
        return replace(cfg, logging=replace(cfg.logging, overlap_metrics=metrics_on))
    return train_config(
        model_path,
        output_dir,
        score=score,
        shape=shape,
        overlap_metrics=metrics_on,
        device=options.device,
        # every sampled answer is trained on: the same work in every step (and a random model
        # on the GPU, whose rewards are all 0, would leave DAPO nothing to keep)
        dynamic_sampling=False,
    )


def timed_rounds(
    trainers: dict[str, Any], initial: dict[str, tuple[dict, dict]], repeats: int
) -> dict[str, dict[str, list[float]]]:
    """Per variant, per timed round: its step's times, tokens and selected fraction. Round 0
    is a warm-up; in every round each trainer starts from its ``initial`` (model, optimizer)
    state and the variants take turns in rotating order."""
    samples: dict[str, dict[str, list[float]]] = {
        name: {"update": [], "step": [], "rollout": [], "tokens": [], "selected": []}
        for name in VARIANTS
    }
    names = list(VARIANTS)
    for round_index in range(1 + repeats):  # round 0 is a warm-up
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            trainer = trainers[name]
            model_state, optim_state = initial[name]
            trainer.model.load_state_dict(model_state)
            trainer.optimizer.load_state_dict(optim_state)
            metrics = trainer.train_step(0)
            if round_index == 0:
                continue
            s = samples[name]
            s["update"].append(metrics["time/update_s"])
            s["step"].append(metrics["time/step_s"])
            s["rollout"].append(metrics["time/rollout_s"])
            s["tokens"].append(metrics["response/tokens"])
            s["selected"].append(metrics.get("select/fraction", 1.0))
    return samples


def variant_rows(samples: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """Per variant: its medians and its ratios to ``none`` (of the medians, and paired)."""
    rows = []
    base = samples["none"]
    base_update = summarize_times(base["update"])["median_s"]
    base_step = summarize_times(base["step"])["median_s"]
    for name, s in samples.items():
        update = summarize_times(s["update"])
        step = summarize_times(s["step"])
        rows.append(
            {
                "variant": name,
                "score": VARIANTS[name][0],
                "selection_logging": VARIANTS[name][1],
                "update": update,
                "step": step,
                "rollout_median_s": summarize_times(s["rollout"])["median_s"],
                "tokens_per_step": sum(s["tokens"]) / len(s["tokens"]),
                "selected_fraction": sum(s["selected"]) / len(s["selected"]),
                "update_vs_none": ratio(update["median_s"], base_update),
                "step_vs_none": ratio(step["median_s"], base_step),
                # paired per round (same rollout): a steadier estimate on a noisy machine
                "update_vs_none_paired_median": _paired(s["update"], base["update"]),
                "step_vs_none_paired_median": _paired(s["step"], base["step"]),
            }
        )
    return rows


def overhead_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GMTS's step time within 5% of no selection's, without and with the rollout."""
    goals = []
    gmts_row = next(r for r in rows if r["variant"] == "gmts")
    for label, key in (
        ("rollout excluded", "update_vs_none"),
        ("rollout included", "step_vs_none"),
    ):
        value = gmts_row[key]
        goals.append(
            goal(
                f"GMTS step time vs no selection ({label})",
                "<= 1.05x",
                f"{value:.3f}x (paired {gmts_row[key + '_paired_median']:.3f}x)",
                value <= 1.05,
            )
        )
    return goals


def overhead_settings(
    options: BenchOptions, shape: StepShape, repeats: int, cfg: Any
) -> dict[str, Any]:
    """The record's ``settings`` (``cfg``: a variant's config, read with ``--overhead-config``)."""
    settings: dict[str, Any] = {
        "model": os.environ.get("GMTS_BENCH_MODEL")
        or "embedded warm start (GPT-2, 2 layers, width 128)",
        "device": options.device,
        "task": "addition",
        "algorithm": "dapo",
        "questions": shape.questions,
        "group_size": shape.group_size,
        "ratio": 0.2,
        "repeats": repeats,
    }
    config_file = options.extra.get("overhead_config")
    if config_file:
        settings.update(
            config=str(config_file),
            overrides=list(options.extra.get("overhead_set") or []),
            model=cfg.model.path,
            task=cfg.data.dataset,
            algorithm=cfg.algorithm,
            ratio=cfg.selection.ratio,
            max_response_length=cfg.rollout.max_response_length,
        )
    return settings


def run(options: BenchOptions) -> dict[str, Any]:
    import torch

    from gmts.train.trainer import Trainer

    torch.set_num_threads(options.threads)
    shape = StepShape(questions=8, group_size=4) if options.quick else StepShape()
    repeats = 2 if options.quick else int(options.extra.get("overhead_repeats", 20))
    if options.device != "cpu" and not options.quick:
        repeats = min(repeats, 10)  # a 1.5B model: keeps item 6 inside its 10-minute budget
    model_path = None if options.extra.get("overhead_config") else warm_model_path()
    trainers: dict[str, Any] = {}
    initial: dict[str, tuple[dict, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="gmts-bench-overhead-") as tmp:
        for name in VARIANTS:
            output_dir = Path(tmp) / name.replace("+", "_")
            cfg = variant_config(options, name, output_dir, shape, model_path)
            if options.extra.get("overhead_config"):  # the file's questions and group size
                shape = StepShape(cfg.rollout.questions_per_batch, cfg.rollout.group_size)
            trainer = Trainer(cfg)
            trainers[name] = trainer
            initial[name] = (  # kept in host memory: four models share one GPU
                {k: v.detach().to("cpu", copy=True) for k, v in trainer.model.state_dict().items()},
                copy.deepcopy(trainer.optimizer.state_dict()),  # empty before the first step
            )
        samples = timed_rounds(trainers, initial, repeats)
        for trainer in trainers.values():
            trainer.logger.close()
    rows = variant_rows(samples)
    return {
        "settings": overhead_settings(options, shape, repeats, next(iter(trainers.values())).cfg),
        "rows": rows,
        "goals": [] if options.quick else overhead_goals(rows),
    }


def config_from_file(path: str | Path, overrides: list[str], output_dir: Path, score: str) -> Any:
    """The trainer config in ``path`` with ``overrides`` (``section.field=value``), then what the
    comparison fixes: ``selection.score``, one step, every sampled answer trained on (dynamic
    sampling off), no held-out evaluation, no checkpoint, no progress bar, ``output_dir``."""
    from gmts.train.config import load_config

    cfg = load_config(path, list(overrides))
    return replace(
        cfg,
        threads=None,  # the benchmark runner sets the thread count
        data=replace(cfg.data, eval_questions=0, eval_before=False, eval_every=0),
        rollout=replace(cfg.rollout, dynamic_sampling=False),
        selection=replace(cfg.selection, score=score),
        optim=replace(cfg.optim, steps=1),
        checkpoint=replace(cfg.checkpoint, every=0, save_final=False),
        logging=replace(cfg.logging, output_dir=str(output_dir), progress=False),
    )


def _paired(values: list[float], baseline: list[float]) -> float:
    """Median over rounds of value / baseline of the same round."""
    import statistics

    return statistics.median(v / b for v, b in zip(values, baseline))
