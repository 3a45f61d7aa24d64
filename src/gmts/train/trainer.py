"""The standalone RLVR trainer: GRPO / DAPO with token selection (none, ETS, GMTS, ...).

One training step (``Trainer.train_step``):

    rollout (G samples per question, temperature, KV cache, batched)
      -> rewards (a raising reward fn gives 0 and is counted) [+ DAPO overlong punishment]
      -> DAPO dynamic sampling: drop all-equal groups, sample more rounds, top up at the limit
      -> group advantages
      -> old log-probs and entropies (no grad, micro-batched); reference log-probs if KL
      -> for each epoch, for each mini-batch: update_minibatch (score with the current policy,
         one global selection, one global denominator, micro-batched backward, one step)

Departures from the paper and why (see docs/training.md for the full list):
- mini-batches are taken in order (no shuffling) so that groups stay whole and runs are
  reproducible; the paper does not specify an order.
- when dynamic sampling hits ``max_sampling_rounds``, the batch is topped up with dropped
  (zero-advantage) groups instead of failing, so every rank keeps the same shapes.
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

from gmts.train import checkpoint as ckpt
from gmts.train.batch import TrainBatch
from gmts.train.collect import collect_batch
from gmts.train.config import DATASET_MAX_NEW_TOKENS, TrainConfig, config_to_dict, dump_yaml
from gmts.train.context import check_fits, context_limit, longest_prompt
from gmts.train.distributed import (
    DistInfo,
    all_reduce_sum,
    barrier,
    init_distributed,
    resolve_device,
)
from gmts.train.memory_plan import MemoryPlan, PlanSettings, check_fits_device, plan_memory
from gmts.train.metrics_log import EVAL_FILE, MetricsLogger, truncate_metrics
from gmts.train.policy import load_model, load_tokenizer, resolve_model_path
from gmts.train.precision import Precision
from gmts.train.sources import (
    DatasetSource,
    QuestionSource,
    RewardFn,
    TaskSource,
    dataset_reward,
    load_examples,
)
from gmts.train.strategy import make_strategy
from gmts.train.update import (
    UpdateSettings,
    batched_statistics,
    needs_logit_grad_norm,
    update_minibatch,
)


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
        self, cfg: TrainConfig, *, resume: bool = False, reward_fn: RewardFn | None = None
    ) -> None:
        self.cfg = cfg
        self.info: DistInfo = init_distributed(cfg.model.device)
        world = self.info.world_size
        r = cfg.rollout
        for name, value in (
            ("rollout.questions_per_batch", r.questions_per_batch),
            ("optim.mini_batch_questions", cfg.mini_batch_questions),
        ):
            if value % world:
                raise ValueError(f"{name} ({value}) must be divisible by the {world} processes")
        self.device = resolve_device(cfg.model.device, self.info)
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.run_dir = Path(cfg.logging.output_dir)
        show = cfg.logging.progress and self.info.is_main

        # Data and rewards first: a bad dataset or reward fails before any model is loaded.
        self.task = None
        examples = None
        if cfg.data.dataset is None:
            from gmts.data.tasks import get_task

            self.task = get_task(cfg.data.task)
            self.source: QuestionSource = TaskSource(self.task, cfg.seed)
            self.reward_fn = reward_fn or self.task.reward
            self.max_new_tokens = r.max_response_length or self.task.max_new_tokens
        else:
            examples = load_examples(
                cfg.data.dataset,
                split=cfg.data.split,
                question_field=cfg.data.question_field,
                answer_field=cfg.data.answer_field,
            )
            self.reward_fn = reward_fn or dataset_reward(cfg.data.reward)
            self.max_new_tokens = r.max_response_length or DATASET_MAX_NEW_TOKENS

        # The model: rank 0 builds/caches the embedded warm start first, then the others.
        if self.info.is_main:
            base_path = resolve_model_path(cfg, progress=show)
        barrier(self.info)
        if not self.info.is_main:
            base_path = resolve_model_path(cfg)
        self.resume_from = ckpt.latest_checkpoint(self.run_dir) if resume else None
        load_path = str(self.resume_from / "model") if self.resume_from else base_path
        self.tokenizer = load_tokenizer(load_path, cfg)
        if examples is not None:  # prompts are rendered with the model's tokenizer
            self.source = DatasetSource(
                examples,
                tokenizer=self.tokenizer,
                template=cfg.data.template,
                max_prompt_tokens=r.max_prompt_length,
                shuffle=cfg.data.shuffle,
                seed=cfg.seed,
            )

        # Before any weight is read: does the longest prompt + the budget fit the model, and
        # does the run fit the device?
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(
            load_path, trust_remote_code=cfg.model.trust_remote_code
        )
        self.prompt_tokens = self._check_context(model_config, load_path)
        self.memory_plan = self._plan_memory(model_config, show)

        self.precision = Precision.from_name(cfg.model.dtype)
        self.strategy = make_strategy(
            cfg.distributed.strategy, self.info, self.precision, self.device
        )
        # master weights in float32 whatever model.dtype says (precision.py)
        self.model = self.strategy.prepare_policy(load_model(load_path, cfg, torch.float32))
        self.ref_model = None
        if cfg.objective.kl_coef > 0:  # the reference is always the starting policy
            ref = load_model(base_path, cfg, self.precision.compute).requires_grad_(False)
            self.ref_model = self.strategy.prepare_reference(ref.eval())

        # Optimisation.
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
        self.settings = UpdateSettings(
            objective=cfg.objective,
            selection=cfg.selection,
            micro_batch_size=cfg.optim.micro_batch_size,
            temperature=r.temperature,
            chunk_size=cfg.model.logits_chunk_size,
            grad_clip=cfg.optim.grad_clip,
            overlap_metrics=cfg.logging.overlap_metrics,
        )
        self.step = 0
        self.skipped_total = 0
        if self.resume_from is not None:
            state = ckpt.load_trainer_state(self.resume_from)
            saved = state.get("strategy", "replicate")
            if saved != cfg.distributed.strategy:
                raise ValueError(
                    f"--resume: {self.resume_from} was written with distributed.strategy="
                    f"{saved}; resume it with the same strategy"
                )
            self.strategy.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.source.load_state_dict(state["source"])
            ckpt.restore_rng_state(state["rng"])
            self.step = int(state["step"])
            self.skipped_total = int(state.get("skipped_total", 0))
        self.logger = MetricsLogger(
            self.run_dir,
            report_to=cfg.logging.report_to,
            enabled=self.info.is_main,
            wandb_project=cfg.logging.wandb_project,
            config=config_to_dict(cfg),
        )
        if self.info.is_main:
            # Resumed: drop the rows of steps about to be re-run. Fresh: drop an earlier run's
            # rows in the same directory (appending would mix two runs in one file).
            last = self.step if self.resume_from is not None else -1
            truncate_metrics(self.run_dir, last)
            truncate_metrics(self.run_dir, last, EVAL_FILE)
            (self.run_dir / "config.yaml").write_text(dump_yaml(cfg))

    def _check_context(self, model_config: Any, path: str) -> int:
        """The longest prompt in tokens, after checking that it plus the generation budget fits
        the model's positions (:mod:`gmts.train.context`); raises ContextError otherwise."""
        cfg = self.cfg
        limit = context_limit(model_config, self.tokenizer, where=path)
        if isinstance(self.source, DatasetSource):
            src = self.source
            longest = src.longest_prompt
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

    def _plan_memory(self, model_config: Any, show: bool) -> MemoryPlan | None:
        """The per-rank memory plan (printed by rank 0); on CUDA, refuse a run that does not
        fit (``distributed.check_memory``)."""
        settings = PlanSettings.from_config(
            self.cfg,
            world_size=self.info.world_size,
            prompt_length=self.prompt_tokens,
            response_length=self.max_new_tokens,
        )
        try:
            plan = plan_memory(model_config, settings)
        except Exception as exc:  # an architecture the probe cannot build: say so, go on
            if self.info.is_main:
                print(f"memory plan unavailable ({type(exc).__name__}: {exc})", file=sys.stderr)
            return None
        if self.info.is_main:
            print(plan.table(), file=sys.stderr)
        if self.device.type == "cuda" and self.cfg.distributed.check_memory:
            props = torch.cuda.get_device_properties(self.device)
            check_fits_device(plan, props.total_memory, f"{self.device} ({props.name})")
        return plan

    def collect(self, step: int) -> tuple[TrainBatch, dict[str, float]]:
        """This rank's rollout batch for ``step`` (rewards, dynamic sampling, advantages)."""
        with self.strategy.sampling(self.model):
            return collect_batch(
                self.model,
                self.tokenizer,
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
        cfg = self.cfg
        t0 = time.perf_counter()
        batch, metrics = self.collect(step)
        t_rollout = time.perf_counter() - t0
        micro = cfg.optim.micro_batch_size
        temp, chunk = cfg.rollout.temperature, cfg.model.logits_chunk_size
        autocast = self.strategy.autocast
        if self.ref_model is not None:
            batch.ref_logprobs = batched_statistics(
                self.ref_model,
                batch,
                micro_batch_size=micro,
                temperature=temp,
                chunk_size=chunk,
                autocast=autocast,
            ).logprobs
        # One update on one micro-batch: the loss's own forward pass gives the old log-probs
        # (update_minibatch's single-pass mode). Otherwise a no-grad pass, micro-batched.
        single_pass = self.minibatches == 1 and cfg.optim.epochs == 1 and batch.num_rows <= micro
        if not single_pass:
            old = batched_statistics(
                self.model,
                batch,
                micro_batch_size=micro,
                temperature=temp,
                chunk_size=chunk,
                logit_grad_norm=needs_logit_grad_norm(cfg.selection),
                autocast=autocast,
            )
            batch.set_old_statistics(old)

        rows_per_mb = cfg.mini_batch_questions // self.info.world_size * cfg.rollout.group_size
        opt_step = step * self.minibatches * cfg.optim.epochs
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for epoch in range(cfg.optim.epochs):
            for i in range(self.minibatches):
                rows = slice(i * rows_per_mb, (i + 1) * rows_per_mb)
                minibatch = batch if single_pass else batch.rows(rows)
                current = None
                if not single_pass and epoch == 0 and i == 0:  # policy unchanged since rollout
                    current = minibatch.old_statistics()
                m, _ = update_minibatch(
                    self.model,
                    self.optimizer,
                    minibatch,
                    self.settings,
                    info=self.info,
                    step=opt_step,
                    current=current,
                    strategy=self.strategy,
                )
                with warnings.catch_warnings():  # a skipped (non-finite) step still advances
                    warnings.simplefilter("ignore", UserWarning)
                    self.scheduler.step()
                opt_step += 1
                for k, v in m.items():
                    if k == "update/skipped_nonfinite" or math.isfinite(v):
                        sums[k] = sums.get(k, 0.0) + v
                        counts[k] = counts.get(k, 0) + 1
        mask = batch.response_mask  # old_entropy is filled in by now (single-pass mode too)
        ent = all_reduce_sum(
            torch.stack([(batch.old_entropy.double() * mask).sum(), mask.sum().double()]),
            self.info,
        )
        metrics["policy/entropy"] = (ent[0] / ent[1].clamp_min(1)).item()
        for k, v in sums.items():
            metrics[k] = v if k == "update/skipped_nonfinite" else v / counts[k]
        self.skipped_total += int(sums.get("update/skipped_nonfinite", 0))
        metrics["update/skipped_total"] = float(self.skipped_total)
        metrics["optim/lr"] = self.scheduler.get_last_lr()[0]
        if isinstance(self.source, DatasetSource):
            metrics["data/skipped_too_long"] = float(self.source.skipped_too_long)
        step_time = time.perf_counter() - t0
        metrics["time/rollout_s"] = t_rollout
        metrics["time/update_s"] = step_time - t_rollout
        metrics["time/step_s"] = step_time
        metrics["time/tokens_per_s"] = metrics["response/tokens"] / max(step_time, 1e-9)
        return metrics

    # ------------------------------------------------------------------ evaluation, saving

    def evaluate(self) -> dict[str, float] | None:
        """average@k / pass@k on the task's held-out questions (rank 0; None for datasets)."""
        d = self.cfg.data
        if self.task is None or d.eval_questions == 0:
            return None
        result = None
        with self.strategy.sampling(self.model):  # every rank enters; rank 0 samples
            if self.info.is_main:
                from gmts.train.evaluation import evaluate_policy

                result = evaluate_policy(
                    self.model,
                    self.tokenizer,
                    self.task,
                    n_questions=d.eval_questions,
                    k=d.eval_samples,
                    seed=self.cfg.seed,
                    batch_size=self.cfg.rollout.generation_batch_size,
                )
        return result

    def save(self) -> None:
        # collective under fsdp (whole state dicts gathered on rank 0)
        weights = self.strategy.full_weights(self.model)
        optimizer_state = self.strategy.optimizer_state(self.model, self.optimizer)
        if self.info.is_main:
            state = {
                "step": self.step,
                "strategy": self.cfg.distributed.strategy,
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "source": self.source.state_dict(),
                "rng": ckpt.capture_rng_state(),
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

    # ------------------------------------------------------------------ the loop

    def run(self) -> TrainResult:
        cfg = self.cfg
        result = TrainResult(run_dir=self.run_dir, steps=cfg.optim.steps)
        if self.step == 0 and cfg.data.eval_before:
            result.eval_before = self.evaluate()
            if result.eval_before is not None:
                self.logger.log(0, result.eval_before, EVAL_FILE)
        bar = None
        if cfg.logging.progress and self.info.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(
                total=cfg.optim.steps, initial=self.step, desc=self.run_dir.name, unit="step"
            )
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
            d_every = cfg.data.eval_every
            if d_every and self.step % d_every == 0 and self.step < cfg.optim.steps:
                ev = self.evaluate()
                if ev is not None:
                    self.logger.log(self.step, ev, EVAL_FILE)
            if every and self.step % every == 0 and self.step < cfg.optim.steps:
                self.save()
        if bar is not None:
            bar.close()
        if cfg.checkpoint.save_final:
            self.save()
        result.eval_after = self.evaluate()
        if result.eval_after is not None:
            self.logger.log(self.step, result.eval_after, EVAL_FILE)
        self.logger.close()
        return result


def train(
    cfg: TrainConfig, *, resume: bool = False, reward_fn: RewardFn | None = None
) -> TrainResult:
    """Train a policy as ``cfg`` says; see :class:`Trainer`. Returns the history and evals."""
    return Trainer(cfg, resume=resume, reward_fn=reward_fn).run()
