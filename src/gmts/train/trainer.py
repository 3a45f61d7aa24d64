"""The standalone RLVR trainer: GRPO / DAPO with token selection (none, ETS, GMTS, ...).

One training step is ``Trainer.train_step``, readable top to bottom:

    1. rollout (collect.py): G samples per question, rewards (a raising reward fn gives 0 and
       is counted) [+ DAPO overlong punishment], DAPO dynamic sampling, group advantages
    2. reference log-probs if KL (scoring.py, no grad)
    3. the rollout policy's log-probs and entropies (no grad, micro-batched; one update on
       one micro-batch: that update's own forward, whose loss reuses it) and the rollout
       correction's weights, once
    4. for each epoch, for each mini-batch (update.train_minibatch): scores of the current
       policy, ONE global selection, one global divisor, micro-batched backward, one
       optimizer step

Departures from the paper and why (see docs/training.md for the full list):
- mini-batches are taken in order (no shuffling) so that groups stay whole and runs are
  reproducible; the paper does not specify an order.
- when dynamic sampling hits ``max_sampling_rounds``, the batch is topped up with dropped
  groups, given advantage 0, instead of failing (verl's DAPO recipe raises), so every rank
  keeps the same shapes.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gmts.configuration import to_dict
from gmts.core.distributed import all_reduce_sum
from gmts.core.loss import LossConfig
from gmts.models.context import check_fits, context_limit, longest_prompt
from gmts.models.loading import (
    EMBEDDED,
    load_model_config,
    load_tokenizer,
    pick_device,
    step_dir_name,
)
from gmts.models.lora import check_targets
from gmts.scale.distributed import DistInfo, barrier, init_distributed
from gmts.scale.memory_plan import (
    GIB,
    MemoryPlan,
    PlanSettings,
    check_fits_device,
    plan_memory,
)
from gmts.train import checkpoint as ckpt
from gmts.train.batch import ScoredBatch
from gmts.train.collect import CollectedBatch, collect_batch
from gmts.train.config import DATASET_MAX_NEW_TOKENS, TrainConfig
from gmts.train.correction import RolloutCorrection
from gmts.train.engines import (
    EngineInputs,
    RolloutEngine,
    check_engine,
    logprob_gap_metrics,
    make_engine,
)
from gmts.train.evaluation import evaluate_held_out
from gmts.train.metrics_log import EVAL_FILE, MetricsLogger, truncate_metrics
from gmts.train.policy import build_policy, resolve_base_path, resolve_dtype
from gmts.train.preemption import (
    PreemptionGuard,
    TrainingPreempted,
    clear_marker,
    write_marker,
)
from gmts.train.restore import restore_trainer_state
from gmts.train.run_folder import ResumeMode, RunStart, prepare_run_folder, record_start
from gmts.train.scoring import TokenScorer, needs_logit_grad_norm
from gmts.train.signal_watch import ZERO_SIGNAL_STEPS, ZeroSignalWatch
from gmts.train.sources import (
    DatasetSource,
    HeldOutSet,
    QuestionSource,
    RewardFn,
    TaskSource,
    dataset_reward,
    held_out_set,
    load_examples,
)
from gmts.train.update import UpdateResult, train_minibatch, update_metrics

_Rows = list[tuple[str, str]]  # a dataset's (question, answer) pairs (sources.load_examples)


@dataclass
class TrainResult:
    """What :func:`train` returns: the run directory, per-step metrics and held-out evals."""

    run_dir: Path
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    eval_before: dict[str, float] | None = None
    eval_after: dict[str, float] | None = None


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


class Trainer:
    """Owns the model, optimizer, data source and logger of one run."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resume: ResumeMode = False,
        overwrite: bool = False,
        allow_config_change: bool = False,
        reward_fn: RewardFn | None = None,
    ) -> None:
        """Build the run from its parts, in this order (each part's docstring says what it
        needs and what it gives):

        1. processes (``_check_processes``): the process group, the divisibility of the batch
           by the processes, the device, ``model.dtype`` (``auto`` resolved) and the rollout
           engine's settings; nothing read yet;
        2. seeds (``_seed``): the global RNGs, before anything draws from them;
        3. run folder (``_start_in_run_folder``): resume, refuse or clear it and check that it
           takes files, before any data or model work; ``resume``, ``overwrite``, ``allow_config_change`` are what the run
           may do with it (``--resume [auto]``, ``--overwrite``, ``--allow-config-change``,
           :mod:`gmts.train.run_folder`);
        4. source, first half (``_open_source``): the task, or the dataset's rows, and the
           reward: a bad dataset or reward fails before any model is loaded;
        5. model paths (``_model_paths``) and the tokenizer: the embedded model's alphabet is
           checked before its warm start is built;
        6. source, second half (``_render_source``): the dataset's prompts rendered with that
           tokenizer;
        7. checks before any weight is read (``_check_before_weights``): LoRA targets, context,
           the dtype (printed) and the memory plan;
        8. policy (``_build_policy``): precision, strategy, weights;
        9. optimizer and schedule (``_build_optimization``), with the scorer and the loss;
        10. restore (``_restore``, resuming only, :mod:`gmts.train.restore`): after every part
            that draws random numbers, so that its RNG states are the last word;
        11. the rollout engine (``_make_engine``);
        12. the run folder's writes (``_open_logs``): the metrics logger, the rows of steps
            about to be re-run dropped, the start recorded.
        """
        self.cfg = cfg
        self._check_processes()
        self._seed()
        self.run_dir = Path(cfg.logging.output_dir)
        self.start = self._start_in_run_folder(resume, overwrite, allow_config_change)
        self.resume_from = self.start.checkpoint
        examples, eval_examples = self._open_source(reward_fn)
        self._signal_watch: ZeroSignalWatch | None = None  # made at the first step (rank 0)
        base_path, load_path = self._model_paths(examples, eval_examples)
        self.tokenizer = load_tokenizer(load_path, trust_remote_code=cfg.model.trust_remote_code)
        self._render_source(examples, eval_examples)
        model_config = self._check_before_weights(load_path)
        self._build_policy(base_path)
        self._build_optimization()
        self.step = 0
        self.skipped_total = 0
        if self.resume_from is not None:
            self._restore()
        self.rollout_engine = self._make_engine(load_path, model_config)
        self._open_logs()

    # ------------------------------------------------------------------ the parts, in order

    def _check_processes(self) -> None:
        """Needs ``cfg``. Gives ``info`` (this process's place in the group), ``device`` and
        ``dtype_choice`` (``cfg`` from here on has ``model.dtype`` resolved:
        :func:`gmts.train.policy.resolve_dtype`), after the checks that need no file: the batch
        and the mini-batch divide among the processes, and the rollout engine's settings hold
        (vLLM installed, ...)."""
        cfg = self.cfg
        self.info: DistInfo = init_distributed(cfg.model.device)
        world = self.info.world_size
        for name, value in (
            ("rollout.questions_per_batch", cfg.rollout.questions_per_batch),
            ("optim.mini_batch_questions", cfg.mini_batch_questions),
        ):
            if value % world:
                raise ValueError(f"{name} ({value}) must be divisible by the {world} processes")
        self.device = pick_device(cfg.model.device, self.info.local_rank)
        # model.dtype=auto resolved once: every later part reads the dtype the run computes in
        self.cfg, self.dtype_choice = resolve_dtype(cfg, self.device, self.info)
        check_engine(self.cfg, self.device)

    def _seed(self) -> None:
        """The thread count (``threads``) and the global RNGs seeded with ``seed``: every later
        draw (the LoRA adapters' initialisation, sampling, dropout) follows from here."""
        if self.cfg.threads is not None:
            torch.set_num_threads(self.cfg.threads)
        random.seed(self.cfg.seed)
        torch.manual_seed(self.cfg.seed)

    def _start_in_run_folder(
        self, resume: ResumeMode, overwrite: bool, allow_config_change: bool
    ) -> RunStart:
        """Rank 0 checks (and with ``overwrite`` clears) the run folder; every rank gets its
        answer (the checkpoint's files are verified once, not once per rank)."""
        start = None
        if self.info.is_main:
            start = prepare_run_folder(
                self.cfg,
                resume=resume,
                overwrite=overwrite,
                allow_config_change=allow_config_change,
            )
            if start.note is not None:
                print(f"gmts train: {start.note}", file=sys.stderr)
        if self.info.world_size > 1:
            import torch.distributed as dist

            shared = [start]
            dist.broadcast_object_list(shared, src=0, group=self.info.group)
            start = shared[0]
        assert start is not None
        return start

    def _open_source(self, reward_fn: RewardFn | None) -> tuple[_Rows | None, _Rows | None]:
        """The first half of the data and reward source: needs no model, so a bad dataset,
        field or reward (a code reward without a sandbox) fails before any model is loaded.

        Gives ``task`` and ``source`` (a built-in task), or the dataset's rows (returned, with
        ``data.eval_dataset``'s; ``_render_source`` turns them into prompts once the tokenizer
        is there); ``reward_fn`` (the one given, else the task's or ``data.reward``),
        ``reward_expects`` (what the zero-signal warning names) and ``max_new_tokens``."""
        cfg, r = self.cfg, self.cfg.rollout
        self.task = None
        self.held_out: HeldOutSet | None = None  # data.eval_dataset's questions
        examples = eval_examples = None
        if cfg.data.dataset is None:
            from gmts.embedded.tasks import get_task

            self.task = get_task(cfg.data.task)
            self.source: QuestionSource = TaskSource(self.task, cfg.seed)
            self.reward_fn = reward_fn or self.task.reward
            self.reward_expects = (f"data.task={self.task.name}", self.task.reward_description)
            self.max_new_tokens = r.max_response_length or self.task.max_new_tokens
        else:
            self.reward_fn = reward_fn or dataset_reward(cfg.data.reward, sandbox=cfg.data.sandbox)
            from gmts.rewards.registry import reward_description

            self.reward_expects = (
                f"data.reward={cfg.data.reward}",
                reward_description(cfg.data.reward),
            )
            examples = load_examples(
                cfg.data.dataset,
                split=cfg.data.split,
                question_field=cfg.data.question_field,
                answer_field=cfg.data.answer_field,
            )
            if cfg.data.eval_dataset is not None:
                eval_examples = load_examples(
                    cfg.data.eval_dataset,
                    split=None,
                    question_field=cfg.data.question_field,
                    answer_field=cfg.data.answer_field,
                    what="data.eval_dataset",
                )
            self.max_new_tokens = r.max_response_length or DATASET_MAX_NEW_TOKENS
        if reward_fn is not None:
            self.reward_expects = ("the reward_fn given to the trainer", "")
        return examples, eval_examples

    def _model_paths(self, examples: _Rows | None, eval_examples: _Rows | None) -> tuple[str, str]:
        """Gives the base model's folder (``model.path`` resolved) and the folder the run
        loads its tokenizer and config from (the checkpoint's model when resuming).

        Needs the dataset's rows: the embedded model's tokenizer is known before its warm start
        is built (minutes on first use), so text it cannot encode fails first. Rank 0 builds
        (and caches) the warm start, then the other ranks resolve the same path."""
        if self.cfg.model.path == EMBEDDED:
            self._check_embedded_can_read(examples, eval_examples)
        base_path = resolve_base_path(self.cfg, self.info, progress=self.cfg.logging.progress)
        load_path = str(self.resume_from / "model") if self.resume_from else base_path
        return base_path, load_path

    def _render_source(self, examples: _Rows | None, eval_examples: _Rows | None) -> None:
        """The second half of the source: needs the tokenizer (prompts are rendered with it).
        Gives a dataset run's ``source`` and, with ``data.eval_dataset``, ``held_out``."""
        cfg, r = self.cfg, self.cfg.rollout
        if examples is not None:
            self.source = DatasetSource(
                examples,
                tokenizer=self.tokenizer,
                template=cfg.data.template,
                max_prompt_tokens=r.max_prompt_length,
                shuffle=cfg.data.shuffle,
                seed=cfg.seed,
            )
        if eval_examples is not None and cfg.data.eval_questions > 0:
            self.held_out = held_out_set(
                eval_examples,
                questions=cfg.data.eval_questions,
                tokenizer=self.tokenizer,
                template=cfg.data.template,
                max_prompt_tokens=r.max_prompt_length,
                reward_fn=self.reward_fn,
                max_new_tokens=self.max_new_tokens,
            )

    def _check_before_weights(self, load_path: str) -> Any:
        """Before any weight is read: do the LoRA targets exist, does the longest prompt + the
        budget fit the model, and does the run fit the device? Needs the source (its prompts)
        and the tokenizer; gives ``prompt_tokens``, ``memory_plan`` and the model's config
        (returned). Rank 0 prints the dtype choice (what ``model.dtype`` gave and what it read)
        above the memory plan: the first lines of a run whose settings passed every check."""
        remote = self.cfg.model.trust_remote_code
        model_config = load_model_config(load_path, trust_remote_code=remote)
        check_targets(model_config, self.cfg.model.lora, trust_remote_code=remote)
        self.prompt_tokens = self._check_context(model_config, load_path)
        if self.info.is_main:  # what the run computes in, above the plan (settings are checked)
            print(self.dtype_choice.line(), file=sys.stderr)
        self.memory_plan = self._plan_memory(model_config)
        return model_config

    def _build_policy(self, base_path: str) -> None:
        """Gives ``strategy`` and the weights: ``model`` (what trains, in float32 whatever
        ``model.dtype`` says: the whole model, or LoRA adapters on a base frozen in the compute
        dtype; policy.py, precision.py) and ``ref_model`` (KL only). Resuming, the
        checkpoint's weights load in place of ``base_path``'s."""
        self.strategy, policy = build_policy(
            self.cfg, base_path, info=self.info, device=self.device, resume_from=self.resume_from
        )
        self.model, self.ref_model = policy.model, policy.reference

    def _build_optimization(self) -> None:
        """Needs the policy (its trainable parameters) and ``max_new_tokens``. Gives the
        ``optimizer`` (AdamW) and its ``scheduler``, the ``scorer`` every forward goes
        through, the ``loss``, the rollout ``correction``, the mini-batch sizes and whether
        an update can reuse its own forward (``single_pass``)."""
        cfg, r = self.cfg, self.cfg.rollout
        world = self.info.world_size
        self.minibatches = r.questions_per_batch // cfg.mini_batch_questions
        self.total_opt_steps = cfg.optim.steps * self.minibatches * cfg.optim.epochs
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,  # float32 master weights: the AdamW state is float32 too
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            eps=cfg.optim.eps,
            weight_decay=cfg.optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg, self.total_opt_steps)
        )
        self.scorer = TokenScorer(  # every forward of the step goes through it
            temperature=r.temperature,
            chunk_size=cfg.model.logits_chunk_size,
            autocast=self.strategy.autocast,
        )
        self.loss = LossConfig.of(cfg.objective, cfg.selection, horizon=self.max_new_tokens)
        self.correction = RolloutCorrection(r.correction, r.correction_cap)
        self.rows_per_minibatch = cfg.mini_batch_questions // world * r.group_size
        rows_per_rank = r.questions_per_batch // world * r.group_size
        # One update per rollout on one micro-batch: the loss's own forward can give the old
        # log-probs (train_step, step 3) instead of a separate no-grad pass.
        self.single_pass = (
            self.minibatches == 1
            and cfg.optim.epochs == 1
            and rows_per_rank <= cfg.optim.micro_batch_size
        )

    def _restore(self) -> None:
        """Resuming: the checkpoint's optimizer, schedule, source and RNG states put back, and
        its ``step`` and ``skipped_total`` (:mod:`gmts.train.restore`). Needs every part above
        built; comes after the last of them that draws random numbers."""
        assert self.resume_from is not None
        restored = restore_trainer_state(
            self.resume_from,
            strategy_name=self.cfg.distributed.strategy,
            strategy=self.strategy,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            source=self.source,
            info=self.info,
            stacklevel=4,  # the warning points at the Trainer(...) call
        )
        self.step = restored.step
        self.skipped_total = restored.skipped_total

    def _make_engine(self, load_path: str, model_config: Any) -> RolloutEngine:
        """Who samples (``rollout.engine``): the policy itself, or a colocated vLLM engine
        started from the same weights (:mod:`gmts.train.engines`). Needs the policy, the
        tokenizer and the context check's ``prompt_tokens``."""
        return make_engine(
            EngineInputs(
                cfg=self.cfg,
                model=self.model,
                tokenizer=self.tokenizer,
                strategy=self.strategy,
                info=self.info,
                device=self.device,
                model_path=load_path,
                model_config=model_config,
                prompt_tokens=self.prompt_tokens,
                max_new_tokens=self.max_new_tokens,
            )
        )

    def _open_logs(self) -> None:
        """The run folder's writes, last, once the run is sure to start: the ``logger`` and,
        on rank 0, the metrics rows of steps about to be re-run dropped and the start recorded
        (:func:`gmts.train.run_folder.record_start`)."""
        cfg = self.cfg
        self.logger = MetricsLogger(
            self.run_dir,
            report_to=cfg.logging.report_to,
            enabled=self.info.is_main,
            wandb_project=cfg.logging.wandb_project,
            config=to_dict(cfg),
        )
        if self.info.is_main:
            # Resumed: drop the rows of steps about to be re-run. Fresh: drop an earlier run's
            # rows in the same directory (appending would mix two runs in one file).
            # The evaluations of the checkpoint's own step come after its save: they run again.
            last = self.step if self.resume_from is not None else -1
            truncate_metrics(self.run_dir, last)
            truncate_metrics(self.run_dir, last - 1, EVAL_FILE)
            record_start(self.run_dir, cfg, self.start, self.step, self.dtype_choice.record())
            if self.resume_from is not None:
                print(
                    f"gmts train: resumed from step {self.step} ({self.resume_from})",
                    file=sys.stderr,
                )

    # ------------------------------------------------------------------ helpers of the parts

    def _check_embedded_can_read(self, *datasets: _Rows | None) -> None:
        """Render the datasets with the embedded model's tokenizer before its warm start is
        built (minutes on first use): text it cannot encode fails now (train/alphabet.py)."""
        from gmts.embedded.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        for what, examples in zip(("data.dataset", "data.eval_dataset"), datasets):
            if examples:
                DatasetSource(
                    examples,
                    tokenizer=tokenizer,
                    template=self.cfg.data.template,
                    max_prompt_tokens=self.cfg.rollout.max_prompt_length,
                    shuffle=False,
                    seed=0,
                    what=what,
                )

    def _check_context(self, model_config: Any, path: str) -> int:
        """The longest prompt in tokens, after checking that it plus the generation budget fits
        the model's positions (:mod:`gmts.models.context`); raises ContextError otherwise."""
        cfg = self.cfg
        limit = context_limit(model_config, self.tokenizer, where=path)
        if isinstance(self.source, DatasetSource):
            src = self.source
            longest = max(src.longest_prompt, self.held_out.longest_prompt if self.held_out else 0)
            kept = len(src.problems)
            what = (
                f"data.dataset {cfg.data.dataset} ({kept} prompts kept; "
                f"{src.skipped_too_long} longer than rollout.max_prompt_length="
                f"{cfg.rollout.max_prompt_length} dropped at load)"
            )
            settings = "rollout.max_prompt_length (longer prompts are dropped) or " + (
                "rollout.max_response_length"
                if cfg.rollout.max_response_length
                else f"rollout.max_response_length (null: {DATASET_MAX_NEW_TOKENS} for datasets)"
            )
            if self.info.is_main and src.skipped_too_long:
                print(
                    f"data: dropped {src.skipped_too_long} of {kept + src.skipped_too_long} "
                    f"prompts longer than rollout.max_prompt_length="
                    f"{cfg.rollout.max_prompt_length} tokens",
                    file=sys.stderr,
                )
        else:
            assert self.task is not None
            prompts = [p.prompt for p in self.task.held_out(64)]
            prompts += [p.prompt for p in self.task.sample(64, random.Random(0))]
            longest = longest_prompt(self.tokenizer, prompts)
            what = f"data.task {cfg.data.task}"
            settings = "rollout.max_response_length"
        check_fits(
            prompt_tokens=longest,
            new_tokens=self.max_new_tokens,
            limit=limit,
            what=what,
            settings=settings,
        )
        return longest

    def _plan_memory(self, model_config: Any) -> MemoryPlan | None:
        """The per-rank memory plan (printed by rank 0); on CUDA, refuse a run that does not
        fit (``distributed.check_memory``)."""
        on_gpu = self.device.type == "cuda"
        settings = PlanSettings.from_config(
            self.cfg,
            world_size=self.info.world_size,
            prompt_length=self.prompt_tokens,
            response_length=self.max_new_tokens,
            gpu=on_gpu,
            device_bytes=torch.cuda.get_device_properties(self.device).total_memory
            if on_gpu
            else None,
        )
        try:
            plan = plan_memory(model_config, settings)
        except Exception as exc:  # an architecture the probe cannot build: say so, go on
            if self.info.is_main:
                print(f"memory plan unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        if self.info.is_main:  # the whole table for real models, one line for tiny ones
            print(plan.table() if plan.peak >= GIB else plan.summary(), file=sys.stderr)
        if self.device.type == "cuda" and self.cfg.distributed.check_memory:
            props = torch.cuda.get_device_properties(self.device)
            check_fits_device(plan, props.total_memory, f"{self.device} ({props.name})")
        return plan

    def collect(self, step: int) -> CollectedBatch:
        """This rank's rollout batch for ``step`` (rewards, dynamic sampling, advantages)."""
        with self.rollout_engine.session():
            return collect_batch(
                self.rollout_engine,
                self.source,
                self.reward_fn,
                self.cfg.rollout,
                seed=self.cfg.seed,
                step=step,
                max_new_tokens=self.max_new_tokens,
                info=self.info,
                device=self.device,
            )

    # ------------------------------------------------------------------ one step

    def train_step(self, step: int) -> dict[str, float]:
        """One step of GRPO / DAPO with token selection, in order; returns its metrics row."""
        cfg, micro = self.cfg, self.cfg.optim.micro_batch_size
        t0 = time.perf_counter()
        # 1. Rollout: G answers per question, rewards, DAPO dynamic sampling, advantages.
        collected = self.collect(step)
        self._watch_signal(collected, step)
        t_rollout = time.perf_counter() - t0
        rollout = collected.batch
        # 2. Reference log-probs (KL only): the frozen starting policy, no grad.
        ref = None
        if self.ref_model is not None:
            ref = self.scorer.no_grad(self.ref_model, rollout, micro_batch_size=micro).logprobs
        # 3. The rollout policy's log-probs and entropies (pi_old) and the rollout correction's
        #    weights, once. One update on one micro-batch: that update's own forward, with
        #    gradients, made here and reused by its loss; otherwise a no-grad pass.
        grad_norms = needs_logit_grad_norm(cfg.selection)
        forward = None
        if self.single_pass:
            forward = self.scorer(self.model, rollout, logit_grad_norm=grad_norms)
            old = forward
        else:
            old = self.scorer.no_grad(
                self.model, rollout, micro_batch_size=micro, logit_grad_norm=grad_norms
            )
        batch = rollout.scored(old, ref, self.correction)
        # 4. For each epoch, for each mini-batch (consecutive rows, groups whole): the current
        #    policy's scores, ONE global selection, one global divisor, micro-batched
        #    backward, one optimizer step (update.train_minibatch).
        opt_step = step * self.minibatches * cfg.optim.epochs  # seeds the random score
        updates: list[UpdateResult] = []
        for epoch in range(cfg.optim.epochs):
            for i in range(self.minibatches):
                rows = slice(i * self.rows_per_minibatch, (i + 1) * self.rows_per_minibatch)
                result = train_minibatch(
                    self.model,
                    self.optimizer,
                    batch.rows(rows),
                    scorer=self.scorer,
                    selection=cfg.selection,
                    loss=self.loss,
                    micro_batch_size=micro,
                    grad_clip=cfg.optim.grad_clip,
                    strategy=self.strategy,
                    step=opt_step,
                    policy_changed=(epoch, i) != (0, 0),
                    overlap=cfg.logging.overlap_metrics,
                    forward=forward,
                )
                updates.append(result)
                self._advance_schedule()
                opt_step += 1
        step_time = time.perf_counter() - t0
        return self._metrics(collected, batch, updates, t_rollout, step_time)

    def _watch_signal(self, collected: CollectedBatch, step: int) -> None:
        """Rank 0: warn once when the run's first steps have no group of differing rewards
        (:mod:`gmts.train.signal_watch`)."""
        if not self.info.is_main:
            return
        if self._signal_watch is None:
            self._signal_watch = ZeroSignalWatch(
                *self.reward_expects,
                dynamic_sampling=bool(self.cfg.rollout.dynamic_sampling),
                steps=max(1, min(ZERO_SIGNAL_STEPS, self.cfg.optim.steps - step)),
            )
        self._signal_watch.observe(collected)

    def _advance_schedule(self) -> None:
        with warnings.catch_warnings():  # a skipped (non-finite) step still advances
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()

    def _correction_metrics(self, batch: ScoredBatch) -> dict[str, float]:
        """``rollout/is_weight_mean`` and ``rollout/is_weight_capped_fraction`` over every
        rank's valid tokens (the rollout policy's weights; {} without a correction)."""
        if batch.importance_weights is None:
            return {}
        mask = batch.response_mask
        sums = self.correction.metrics(batch.importance_weights, mask)
        total = all_reduce_sum(
            torch.tensor([sums["sum"], sums["capped"], sums["tokens"]], dtype=torch.float64),
            self.info.group,
        ).tolist()
        tokens = max(total[2], 1.0)
        return {
            "rollout/is_weight_mean": total[0] / tokens,
            "rollout/is_weight_capped_fraction": total[1] / tokens,
        }

    def _metrics(
        self,
        collected: CollectedBatch,
        batch: ScoredBatch,
        updates: list[UpdateResult],
        t_rollout: float,
        step_time: float,
    ) -> dict[str, float]:
        """The step's ``metrics.jsonl`` row from its records."""
        metrics = collected.metrics(self.cfg.rollout)
        mask = batch.response_mask
        entropy = all_reduce_sum(
            torch.stack([(batch.old_entropy.double() * mask).sum(), mask.sum().double()]),
            self.info.group,
        )
        metrics["policy/entropy"] = (entropy[0] / entropy[1].clamp_min(1)).item()
        metrics.update(logprob_gap_metrics(batch, self.info))  # {} unless the engine records them
        metrics.update(self._correction_metrics(batch))
        metrics.update(self.rollout_engine.metrics())
        metrics.update(update_metrics(updates))
        self.skipped_total += int(metrics["update/skipped_nonfinite"])
        metrics["update/skipped_total"] = float(self.skipped_total)
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        if isinstance(self.source, DatasetSource):
            metrics["data/skipped_too_long"] = float(self.source.skipped_too_long)
        metrics["time/rollout_s"] = t_rollout
        metrics["time/update_s"] = step_time - t_rollout
        metrics["time/step_s"] = step_time
        metrics["time/tokens_per_s"] = metrics["response/tokens"] / max(step_time, 1e-9)
        return metrics

    # ------------------------------------------------------------------ evaluation, saving

    def evaluate(self) -> dict[str, float] | None:
        """average@k / pass@k on the held-out questions (rank 0): the task's, or those of
        ``data.eval_dataset``; None without any (:func:`gmts.train.evaluation.evaluate_held_out`)."""
        target = self.task if self.task is not None else self.held_out
        return evaluate_held_out(
            self.cfg, self.model, self.tokenizer, target, strategy=self.strategy, info=self.info
        )

    def save(self) -> None:
        # collective under fsdp (whole state dicts gathered on rank 0)
        weights = self.strategy.full_weights(self.model)
        optimizer_state = self.strategy.optimizer_state(self.model, self.optimizer)
        rng_ranks = self._rng_of_every_rank()  # collective: dropout draws differ by rank
        if self.info.is_main:
            state = {
                "step": self.step,
                "strategy": self.cfg.distributed.strategy,
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "source": self.source.state_dict(),
                "rng": ckpt.capture_rng_state(),
                "rng_ranks": rng_ranks,
                "skipped_total": self.skipped_total,
                "config": dataclasses.asdict(self.cfg),
            }
            ckpt.save_checkpoint(
                self.run_dir,
                self.step,
                model=self.model,
                weights=weights,
                tokenizer=self.tokenizer,
                trainer_state=state,
                keep=self.cfg.checkpoint.keep,
            )
        barrier(self.info)

    def _rng_of_every_rank(self) -> list[dict[str, Any]] | None:
        """Every rank's RNG states on rank 0, in rank order (None elsewhere; one process: its
        own). Restored per rank on resume, so dropout (a LoRA run's, a model's own) draws the
        same numbers as in an uninterrupted run on every rank."""
        state = ckpt.capture_rng_state()
        if self.info.world_size == 1:
            return [state]
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self.info.world_size if self.info.is_main else None
        dist.gather_object(state, gathered, dst=0, group=self.info.group)
        return gathered

    def close(self) -> None:
        """Release the rollout engine (a vLLM engine's memory; under torchrun its teardown also
        leaves the process group, so this comes after the run's last collective)."""
        self.rollout_engine.close()

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainResult:
        """Train to ``optim.steps``. SIGTERM (and ``checkpoint.preempt_signal``) stop the run at
        the next step boundary with a checkpoint: :class:`TrainingPreempted` (exit status 75)
        is raised, and ``--resume`` continues exactly (gmts/train/preemption.py)."""
        with PreemptionGuard(self.cfg.checkpoint.preempt_signal, self.info, self.device) as guard:
            return self._run(guard)

    def _run(self, guard: PreemptionGuard) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(run_dir=self.run_dir, steps=cfg.optim.steps)
        # the step whose checkpoint exists already: a resumed run does not write it again
        self._saved_step = self.step if self.resume_from is not None else None
        if self.info.is_main:
            clear_marker(self.run_dir)
        if self.step == 0 and cfg.data.eval_before:
            result.eval_before = self.evaluate()
            if result.eval_before is not None:
                self.logger.log(0, result.eval_before, EVAL_FILE)
        elif self._evaluation_due():  # resumed: this step's evaluation comes after its save
            self._evaluate_and_log()
        bar = None
        if cfg.logging.progress and self.info.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=cfg.optim.steps, initial=self.step, desc=self.run_dir.name, unit="step"
            )
        self._stop_if_requested(guard, bar)  # a signal during the evaluation before step 1
        every = cfg.checkpoint.every
        t_start = time.perf_counter()
        while self.step < cfg.optim.steps:
            metrics = self.train_step(self.step)
            self.step += 1
            metrics["time/elapsed_s"] = time.perf_counter() - t_start
            self.logger.log(self.step, metrics)
            result.history.append(metrics)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['reward/mean']:.3f}",
                    acc=f"{metrics['reward/accuracy']:.2f}",
                    sel=f"{metrics.get('select/fraction', 1.0):.2f}",
                )
            if every and (self.step % every == 0 or self.step == cfg.optim.steps):
                self._save_once()  # the last step too, whatever save_final says
            self._stop_if_requested(guard, bar)  # a signal during the step or its save
            if self._evaluation_due():
                self._evaluate_and_log()
                self._stop_if_requested(guard, bar)  # a signal during the evaluation
        if bar is not None:
            bar.close()
        if cfg.checkpoint.save_final:
            self._save_once()
        self._stop_if_requested(guard, None)  # a signal during the final save
        result.eval_after = self.evaluate()
        if result.eval_after is not None:
            self.logger.log(self.step, result.eval_after, EVAL_FILE)
        self.logger.close()
        if guard.received is not None and self.info.is_main:
            print(
                f"gmts train: {guard.signal_name} arrived after the last step's checkpoint "
                "(during the final evaluation); the run is complete",
                file=sys.stderr,
            )
        return result

    def _evaluation_due(self) -> bool:
        """Whether ``data.eval_every`` asks for an evaluation after step ``self.step``."""
        d_every = self.cfg.data.eval_every
        return bool(d_every) and self.step % d_every == 0 and 0 < self.step < self.cfg.optim.steps

    def _evaluate_and_log(self) -> None:
        ev = self.evaluate()
        if ev is not None:
            self.logger.log(self.step, ev, EVAL_FILE)

    def _save_once(self) -> None:
        """:meth:`save` unless this step's checkpoint is already written."""
        if self._saved_step != self.step:
            self.save()
            self._saved_step = self.step

    def _stop_if_requested(self, guard: PreemptionGuard, bar: Any) -> None:
        """At a step boundary: if any rank got a stop signal, save this step (nothing before
        the first step), close the logs and raise :class:`TrainingPreempted` on every rank."""
        if not guard.stop_requested():
            return
        checkpoint = None
        if self.step > 0:
            self._save_once()
            checkpoint = ckpt.checkpoint_dir(self.run_dir) / step_dir_name(self.step)
        stopped = TrainingPreempted(guard.signal_name, self.step, checkpoint)
        if bar is not None:
            bar.close()
        self.logger.close()
        if self.info.is_main:
            write_marker(self.run_dir, stopped)
            print(f"gmts train: {stopped}", file=sys.stderr)
        barrier(self.info)  # no rank exits (torchrun then stops the rest) before rank 0 is done
        raise stopped


def train(
    cfg: TrainConfig,
    *,
    resume: ResumeMode = False,
    overwrite: bool = False,
    allow_config_change: bool = False,
    reward_fn: RewardFn | None = None,
) -> TrainResult:
    """Train a policy as ``cfg`` says; see :class:`Trainer`. Returns the history and evals."""
    trainer = Trainer(
        cfg,
        resume=resume,
        overwrite=overwrite,
        allow_config_change=allow_config_change,
        reward_fn=reward_fn,
    )
    try:
        return trainer.run()
    finally:
        trainer.close()
