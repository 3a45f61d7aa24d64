"""Pre-flight checks of a training run: everything that can refuse a run before the expensive
parts (building the embedded warm start, reading weights, starting an engine) begin.

Each check is a function of what it needs and raises a ``ValueError`` (or
:class:`gmts.models.context.ContextError`) naming the setting to change; the run's builder
(:func:`gmts.train.run_parts.build_run`) calls them in the order their inputs exist:

1. :func:`check_processes`: the batch divides among the processes, the rollout engine's
   settings hold (no file read yet);
2. :func:`check_embedded_can_read`: a dataset's text encodes with the embedded model's
   tokenizer (before its warm start is built, minutes on first use);
3. :func:`read_model_config`: the LoRA targets exist in the model's config, the forward
   layout can run it;
4. :func:`check_before_weights`: the longest prompt plus the budget fits the model's
   positions, the run fits the device (the memory plan), before any weight is read.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any

import torch

from gmts.models.context import check_fits, context_limit, longest_prompt
from gmts.models.loading import load_model_config
from gmts.models.lora import check_targets
from gmts.scale.distributed import DistInfo
from gmts.scale.memory_plan import GIB, MemoryPlan, PlanSettings, check_fits_device, plan_memory
from gmts.train.config import TrainConfig
from gmts.train.generation import dataset_context_settings
from gmts.train.rollout_engine import check_engine
from gmts.train.scoring import check_forward_layout
from gmts.train.sources import DatasetSource

Rows = list[tuple[str, str]]  # a dataset's (question, answer) pairs (sources.load_examples)


def check_processes(cfg: TrainConfig, info: DistInfo, device: torch.device) -> None:
    """The batch and the mini-batch divide among the ``info.world_size`` processes, and the
    rollout engine's settings hold on ``device`` (vLLM installed, ...)."""
    world = info.world_size
    for name, value in (
        ("rollout.questions_per_batch", cfg.rollout.questions_per_batch),
        ("optim.mini_batch_questions", cfg.mini_batch_questions),
    ):
        if value % world:
            raise ValueError(f"{name} ({value}) must be divisible by the {world} processes")
    check_engine(cfg, device)


def check_embedded_can_read(cfg: TrainConfig, *datasets: Rows | None) -> None:
    """Render ``data.dataset``'s and ``data.eval_dataset``'s rows with the embedded model's
    tokenizer: text it cannot encode fails now (train/alphabet.py), before its warm start."""
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    for what, examples in zip(("data.dataset", "data.eval_dataset"), datasets):
        if examples:
            DatasetSource(
                examples,
                tokenizer=tokenizer,
                template=cfg.data.template,
                max_prompt_tokens=cfg.rollout.max_prompt_length,
                shuffle=False,
                seed=0,
                what=what,
            )


@dataclass(frozen=True)
class WeightsCheck:
    """What the checks before any weight is read give the later parts.

    Attributes:
        model_config: the model's config (read from ``load_path``'s files, no weights).
        prompt_tokens: the longest prompt in tokens (sizes the vLLM engine and the plan).
        memory_plan: the per-rank memory plan, or None where it cannot be computed.
    """

    model_config: Any
    prompt_tokens: int
    memory_plan: MemoryPlan | None


def read_model_config(cfg: TrainConfig, load_path: str) -> Any:
    """The model's config (its files, no weights), after checking that the LoRA targets exist
    in it and that ``model.forward_layout`` can run it."""
    remote = cfg.model.trust_remote_code
    model_config = load_model_config(load_path, trust_remote_code=remote)
    check_targets(model_config, cfg.model.lora, trust_remote_code=remote)
    check_forward_layout(cfg.model.forward_layout, model_config)
    return model_config


def check_before_weights(
    cfg: TrainConfig,
    model_config: Any,
    load_path: str,
    *,
    tokenizer: Any,
    data: Any,
    info: DistInfo,
    device: torch.device,
) -> WeightsCheck:
    """Does the longest prompt plus the budget fit the model (``model_config``, from
    :func:`read_model_config`), does the run fit the device? ``data`` is the run's
    :class:`gmts.train.run_parts.DataParts`, its budget fitted."""
    prompt_tokens = check_context(cfg, model_config, load_path, tokenizer, data, info)
    plan = memory_plan(cfg, model_config, info, device, prompt_tokens, data.max_new_tokens)
    return WeightsCheck(model_config, prompt_tokens, plan)


def check_context(
    cfg: TrainConfig, model_config: Any, path: str, tokenizer: Any, data: Any, info: DistInfo
) -> int:
    """The longest prompt in tokens, after checking that it plus the generation budget fits
    the model's positions (:mod:`gmts.models.context`); raises ContextError otherwise."""
    limit = context_limit(model_config, tokenizer, where=path)
    if isinstance(data.source, DatasetSource):
        src = data.source
        longest = max(src.longest_prompt, data.held_out.longest_prompt if data.held_out else 0)
        kept = len(src.problems)
        what = (
            f"data.dataset {cfg.data.dataset} ({kept} prompts kept; "
            f"{src.skipped_too_long} longer than rollout.max_prompt_length="
            f"{cfg.rollout.max_prompt_length} dropped at load)"
        )
        settings = dataset_context_settings(cfg, tokenizer)
        if info.is_main and src.skipped_too_long:
            print(
                f"data: dropped {src.skipped_too_long} of {kept + src.skipped_too_long} "
                f"prompts longer than rollout.max_prompt_length="
                f"{cfg.rollout.max_prompt_length} tokens",
                file=sys.stderr,
            )
    else:
        assert data.task is not None
        prompts = [p.prompt for p in data.task.held_out(64)]
        prompts += [p.prompt for p in data.task.sample(64, random.Random(0))]
        longest = longest_prompt(tokenizer, prompts)
        what = f"data.task {cfg.data.task}"
        settings = "rollout.max_response_length"
    check_fits(
        prompt_tokens=longest,
        new_tokens=data.max_new_tokens,
        limit=limit,
        what=what,
        settings=settings,
    )
    return longest


def memory_plan(
    cfg: TrainConfig,
    model_config: Any,
    info: DistInfo,
    device: torch.device,
    prompt_tokens: int,
    max_new_tokens: int,
) -> MemoryPlan | None:
    """The per-rank memory plan (printed by rank 0); on CUDA, refuse a run that does not fit
    (``distributed.check_memory``)."""
    on_gpu = device.type == "cuda"
    settings = PlanSettings.from_config(
        cfg,
        world_size=info.world_size,
        prompt_length=prompt_tokens,
        response_length=max_new_tokens,
        gpu=on_gpu,
        device_bytes=torch.cuda.get_device_properties(device).total_memory if on_gpu else None,
    )
    try:
        plan = plan_memory(model_config, settings)
    except Exception as exc:  # an architecture the probe cannot build: say so, go on
        if info.is_main:
            print(f"memory plan unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None
    if info.is_main:  # the whole table for real models, one line for tiny ones
        print(plan.table() if plan.peak >= GIB else plan.summary(), file=sys.stderr)
    if on_gpu and cfg.distributed.check_memory:
        props = torch.cuda.get_device_properties(device)
        check_fits_device(plan, props.total_memory, f"{device} ({props.name})")
    return plan
