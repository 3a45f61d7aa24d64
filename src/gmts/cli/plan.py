"""``gmts plan``: the per-rank memory plan of a training config, before anything is loaded.

    gmts plan --config configs/qwen3-8b/dapo-gmts.yaml --gpus 8 --gpu-gib 80
    gmts plan --config configs/demo.yaml                 # the embedded model (built if needed)
    gmts plan --shipped configs --markdown               # docs/training.md's table
    gmts plan --shipped configs --markdown model.lora.rank=64   # ... its LoRA rows

Reads only the model's config.json (a hub id that cannot be reached falls back to the
transcribed shapes of gmts.scale.known_models). The plan is what ``gmts train`` prints at start
and enforces on CUDA; see gmts.scale.memory_plan for what it counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

SETUPS = ((1, 80.0), (8, 80.0), (1, 141.0))
"""GPU count x GiB per GPU of the docs table: 1x and 8x 80 GB (A100/H100), 1x 141 GB (H200)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", default=None, help="YAML training config")
    parser.add_argument("overrides", nargs="*", metavar="section.field=value")
    parser.add_argument("--gpus", type=int, default=1, help="processes (GPUs), default 1")
    parser.add_argument(
        "--gpu-gib", type=float, default=None, help="memory per GPU in GiB: say whether it fits"
    )
    parser.add_argument(
        "--shipped",
        metavar="CONFIGS_DIR",
        default=None,
        help="plan every <dir>/*/base.yaml (with the overrides) on 1x80, 8x80 and 1x141 GiB and "
        "print one table",
    )
    parser.add_argument("--markdown", action="store_true", help="--shipped: as Markdown")


def _indivisible(cfg, gpus: int) -> str | None:
    """The batch setting ``gpus`` ranks cannot share evenly (e.g. "rollout.questions_per_batch
    (3)"), or None."""
    for name, value in (
        ("rollout.questions_per_batch", cfg.rollout.questions_per_batch),
        ("optim.mini_batch_questions", cfg.mini_batch_questions),
    ):
        if value % gpus:
            return f"{name} ({value})"
    return None


def _plan(cfg, gpus: int, gpu_bytes: float | None = None):
    """(plan, where the model shape came from) of a TrainConfig on ``gpus`` ranks of
    ``gpu_bytes`` each (None: unknown; a vllm engine is then counted at what one generation
    batch needs instead of its share of the GPU)."""
    from gmts.models.loading import resolve_model_path
    from gmts.scale.known_models import model_config
    from gmts.scale.memory_plan import PlanSettings, plan_memory
    from gmts.train.config import DATASET_MAX_NEW_TOKENS

    # as the trainer reads model.path: the embedded warm start, a folder, a run or checkpoint
    # (a LoRA run's: its base), or a hub id
    path = resolve_model_path(
        cfg.model.path, task=cfg.data.task, seed=cfg.seed, progress=sys.stderr.isatty()
    )
    config, source = model_config(path, cfg.model.trust_remote_code)
    r = cfg.rollout
    if cfg.data.dataset is None:
        from gmts.embedded.tasks import get_task

        task = get_task(cfg.data.task)
        prompt, response = task.prompt_length, r.max_response_length or task.max_new_tokens
    else:
        prompt, response = r.max_prompt_length, r.max_response_length or DATASET_MAX_NEW_TOKENS
    if problem := _indivisible(cfg, gpus):
        raise ValueError(f"{problem} must be divisible by --gpus {gpus}")
    settings = PlanSettings.from_config(
        cfg,
        world_size=gpus,
        prompt_length=prompt,
        response_length=response,
        device_bytes=gpu_bytes,
    )
    return plan_memory(config, settings), source


def shipped_table(
    configs_dir: Path, markdown: bool = True, overrides: list[str] | tuple[str, ...] = ()
) -> str:
    """Peak GiB per rank of every ``<configs_dir>/*/base.yaml`` (with ``overrides``, e.g.
    ``model.lora.rank=64``) on the :data:`SETUPS`."""
    from gmts.scale.memory_plan import DEVICE_HEADROOM, GIB
    from gmts.train.config import load_config

    head = ["config", "model", "strategy"] + [f"{n}x{g:g} GiB" for n, g in SETUPS]
    rows = []
    for base in sorted(configs_dir.glob("*/base.yaml")):
        cfg = load_config(base, list(overrides))
        cells = []
        params = ""
        for gpus, gib in SETUPS:
            if problem := _indivisible(cfg, gpus):  # this config's batch on these ranks: no
                cells.append(f"n/a: {problem} not divisible by {gpus}")
                continue
            plan, _ = _plan(cfg, gpus, gib * GIB)
            params = f"{plan.shape.params / 1e9:.2f}B"
            if cfg.model.lora is not None:
                params += (
                    f"; LoRA rank {cfg.model.lora.rank}: "
                    f"{plan.shape.adapter_params / 1e6:.1f}M trainable"
                )
            fits = plan.peak <= DEVICE_HEADROOM * gib * GIB
            cells.append(
                f"{plan.peak / GIB:.1f} ({plan.peak_phase}) {'fits' if fits else '**does not fit**'}"
            )
        rows.append(
            [base.parent.name, f"{cfg.model.path} ({params})", cfg.distributed.strategy, *cells]
        )
    if not markdown:
        return "\n".join("  ".join(r) for r in [head, *rows])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gmts.scale.auto_dtype import AUTO
    from gmts.scale.memory_plan import GIB, MemoryPlanError, check_fits_device
    from gmts.train.config import load_config

    try:
        if args.shipped:
            table = shipped_table(Path(args.shipped), args.markdown, list(args.overrides))
            print(table)
            return 0
        if args.gpus < 1:
            raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
        cfg = load_config(args.config, list(args.overrides))
        gpu_bytes = None if args.gpu_gib is None else args.gpu_gib * GIB
        plan, source = _plan(cfg, args.gpus, gpu_bytes)
        full = None
        if cfg.model.lora is not None:  # the same run without LoRA: what the adapters save
            full_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora=None))
            full, _ = _plan(full_cfg, args.gpus, gpu_bytes)
    except ValueError as exc:
        print(f"gmts plan: error: {exc}", file=sys.stderr)
        return 2
    print(f"model: {source}")
    if cfg.model.dtype == AUTO:
        print(
            f"model.dtype: auto, counted as {plan.settings.dtype} (planned for GPUs with bf16 "
            "tensor cores, compute capability >= 8.0; gmts train picks float32 on an older GPU "
            "or a CPU without bf16 instructions: plan model.dtype=float32 for those)"
        )
    print(plan.table())
    if full is not None:
        unit, scale = ("GiB", GIB) if full.peak >= GIB else ("MiB", 2**20)
        print(
            f"full fine-tuning (model.lora=null) would peak at {full.peak / scale:.2f} {unit} "
            f"({full.peak_phase}); LoRA saves {(full.peak - plan.peak) / scale:.2f} {unit} "
            f"per rank"
        )
    if args.gpu_gib is not None:
        try:
            check_fits_device(plan, int(args.gpu_gib * GIB), f"a {args.gpu_gib:g} GiB GPU")
        except MemoryPlanError as exc:
            print(f"does not fit: {exc}")
            return 1
        print(f"fits on a {args.gpu_gib:g} GiB GPU")
    return 0
