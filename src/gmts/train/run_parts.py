"""A training run assembled from its parts: one frozen record, each part built by a function
whose arguments are what it needs, so the data flow (not a docstring) fixes the order.

:func:`build_run` reads top to bottom:

1. processes: the process group, the device, the dtype (``model.dtype: auto`` resolved), the
   checks that need no file (preflight.py);
2. seeds: the global RNGs, before anything draws from them;
3. run folder: resume, refuse or clear it and check that it takes files (run_folder.py);
4. data, first half: the task, or the dataset's rows, and the reward: a bad dataset or reward
   fails before any model is loaded;
5. model paths and the tokenizer (the embedded model's alphabet checked before its warm start
   is built);
6. data, second half: the dataset's prompts rendered with that tokenizer;
7. checks before any weight is read: LoRA targets, context, memory plan (preflight.py);
8. policy and reference (policy.py);
9. optimisation: AdamW, the schedule, the scorer every forward goes through, the loss, the
   rollout correction, the mini-batch layout;
10. restore (resuming only, restore.py): after every part that draws random numbers;
11. the rollout engine (engines.py);
12. logs: the metrics logger, the rows of steps about to be re-run dropped, the start recorded.

The loop that uses the parts is :class:`gmts.train.trainer.Trainer`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gmts.configuration import to_dict
from gmts.core.loss import LossConfig
from gmts.models.context import context_limit
from gmts.models.loading import EMBEDDED, load_tokenizer, pick_device
from gmts.scale.auto_dtype import DtypeChoice
from gmts.scale.distributed import DistInfo, init_distributed
from gmts.scale.strategy import Strategy
from gmts.train import preflight
from gmts.train.config import DATASET_MAX_NEW_TOKENS, TrainConfig
from gmts.train.correction import RolloutCorrection
from gmts.train.generation import run_generation
from gmts.train.metrics_log import EVAL_FILE, MetricsLogger, truncate_metrics
from gmts.train.policy import build_policy, resolve_base_path, resolve_dtype
from gmts.train.restore import RestoredCounters, restore_trainer_state
from gmts.train.rollout_engine import EngineInputs, RolloutEngine, make_engine
from gmts.train.run_folder import ResumeMode, RunStart, prepare_run_folder, record_start
from gmts.train.scoring import TokenScorer
from gmts.train.sources import (
    DatasetSource,
    HeldOutSet,
    QuestionSource,
    RewardFn,
    TaskSource,
    dataset_reward,
    held_out_overlap,
    held_out_set,
    load_examples,
    training_split,
)


@dataclass(frozen=True)
class Processes:
    """This process's place in the group (``info``), its ``device`` and what it computes in
    (``dtype``: ``model.dtype`` resolved on that device, with what was read and why)."""

    info: DistInfo
    device: torch.device
    dtype: DtypeChoice


@dataclass(frozen=True)
class RunFolder:
    """The run folder (``logging.output_dir``) and how the run starts in it."""

    path: Path
    start: RunStart

    @property
    def resume_from(self) -> Path | None:
        """The checkpoint the run resumes from (None: a fresh start)."""
        return self.start.checkpoint


@dataclass(frozen=True)
class DataRows:
    """The first half of the data: a built-in task, or a dataset's rows (not yet rendered)."""

    task: Any
    examples: preflight.Rows | None
    eval_examples: preflight.Rows | None
    reward_fn: RewardFn
    reward_expects: tuple[str, str]  # (the setting, what the reward expects): named by warnings
    max_new_tokens: int


@dataclass(frozen=True)
class DataParts:
    """Where questions come from and how answers are scored.

    Attributes:
        task: the built-in task (None for a dataset run).
        source: what the questions are drawn from (its position is saved in checkpoints).
        held_out: ``data.eval_dataset``'s questions (None: the task's, or none).
        reward_fn, reward_expects: the reward and what the zero-signal warning names.
        max_new_tokens: the generation budget of training and held-out evaluation.
    """

    task: Any
    source: QuestionSource
    held_out: HeldOutSet | None
    reward_fn: RewardFn
    reward_expects: tuple[str, str]
    max_new_tokens: int


@dataclass(frozen=True)
class ModelParts:
    """The tokenizer, the checks before weights, and the laid-out policy and reference."""

    tokenizer: Any
    load_path: str  # where the tokenizer and config come from (the checkpoint's when resuming)
    checked: preflight.WeightsCheck
    strategy: Strategy
    model: torch.nn.Module  # what trains (float32 master weights)
    reference: Any  # the KL reference (None without KL)


@dataclass(frozen=True)
class Optimization:
    """How the policy is updated.

    Attributes:
        optimizer, scheduler: AdamW over the trainable parameters and its LR schedule.
        scorer: every forward of the step goes through it.
        loss: the loss's configuration (``LossConfig.of``).
        correction: the rollout correction's weights (off: a no-op).
        minibatches: optimizer steps per epoch; ``rows_per_minibatch`` of this rank each.
        single_pass: one update on one micro-batch: its own forward gives the old log-probs.
    """

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scorer: TokenScorer
    loss: LossConfig
    correction: RolloutCorrection
    minibatches: int
    rows_per_minibatch: int
    single_pass: bool


@dataclass(frozen=True)
class RunParts:
    """Every part of one training run, as :func:`build_run` made them."""

    cfg: TrainConfig
    processes: Processes
    folder: RunFolder
    data: DataParts
    model: ModelParts
    optimization: Optimization
    counters: RestoredCounters  # where the loop starts (step 0 unless resuming)
    engine: RolloutEngine
    logger: MetricsLogger


def build_run(
    cfg: TrainConfig,
    *,
    resume: ResumeMode = False,
    overwrite: bool = False,
    allow_config_change: bool = False,
    reward_fn: RewardFn | None = None,
) -> RunParts:
    """The run ``cfg`` describes, built part by part (the module docstring lists the order);
    ``resume``, ``overwrite`` and ``allow_config_change`` are what the run may do with its
    folder (``--resume [auto]``, ``--overwrite``, ``--allow-config-change``); ``reward_fn``
    replaces the task's or ``data.reward``'s reward."""
    processes, cfg = start_processes(cfg)  # cfg from here on: model.dtype resolved
    seed_run(cfg)
    folder = open_run_folder(cfg, processes.info, resume, overwrite, allow_config_change)
    rows = open_data(cfg, reward_fn)
    if cfg.model.path == EMBEDDED:
        preflight.check_embedded_can_read(cfg, rows.examples, rows.eval_examples)
    base_path = resolve_base_path(cfg, processes.info, progress=cfg.logging.progress)
    load_path = str(folder.resume_from / "model") if folder.resume_from else base_path
    tokenizer = load_tokenizer(load_path, trust_remote_code=cfg.model.trust_remote_code)
    data = render_data(cfg, rows, tokenizer)
    model_config = preflight.read_model_config(cfg, load_path)
    data = fit_generation(
        cfg,
        data,
        tokenizer,
        context_limit(model_config, tokenizer, where=load_path),
        processes.info,
    )
    if processes.info.is_main:  # what the run computes in, after the settings line
        print(processes.dtype.line(), file=sys.stderr)
    checked = preflight.check_before_weights(
        cfg, model_config, load_path, tokenizer=tokenizer, data=data, **_where(processes)
    )
    strategy, policy = build_policy(
        cfg, base_path, **_where(processes), resume_from=folder.resume_from
    )
    model = ModelParts(tokenizer, load_path, checked, strategy, policy.model, policy.reference)
    optimization = build_optimization(cfg, model, data.max_new_tokens, processes.info)
    counters = RestoredCounters(step=0, skipped_total=0)
    if folder.resume_from is not None:
        counters = restore(cfg, folder.resume_from, model, optimization, data, processes.info)
    engine = start_engine(cfg, model, data, processes)
    logger = open_logs(cfg, folder, processes, counters.step)
    return RunParts(cfg, processes, folder, data, model, optimization, counters, engine, logger)


def _where(processes: Processes) -> dict[str, Any]:
    return {"info": processes.info, "device": processes.device}


def start_processes(cfg: TrainConfig) -> tuple[Processes, TrainConfig]:
    """The process group, this rank's device and its dtype (``model.dtype: auto`` resolved:
    :func:`gmts.train.policy.resolve_dtype`), after the checks that need no file; and ``cfg``
    with that dtype, which every later part reads."""
    info = init_distributed(cfg.model.device)
    device = pick_device(cfg.model.device, info.local_rank)
    cfg, dtype = resolve_dtype(cfg, device, info)
    preflight.check_processes(cfg, info, device)
    return Processes(info, device, dtype), cfg


def seed_run(cfg: TrainConfig) -> None:
    """The thread count (``threads``) and the global RNGs seeded with ``seed``: every later
    draw (the LoRA adapters' initialisation, sampling, dropout) follows from here."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)


def open_run_folder(
    cfg: TrainConfig,
    info: DistInfo,
    resume: ResumeMode,
    overwrite: bool,
    allow_config_change: bool,
) -> RunFolder:
    """Rank 0 checks (and with ``overwrite`` clears) the run folder; every rank gets its
    answer (the checkpoint's files are verified once, not once per rank)."""
    start = None
    if info.is_main:
        start = prepare_run_folder(
            cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change
        )
        if start.note is not None:
            print(f"gmts train: {start.note}", file=sys.stderr)
    if info.world_size > 1:
        import torch.distributed as dist

        shared = [start]
        dist.broadcast_object_list(shared, src=0, group=info.group)
        start = shared[0]
    assert start is not None
    return RunFolder(Path(cfg.logging.output_dir), start)


def open_data(cfg: TrainConfig, reward_fn: RewardFn | None) -> DataRows:
    """The first half of the data: needs no model, so a bad dataset, field or reward (a code
    reward without a sandbox) fails before any model is loaded."""
    task = examples = held = None
    if cfg.data.dataset is None:
        from gmts.embedded.tasks import get_task

        task = get_task(cfg.data.task)
        fn = reward_fn or task.reward
        expects = (f"data.task={task.name}", task.reward_description)
        budget = cfg.rollout.max_response_length or task.max_new_tokens
    else:
        from gmts.rewards.registry import reward_description

        fn = reward_fn or dataset_reward(cfg.data.reward, sandbox=cfg.data.sandbox)
        expects = (f"data.reward={cfg.data.reward}", reward_description(cfg.data.reward))
        fields = {"question_field": cfg.data.question_field, "answer_field": cfg.data.answer_field}
        split = training_split(cfg.data.dataset, cfg.data.split)
        examples = load_examples(cfg.data.dataset, split=split, **fields)
        overlap = held_out_overlap(cfg.data.dataset, cfg.data.split, cfg.data.eval_dataset)
        if overlap is not None:
            warnings.warn(overlap, UserWarning, stacklevel=4)
        if cfg.data.eval_dataset is not None:
            held = load_examples(
                cfg.data.eval_dataset, split=None, what="data.eval_dataset", **fields
            )
        budget = cfg.rollout.max_response_length or DATASET_MAX_NEW_TOKENS  # fitted later
    if reward_fn is not None:
        expects = ("the reward_fn given to the trainer", "")
    return DataRows(task, examples, held, fn, expects, budget)


def render_data(cfg: TrainConfig, rows: DataRows, tokenizer: Any) -> DataParts:
    """The second half of the data: the dataset's prompts (and ``data.eval_dataset``'s)
    rendered with the model's tokenizer; a task run's source draws from the task."""
    r = cfg.rollout
    source: QuestionSource
    if rows.examples is None:
        source = TaskSource(rows.task, cfg.seed)
    else:
        source = DatasetSource(
            rows.examples,
            tokenizer=tokenizer,
            template=cfg.data.template,
            max_prompt_tokens=r.max_prompt_length,
            shuffle=cfg.data.shuffle,
            seed=cfg.seed,
        )
    held_out = None
    if rows.eval_examples is not None and cfg.data.eval_questions > 0:
        held_out = held_out_set(
            rows.eval_examples,
            questions=cfg.data.eval_questions,
            tokenizer=tokenizer,
            template=cfg.data.template,
            max_prompt_tokens=r.max_prompt_length,
            reward_fn=rows.reward_fn,
            max_new_tokens=rows.max_new_tokens,
        )
    return DataParts(
        rows.task, source, held_out, rows.reward_fn, rows.reward_expects, rows.max_new_tokens
    )


def fit_generation(
    cfg: TrainConfig, data: DataParts, tokenizer: Any, limit: Any, info: DistInfo
) -> DataParts:
    """The data with the run's generation budget: the task's own or the one set, or for a
    dataset with ``rollout.max_response_length: null`` one fitted to its answers and the
    model's context ``limit`` (:func:`gmts.train.generation.run_generation`); rank 0 prints
    the template, temperature and budget with the keys that change them."""
    generation = run_generation(
        cfg,
        tokenizer,
        limit,
        source=data.source,
        held_out=data.held_out,
        max_new_tokens=data.max_new_tokens,
    )
    if info.is_main:
        print(generation.line, file=sys.stderr)
    return dataclasses.replace(
        data, max_new_tokens=generation.max_new_tokens, held_out=generation.held_out
    )


def lr_lambda(cfg: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """Warmup then constant or cosine (to ``min_lr_ratio``), as a multiplier of the peak lr."""
    o = cfg.optim

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        span = max(total_steps - o.warmup_steps, 1)
        progress = min((step - o.warmup_steps) / span, 1.0)
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


FUSED_DEVICES = ("cpu", "cuda")
"""Devices whose parameters ``adamw: auto`` updates with torch's fused AdamW."""


def adamw_implementation(choice: str, params: list[torch.nn.Parameter]) -> dict[str, bool]:
    """``torch.optim.AdamW``'s keyword for ``optim.adamw``: ``{"fused": True}``,
    ``{"foreach": True}``, ``{"foreach": False}`` (one parameter at a time) or {} (torch's
    default). ``auto`` takes fused when every parameter is a plain tensor (not a DTensor of
    FSDP2, whose default stays) in a floating dtype on a device of :data:`FUSED_DEVICES`."""
    if choice == "fused":
        return {"fused": True}
    if choice == "foreach":
        return {"foreach": True}
    if choice == "for-loop":
        return {"foreach": False}
    plain = all(
        type(p.data) is torch.Tensor and p.is_floating_point() and p.device.type in FUSED_DEVICES
        for p in params
    )
    return {"fused": True} if params and plain else {}


def build_optimization(
    cfg: TrainConfig, model: ModelParts, max_new_tokens: int, info: DistInfo
) -> Optimization:
    """AdamW over the policy's trainable parameters (float32 masters: its state is float32
    too), the LR schedule over every optimizer step of the run, the scorer, the loss, the
    rollout correction and the mini-batch layout of this rank."""
    r, world = cfg.rollout, info.world_size
    minibatches = r.questions_per_batch // cfg.mini_batch_questions
    params = [p for p in model.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.optim.lr,
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
        **adamw_implementation(cfg.optim.adamw, params),
    )
    total_opt_steps = cfg.optim.steps * minibatches * cfg.optim.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_opt_steps))
    scorer = TokenScorer(
        temperature=r.temperature,
        chunk_size=cfg.model.logits_chunk_size,
        autocast=model.strategy.autocast,
        layout=cfg.model.forward_layout,
        forward_group=info.group if model.strategy.collective_forward else None,
    )
    rows_per_rank = r.questions_per_batch // world * r.group_size
    # One update per rollout on one micro-batch: the loss's own forward can give the old
    # log-probs (Trainer.train_step, step 3) instead of a separate no-grad pass.
    single_pass = (
        minibatches == 1 and cfg.optim.epochs == 1 and rows_per_rank <= cfg.optim.micro_batch_size
    )
    return Optimization(
        optimizer=optimizer,
        scheduler=scheduler,
        scorer=scorer,
        loss=LossConfig.of(cfg.objective, cfg.selection, horizon=max_new_tokens),
        correction=RolloutCorrection(r.correction, r.correction_cap),
        minibatches=minibatches,
        rows_per_minibatch=cfg.mini_batch_questions // world * r.group_size,
        single_pass=single_pass,
    )


def restore(
    cfg: TrainConfig,
    checkpoint: Path,
    model: ModelParts,
    optimization: Optimization,
    data: DataParts,
    info: DistInfo,
) -> RestoredCounters:
    """Resuming: the checkpoint's optimizer, schedule, source and RNG states put back
    (:mod:`gmts.train.restore`); comes after the last part that draws random numbers."""
    return restore_trainer_state(
        checkpoint,
        strategy_name=cfg.distributed.strategy,
        strategy=model.strategy,
        model=model.model,
        optimizer=optimization.optimizer,
        scheduler=optimization.scheduler,
        source=data.source,
        info=info,
        stacklevel=5,  # the warning points at the Trainer(...) call
    )


def start_engine(
    cfg: TrainConfig, model: ModelParts, data: DataParts, processes: Processes
) -> RolloutEngine:
    """Who samples (``rollout.engine``): the policy itself, or a colocated vLLM engine started
    from the same weights (:mod:`gmts.train.rollout_engine`)."""
    return make_engine(
        EngineInputs(
            cfg=cfg,
            model=model.model,
            tokenizer=model.tokenizer,
            strategy=model.strategy,
            info=processes.info,
            device=processes.device,
            model_path=model.load_path,
            model_config=model.checked.model_config,
            prompt_tokens=model.checked.prompt_tokens,
            max_new_tokens=data.max_new_tokens,
        )
    )


def open_logs(
    cfg: TrainConfig, folder: RunFolder, processes: Processes, step: int
) -> MetricsLogger:
    """The run folder's writes, last, once the run is sure to start: the logger and, on rank
    0, the metrics rows of steps about to be re-run dropped and the start recorded (with the
    dtype choice)."""
    info = processes.info
    logger = MetricsLogger(
        folder.path,
        report_to=cfg.logging.report_to,
        enabled=info.is_main,
        wandb_project=cfg.logging.wandb_project,
        config=to_dict(cfg),
    )
    if info.is_main:
        # Resumed: drop the rows of steps about to be re-run. Fresh: drop an earlier run's
        # rows in the same directory (appending would mix two runs in one file).
        # The evaluations of the checkpoint's own step come after its save: they run again.
        last = step if folder.resume_from is not None else -1
        truncate_metrics(folder.path, last)
        truncate_metrics(folder.path, last - 1, EVAL_FILE)
        record_start(folder.path, cfg, folder.start, step, processes.dtype.record())
        if folder.resume_from is not None:
            print(f"gmts train: resumed from step {step} ({folder.resume_from})", file=sys.stderr)
    return logger
