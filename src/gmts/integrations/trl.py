"""GMTS / ETS token selection inside TRL's ``GRPOTrainer`` (TRL >= 1.10), without a fork.

``GMTSGRPOConfig`` (:mod:`gmts.integrations.trl_config`) adds the core ``SelectionConfig``
fields, generated with the prefix ``gmts_``, and ``gmts_preset`` to ``GRPOConfig``;
``GMTSGRPOTrainer`` replaces only ``_compute_loss``:

1. one forward pass (TRL's own ``_get_per_token_logps_and_entropies``) gives the current
   log-probs (with gradient) and entropies of the micro-batch;
2. TRL's loss options become a core objective (:mod:`gmts.integrations.trl_loss`: every
   ``loss_type``, ``importance_sampling_level``, ``delta``, ``epsilon`` / ``epsilon_high``,
   ``beta`` with ``use_bias_correction_kl``), and TRL's multiplicative factors of the policy
   term (the off-policy sequence mask, the vLLM importance-sampling ratio) its importance
   weights; omega is computed from exactly the tensors TRL's loss uses: current, old
   (``old_per_token_logps``, or the detached current ones when TRL skips them, so r = 1) and
   reference log-probs, the advantages and those weights;
3. the core's selection step (:func:`gmts.core.step.selection_step`, as the standalone trainer
   and verl): the tokens selected by the configured score over the selection unit on every
   accelerate process together (one global threshold; ``gmts_count`` says how many), their
   counts and the loss's divisors: ``gmts_normalize="selected"`` is the paper's eq. 2 (a
   token-mean over the selected tokens of the selection unit on all processes, whatever
   ``loss_type``); ``gmts_normalize="all"`` keeps exactly the divisor of TRL's ``loss_type``
   (the engine's own divisor: what TRL's ``top_entropy_quantile`` and the authors' code do);
4. the loss is the core's ``policy_loss`` with those divisors;
5. TRL's entropy bonus (``entropy_coef``, ``use_adaptive_entropy``, with TRL's own adaptive
   controller) is added as TRL adds it, on the tokens the policy term trains on: the GMTS
   selection takes the place of TRL's entropy mask.

The selection unit (``gmts_unit``) is by default the whole optimizer step: all micro-batches
of one gradient-accumulation window on all processes (the paper's mini-batch); with
``gradient_accumulation_steps > 1`` that costs one extra no-grad forward over the window at
its first micro-batch. ``'micro-batch'`` selects each micro-batch (on all processes) on its
own, as TRL's own ``top_entropy_quantile`` does.

Why the window's forward stays (read in TRL 1.16's ``grpo_trainer.py``): TRL computes a
micro-batch's log-probs and entropies only inside its ``_compute_loss``, with gradients, one
micro-batch at a time, each followed by its backward pass; its generation step
(``_generate_and_score_completions``) stores no entropies at all, and old log-probs only when
``gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0`` or under vLLM
importance sampling (and from the rollout weights, stale after the first optimizer step of a
generation). So a selection over the whole step that reads entropies or the current policy's
omega has no TRL state to read before the first backward: holding every micro-batch's graph
instead would cost the memory accumulation exists to save. The forward is skipped when the
score reads nothing of the model (``random``: its inputs are the masks alone).

Rejected when the trainer is built (:func:`~gmts.integrations.trl_config.check_trl_args`):
the settings TRL cannot run (:data:`~gmts.integrations.trl_config.TRL_SUPPORT`), TRL's own
entropy mask (``top_entropy_quantile < 1``: the GMTS selection replaces it), and the few
option values no core objective expresses exactly (:meth:`TRLLossOptions.problems` names the
obstacle).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import torch
from trl import GRPOTrainer

from gmts.core.config import SelectionConfig
from gmts.core.loss import LossConfig, TokenSums, policy_loss
from gmts.core.objectives import ObjectiveConfig
from gmts.core.scores import score_requirements
from gmts.core.step import OwnDivisor, SelectionStep, UpdateBatch, UpdateLayout, selection_step
from gmts.integrations.trl_config import (
    TRL_SUPPORT,
    GMTSGRPOConfig,
    check_trl_args,
    gmts_args,
)
from gmts.integrations.trl_loss import LOSS_TYPES, PolicyFactors, TRLLossOptions, policy_factors
from gmts.integrations.trl_state import TRLStepState

__all__ = [
    "GMTSGRPOConfig",
    "GMTSGRPOTrainer",
    "SUPPORTED_LOSS_TYPES",
    "TRL_SUPPORT",
    "check_trl_args",
    "gmts_args",
]

SUPPORTED_LOSS_TYPES = LOSS_TYPES
"""TRL loss types GMTSGRPOTrainer computes (all of TRL 1.16's)."""

# Per-sequence model inputs that TRL's _compute_loss forwards to the model (multimodal models).
_EXTRA_MODEL_INPUTS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


@dataclass(frozen=True)
class _WindowSelection:
    """The selection step over one optimizer step's micro-batches (``gmts_unit='mini-batch'``).

    Attributes:
        start: the window's first TRL step (the cache key).
        step: the core's selection step over the window's rows (all micro-batches, in order).
        rows: buffered slot -> its rows of the window.
    """

    start: int
    step: SelectionStep
    rows: dict[int, slice]


class GMTSGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` training on the tokens GMTS (or ETS, ...) selects.

    Construct it exactly like ``GRPOTrainer`` with ``args=GMTSGRPOConfig(...)``. Besides TRL's
    metrics it logs, per micro-batch and global over processes: ``gmts/selected_fraction``,
    ``gmts/selected_tokens``, ``gmts/valid_tokens``, ``gmts/unit_selected_tokens`` and
    ``gmts/unit_valid_tokens`` (the selection unit whose divisor eq. 2 uses),
    ``gmts/score_threshold``, ``gmts/clip_fraction_selected``, ``gmts/entropy_selected`` and
    ``gmts/entropy_all``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        train_args = kwargs.get("args", args[2] if len(args) > 2 else None)
        check_trl_args(train_args)  # before any model loading or generation setup
        args, kwargs = _resolve_model_argument(args, kwargs)
        super().__init__(*args, **kwargs)
        self.gmts_selection: SelectionConfig = train_args.gmts_selection_config()

    # ----------------------------------------------------------------------------------------

    def _gmts_options(self) -> TRLLossOptions:
        """The loss options TRL's own ``_compute_loss`` would read now (its attributes)."""
        return TRLLossOptions.from_trainer(self)

    def _gmts_loss_config(
        self, options: TRLLossOptions | None = None, vespo_padding_weight: float | None = None
    ) -> LossConfig:
        """TRL's objective (clip, KL, loss-type aggregation) with the gmts_* normalisation;
        ``vespo_padding_weight``: :attr:`PolicyFactors.vespo_padding_weight` (None: none)."""
        options = self._gmts_options() if options is None else options
        objective = _objective_of(options)
        if vespo_padding_weight is not None:
            objective = replace(objective, vespo_padding_weight=vespo_padding_weight)
        return LossConfig.of(objective, self.gmts_selection)

    def _gmts_reduce(self, values: torch.Tensor) -> torch.Tensor:
        """Sum over accelerate's processes (TRL's own collective)."""
        return self.accelerator.reduce(values, reduction="sum")

    def _gmts_process_group(self) -> Any:
        if self.accelerator.num_processes > 1:
            return torch.distributed.group.WORLD
        return None

    def _gmts_forward(
        self, model: torch.nn.Module, inputs: dict[str, Any], *, compute_aux_loss: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """TRL's own forward: ``(logprobs, entropy, aux_loss)``, the first two ``(B, T)``."""
        completion_ids = inputs["completion_ids"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)  # (B, P + T)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        # only what is present: older TRL versions lack some of these keyword arguments
        extra = {key: inputs[key] for key in _EXTRA_MODEL_INPUTS if inputs.get(key) is not None}
        out = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=compute_aux_loss,
            **extra,
        )
        aux_loss = out[2] if len(out) > 2 else None  # TRL < 1.10 returned two values
        return out[0], out[1], aux_loss

    @staticmethod
    def _gmts_mask(inputs: dict[str, Any]) -> torch.Tensor:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        return mask.bool()  # (B, T)

    def _gmts_score_inputs(
        self, inputs: dict[str, Any], logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(old_logprobs, ref_logprobs)`` exactly as TRL's loss uses them."""
        old_logprobs = inputs.get("old_per_token_logps")
        if old_logprobs is None:  # TRL skips the old pass when on-policy: r = 1 exactly
            old_logprobs = logprobs.detach()
        ref_logprobs = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        return old_logprobs, ref_logprobs

    def _gmts_policy(
        self,
        options: TRLLossOptions,
        inputs: dict[str, Any],
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
    ) -> PolicyFactors:
        """The advantages and importance weights of the policy term, as TRL applies them: its
        off-policy sequence mask (TRL's own ``get_off_policy_mask`` on the detached current
        log-probs) and its vLLM importance-sampling ratio."""
        advantages = inputs["advantages"]
        off_policy_mask = None
        if options.off_policy_mask_threshold is not None:
            trl_mask = inputs["completion_mask"]  # TRL's own (integer) mask
            if "tool_mask" in inputs:
                trl_mask = trl_mask * inputs["tool_mask"]
            off_policy_mask = self.get_off_policy_mask(
                advantages=advantages[:, None] if advantages.dim() == 1 else advantages,
                per_token_logps=logprobs.detach(),
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_logprobs),
                mask=trl_mask,
                off_policy_threshold=options.off_policy_mask_threshold,
            )  # (B, 1)
        return policy_factors(
            options,
            advantages=advantages,
            mask=self._gmts_mask(inputs),
            importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
            off_policy_mask=off_policy_mask,
        )

    def _gmts_uses_step_unit(self, mode: str) -> bool:
        return (
            mode == "train"
            and self.gmts_selection.enabled
            and self.gmts_selection.unit == "mini-batch"
            and TRLStepState.of(self).accumulation > 1
        )

    def _gmts_update_batch(
        self,
        model: torch.nn.Module,
        batch: dict[str, Any],
        options: TRLLossOptions,
        *,
        forward: bool,
    ) -> tuple[UpdateBatch, PolicyFactors | None]:
        """One buffered micro-batch as the core's :class:`UpdateBatch`, scored as its training
        forward will be (no gradient); ``forward=False`` (a score that reads nothing of the
        model): no forward, zero log-probs that nothing reads, no policy factors."""
        mask = self._gmts_mask(batch)
        if not forward:
            zeros = torch.zeros(mask.shape, device=mask.device)  # (B, T), never read
            return UpdateBatch(zeros, zeros, batch["advantages"], mask), None
        logprobs, entropy, _ = self._gmts_forward(model, batch)
        old_logprobs, ref_logprobs = self._gmts_score_inputs(batch, logprobs)
        policy = self._gmts_policy(options, batch, logprobs, old_logprobs)
        advantages = policy.advantages
        advantages = advantages[:, None] if advantages.dim() == 1 else advantages
        update = UpdateBatch(
            logprobs=logprobs.detach(),
            old_logprobs=old_logprobs,
            advantages=advantages.expand_as(logprobs),
            response_mask=mask,
            entropy=entropy.detach().float(),
            ref_logprobs=ref_logprobs,
            importance_weights=policy.importance_weights,
        )
        return update, policy

    def _gmts_layout(self, mode: str, *, spans_step: bool, own: OwnDivisor | None) -> UpdateLayout:
        """TRL's update around a selection step: global over accelerate's processes (its own
        collective), gradients averaged over them (DDP), and a unit smaller than the optimizer
        step accumulated ``current_gradient_accumulation_steps`` times in training."""
        accumulated = 1
        if mode == "train" and not spans_step:
            accumulated = int(self.current_gradient_accumulation_steps)
        return UpdateLayout(
            process_group=self._gmts_process_group(),
            reduce_sum=self._gmts_reduce,
            averaged_over=int(self.accelerator.num_processes),
            accumulated=accumulated,
            own_divisor=own,
        )

    @torch.no_grad()
    def _gmts_window(
        self, model: torch.nn.Module, loss_config: LossConfig, options: TRLLossOptions
    ) -> _WindowSelection:
        """The selection step over every micro-batch of the current optimizer step (all
        processes).

        One no-grad forward over the window's micro-batches (TRL's buffered slices) with the
        parameters this optimizer step differentiates at, so scores equal those of the
        training forwards (the module docstring says why TRL's state cannot replace it); none
        for a score that reads nothing of the model. Cached per window.
        """
        state = TRLStepState.of(self)
        start = state.window_start
        cached = getattr(self, "_gmts_window_cache", None)
        if cached is not None and cached.start == start:
            return cached
        slots = state.window_slots()
        forward = bool(score_requirements(self.gmts_selection.score) - {"mask"})
        scored = [
            self._gmts_update_batch(model, state.buffered_inputs[slot], options, forward=forward)
            for slot in slots
        ]
        batches = [update for update, _ in scored]

        def cat(name: str) -> torch.Tensor | None:  # (accumulation * B, ...)
            values = [getattr(b, name) for b in batches]
            return None if values[0] is None else torch.cat(values, dim=0)

        objective = loss_config.objective
        paddings = {p.vespo_padding_weight for _, p in scored if p is not None} - {None}
        if paddings:  # one generation's micro-batches: TRL gives their padding one ratio
            if len(paddings) > 1:
                raise RuntimeError(f"TRL's IS ratio outside the mask differs: {paddings}")
            objective = replace(objective, vespo_padding_weight=paddings.pop())
        window = UpdateBatch(
            logprobs=cat("logprobs"),
            old_logprobs=cat("old_logprobs"),
            advantages=cat("advantages"),
            response_mask=cat("response_mask"),
            entropy=cat("entropy"),
            ref_logprobs=cat("ref_logprobs") if self.beta != 0.0 else None,
            importance_weights=cat("importance_weights"),
        )
        step = selection_step(
            replace(loss_config, objective=objective),
            window,
            layout=self._gmts_layout("train", spans_step=True, own=None),
            step=start,
        )
        offsets, rows = 0, {}
        for slot, b in zip(slots, batches):
            rows[slot] = slice(offsets, offsets + b.num_rows)
            offsets += b.num_rows
        cache = _WindowSelection(start=start, step=step, rows=rows)
        self._gmts_window_cache = cache
        return cache

    def _gmts_select(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        loss_config: LossConfig,
        mode: str,
        *,
        options: TRLLossOptions,
        policy: PolicyFactors,
        logprobs: torch.Tensor,
        entropy: torch.Tensor,
        old_logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
    ) -> SelectionStep:
        """The core's selection step for this micro-batch: its part of its optimizer step's
        window, or its own; TRL's ``loss_type`` divisor is the engine's own divisor."""
        mask = self._gmts_mask(inputs)
        own = self._trl_divisor(options, inputs, mask, mode)
        if self._gmts_uses_step_unit(mode):
            window = self._gmts_window(model, loss_config, options)
            state = TRLStepState.of(self)
            if inputs is not state.buffered_inputs[state.slot]:
                raise RuntimeError(
                    "gmts_unit='mini-batch' could not match this micro-batch to TRL's buffered "
                    "generation batch; use gmts_unit='micro-batch'"
                )
            return window.step.part(window.rows[state.slot], own)
        batch = UpdateBatch(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=policy.advantages,
            response_mask=mask,
            entropy=entropy.detach().float(),
            ref_logprobs=ref_logprobs,
            importance_weights=policy.importance_weights,
        )
        return selection_step(
            loss_config,
            batch,
            layout=self._gmts_layout(mode, spans_step=False, own=own),
            step=TRLStepState.of(self).step,
        )

    def _trl_divisor(
        self, options: TRLLossOptions, inputs: dict[str, Any], mask: torch.Tensor, mode: str
    ) -> OwnDivisor:
        """TRL 1.16's ``loss_type`` divisor and accumulation scale for this micro-batch
        (:class:`gmts.integrations.trl_loss.DivisorInputs`)."""
        divisor = options.loss_type_entry.divisor
        return OwnDivisor(
            *divisor(
                TRLStepState.of(self).divisor_inputs(
                    rows=int(mask.shape[0]),
                    num_items_in_batch=inputs.get("num_items_in_batch"),
                    train=mode == "train",
                )
            )
        )

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        aux_enabled = bool(getattr(self, "aux_loss_enabled", False))
        logprobs, entropy, aux_loss = self._gmts_forward(
            model, inputs, compute_aux_loss=aux_enabled
        )
        mask = self._gmts_mask(inputs)  # (B, T)
        old_logprobs, ref_logprobs = self._gmts_score_inputs(inputs, logprobs)
        mode = "train" if self.model.training else "eval"
        options = self._gmts_options()
        policy = self._gmts_policy(options, inputs, logprobs, old_logprobs)
        loss_config = self._gmts_loss_config(options, policy.vespo_padding_weight)
        chosen = self._gmts_select(
            model,
            inputs,
            loss_config,
            mode,
            options=options,
            policy=policy,
            logprobs=logprobs,
            entropy=entropy,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
        )
        loss, sums = policy_loss(
            logprobs,
            old_logprobs,
            policy.advantages,
            mask,
            loss_config,
            selected=chosen.selected,
            ref_logprobs=ref_logprobs,
            entropy=entropy.detach().float(),
            denominators=chosen.denominators,
            importance_weights=policy.importance_weights,
        )
        unscaled = loss.detach()
        loss = loss / chosen.scale
        if self._entropy_bonus_enabled:
            # the bonus acts on the tokens the policy term trains on, as TRL's acts on
            # mask * entropy_mask: the GMTS selection takes the place of TRL's entropy mask
            carriers = mask if chosen.selected is None else mask & chosen.selected
            loss = loss - self._gmts_entropy_bonus(entropy, carriers, mode, unscaled)
        if aux_loss is not None:
            accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss.detach()).mean().item()
            )
        self._gmts_log(mode, sums.reduced(self._gmts_reduce), chosen, options)
        return loss

    def _gmts_entropy_bonus(
        self, entropy: torch.Tensor, carriers: torch.Tensor, mode: str, policy_value: torch.Tensor
    ) -> torch.Tensor:
        """``coef * H``, TRL 1.16's entropy bonus to subtract from the loss, and TRL's adaptive
        controller step (on TRL's own state: ``entropy_coef``, ``_last_world_entropy``,
        ``_entropy_window_stats``, which TRL checkpoints).

        ``H`` is the mean entropy of this micro-batch's ``carriers`` ``(B, T)`` bool, divided by
        the accumulation steps (never by the loss type's divisor); its gradient flows through
        the whole softmax, not through log pi(o_t), so it is no part of omega and plays no role
        in the selection. The coefficient applied is the one decided at the end of the previous
        optimizer step (adaptive: 0 while the last window's entropy was above
        ``entropy_target``); the controller then adds this micro-batch's entropy to the window
        and, at the optimizer-step boundary, moves ``entropy_coef`` by ``entropy_coef_delta``
        using the window's global (all-process) mean.
        """
        effective = carriers.to(entropy.dtype)  # (B, T)
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        mean_entropy = (entropy * effective).sum() / effective.sum().clamp(min=1.0) / accumulation
        if self.use_adaptive_entropy:
            target = self.args.entropy_target
            coef = self.entropy_coef if self._last_world_entropy <= target else 0.0
        else:
            coef = self.entropy_coef
        bonus = coef * mean_entropy
        self._metrics[mode]["policy_loss"].append(
            self.accelerator.gather(policy_value).nanmean().item()
        )
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropy * effective).sum(), effective.sum()]).detach()
            window = self._entropy_window_stats
            self._entropy_window_stats = stats if window is None else window + stats
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                args = self.args
                if world_entropy <= args.entropy_target:
                    self.entropy_coef = min(
                        self.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max
                    )
                else:
                    self.entropy_coef = max(
                        self.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min
                    )
                self._last_world_entropy = world_entropy
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return bonus

    def _gmts_log(
        self, mode: str, sums: TokenSums, chosen: SelectionStep, options: TRLLossOptions
    ) -> None:
        """Global (all-process) selection metrics through TRL's ``self._metrics``: the loss's
        token sums of this micro-batch, and the selection unit's counts and threshold."""
        m = sums.metrics()
        metrics = self._metrics[mode]
        metrics["gmts/selected_fraction"].append(m["selected_fraction"])
        metrics["gmts/selected_tokens"].append(sums["selected_tokens"])
        metrics["gmts/valid_tokens"].append(sums["valid_tokens"])
        metrics["gmts/clip_fraction_selected"].append(m["clip_fraction_selected"])
        metrics["gmts/entropy_selected"].append(m["entropy_selected_mean"])
        metrics["gmts/entropy_all"].append(m["entropy_mean"])
        if chosen.selected is not None:
            unit = chosen.metrics()
            metrics["gmts/unit_selected_tokens"].append(unit["selected_tokens"])
            metrics["gmts/unit_valid_tokens"].append(unit["valid_tokens"])
            metrics["gmts/score_threshold"].append(unit["score_threshold"])
        # TRL's usual keys, so its dashboards keep working
        metrics["entropy"].append(m["entropy_mean"])
        if options.loss_type_entry.objective.clip_metrics:  # TRL's, for its ppo losses
            metrics["clip_ratio/low_mean"].append(m["clip_low_fraction"])
            metrics["clip_ratio/high_mean"].append(m["clip_high_fraction"])
            metrics["clip_ratio/region_mean"].append(
                m["clip_low_fraction"] + m["clip_high_fraction"]
            )
        if "kl_mean" in m:
            metrics["kl"].append(m["kl_mean"])


@functools.lru_cache(maxsize=32)
def _objective_of(options: TRLLossOptions) -> ObjectiveConfig:
    """``options.objective()``, built once per distinct set of options."""
    return options.objective()


def _resolve_model_argument(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A model given by name (``smollm2-135m-instruct``), as a ``.gguf`` file or as a gmts run
    becomes its folder (:func:`gmts.models.loading.resolve_model_path`); a model object or a
    hub id reaches TRL unchanged."""
    from gmts.models.loading import resolve_model_path

    if args and isinstance(args[0], str):
        return (resolve_model_path(args[0]), *args[1:]), kwargs
    if isinstance(kwargs.get("model"), str):
        return args, {**kwargs, "model": resolve_model_path(kwargs["model"])}
    return args, kwargs
