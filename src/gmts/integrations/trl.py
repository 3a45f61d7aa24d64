"""GMTS / ETS token selection inside TRL's ``GRPOTrainer`` (TRL >= 1.10), without a fork.

``GMTSGRPOConfig`` adds the core ``SelectionConfig`` fields (prefixed ``gmts_``) to
``GRPOConfig``; ``GMTSGRPOTrainer`` replaces only ``_compute_loss``:

1. one forward pass (TRL's own ``_get_per_token_logps_and_entropies``) gives the current
   log-probs (with gradient) and entropies of the micro-batch;
2. TRL's loss options become a core objective (:mod:`gmts.integrations.trl_loss`: every
   ``loss_type``, ``importance_sampling_level``, ``delta``, ``epsilon`` / ``epsilon_high``,
   ``beta`` with ``use_bias_correction_kl``), and TRL's multiplicative factors of the policy
   term (the off-policy sequence mask, the vLLM importance-sampling ratio) its importance
   weights; omega is computed from exactly the tensors TRL's loss uses: current, old
   (``old_per_token_logps``, or the detached current ones when TRL skips them, so r = 1) and
   reference log-probs, the advantages and those weights;
3. the tokens are selected by the configured score over the selection unit on every
   accelerate process together (one global threshold; ``gmts_count`` says how many);
4. the loss is the core's ``policy_loss`` with a ``LossConfig``: ``gmts_normalize="selected"``
   is the paper's eq. 2 (a token-mean over the selected tokens of the selection unit on all
   processes, whatever ``loss_type``; divisors from ``LossConfig.denominators``);
   ``gmts_normalize="all"`` keeps exactly the divisor of TRL's ``loss_type`` (what TRL's
   ``top_entropy_quantile`` and the authors' code do);
5. TRL's entropy bonus (``entropy_coef``, ``use_adaptive_entropy``, with TRL's own adaptive
   controller) is added as TRL adds it, on the tokens the policy term trains on: the GMTS
   selection takes the place of TRL's entropy mask.

The selection unit (``gmts_unit``) is by default the whole optimizer step: all micro-batches
of one gradient-accumulation window on all processes (the paper's mini-batch); with
``gradient_accumulation_steps > 1`` that costs one extra no-grad forward over the window at
its first micro-batch. ``'micro-batch'`` selects each micro-batch (on all processes) on its
own, as TRL's own ``top_entropy_quantile`` does.

Rejected when the trainer is built: TRL's own entropy mask (``top_entropy_quantile < 1``: the
GMTS selection replaces it), and the few option values no core objective expresses exactly
(:meth:`TRLLossOptions.problems` names the obstacle).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from gmts.core.config import SelectionConfig
from gmts.core.loss import LossConfig, LossDenominators, TokenSums, policy_loss
from gmts.core.objectives import ObjectiveConfig
from gmts.core.step import select_for_update
from gmts.integrations.trl_loss import LOSS_TYPES, PolicyFactors, TRLLossOptions, policy_factors
from gmts.integrations.trl_state import TRLStepState

__all__ = [
    "GMTSGRPOConfig",
    "GMTSGRPOTrainer",
    "GMTSSelection",
    "SUPPORTED_LOSS_TYPES",
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

_CORE_FIELDS = {f.name: f for f in fields(SelectionConfig)}


def _core_help(name: str) -> str:
    """Help text of ``SelectionConfig.<name>`` (one source of truth for the documentation)."""
    return str(_CORE_FIELDS[name].metadata.get("help", ""))


def _default(name: str) -> Any:
    """Default of ``SelectionConfig.<name>``."""
    return _CORE_FIELDS[name].default


@dataclass
class GMTSGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the GMTS token-selection settings (``gmts_*``, see ``SelectionConfig``).

    Defaults are the paper's: GMTS score, top 20% of the tokens, normalised by the selected
    count, KL on the selected tokens. ``gmts_score="none"`` trains on every token (plain TRL
    loss computed by the core, useful as a control).
    """

    gmts_score: str = field(default=_default("score"), metadata={"help": _core_help("score")})
    gmts_ratio: float = field(default=_default("ratio"), metadata={"help": _core_help("ratio")})
    gmts_largest: bool = field(
        default=_default("largest"), metadata={"help": _core_help("largest")}
    )
    gmts_scope: str = field(
        default=_default("scope"),
        metadata={"help": _core_help("scope") + " In TRL only 'batch' and 'sequence' apply."},
    )
    gmts_unit: str = field(
        default=_default("unit"),
        metadata={
            "help": _core_help("unit")
            + " In TRL the mini-batch is the optimizer step (all accumulated micro-batches); "
            "with gradient_accumulation_steps > 1 it costs one extra no-grad forward per step."
        },
    )
    gmts_count: str = field(default=_default("count"), metadata={"help": _core_help("count")})
    gmts_ties: str = field(default=_default("ties"), metadata={"help": _core_help("ties")})
    gmts_zero_scores: str = field(
        default=_default("zero_scores"), metadata={"help": _core_help("zero_scores")}
    )
    gmts_omega: str = field(default=_default("omega"), metadata={"help": _core_help("omega")})
    gmts_omega_weighting: bool = field(
        default=_default("omega_weighting"), metadata={"help": _core_help("omega_weighting")}
    )
    gmts_normalize: str = field(
        default=_default("normalize"), metadata={"help": _core_help("normalize")}
    )
    gmts_kl_tokens: str = field(
        default=_default("kl_tokens"), metadata={"help": _core_help("kl_tokens")}
    )
    gmts_seed: int | None = field(
        default=None,
        metadata={"help": _core_help("seed") + " None: use the trainer's `seed`."},
    )
    gmts_vespo_trl_padding: bool = field(
        default=False,
        metadata={
            "help": "loss_type='vespo' with a vLLM token IS range [C_min, C_max] that excludes "
            "1: reproduce TRL 1.16's loss exactly. TRL's VESPO weight then sums the log IS "
            "ratio over every position of the micro-batch, padding included, where its ratio "
            "is 1 clipped to the range (truncate) or 0 (mask: log 1e-8 each), so a row's "
            "weight depends on its padding. False: such a range is refused."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gmts_selection_config()  # validates the gmts_* fields now, not at the first step

    def gmts_selection_config(self) -> SelectionConfig:
        """The core ``SelectionConfig`` these arguments describe."""
        values = {name: getattr(self, f"gmts_{name}") for name in _CORE_FIELDS}
        if values["seed"] is None:
            values["seed"] = int(self.seed)
        try:
            return SelectionConfig(**values)
        except ValueError as err:
            raise ValueError(f"invalid gmts_* setting: {err}") from err


def gmts_args(selection: SelectionConfig) -> dict[str, Any]:
    """The ``gmts_*`` keyword arguments of :class:`GMTSGRPOConfig` for a core SelectionConfig
    (e.g. ``GMTSGRPOConfig(**trl_kwargs, **gmts_args(SelectionConfig.preset("trl")))``)."""
    return {f"gmts_{name}": getattr(selection, name) for name in _CORE_FIELDS}


def check_trl_args(args: Any) -> None:
    """Raise ``ValueError`` listing every TRL option GMTSGRPOTrainer cannot honour.

    Args:
        args: a ``GMTSGRPOConfig``.
    """
    if not isinstance(args, GMTSGRPOConfig):
        raise ValueError(
            f"GMTSGRPOTrainer needs args=GMTSGRPOConfig(...), got {type(args).__name__}"
        )
    problems: list[str] = []
    selection = args.gmts_selection_config()
    problems.extend(TRLLossOptions.from_args(args).problems())
    if args.top_entropy_quantile < 1.0:
        problems.append(
            "top_entropy_quantile < 1 is TRL's own entropy mask, which the GMTS selection "
            "replaces; set it to 1.0 and use gmts_score='entropy' with gmts_ratio and the 'trl' "
            "preset (gmts_count='quantile', gmts_zero_scores='select', gmts_unit='micro-batch', "
            "gmts_normalize='all', gmts_kl_tokens='all') to reproduce TRL's loss"
        )
    if (
        selection.unit == "mini-batch"
        and selection.enabled
        and args.steps_per_generation is not None
        and args.steps_per_generation % args.gradient_accumulation_steps != 0
    ):
        problems.append(
            "gmts_unit='mini-batch' needs steps_per_generation to be a multiple of "
            "gradient_accumulation_steps (an optimizer step must not span two generations)"
        )
    if selection.normalize == "per-group":
        problems.append(
            "gmts_normalize='per-group' (the reference-code preset) divides each question "
            "group by its own token count; TRL's micro-batches shuffle a group's answers across "
            "steps and processes: use 'selected' or 'all'"
        )
    if selection.enabled and selection.scope == "group":
        problems.append(
            "gmts_scope='group' is not available in TRL: its micro-batches shuffle the rows of a "
            "question group across steps and processes; use 'batch' or 'sequence'"
        )
    if problems:
        raise ValueError(
            "GMTSGRPOTrainer cannot honour these settings:\n- " + "\n- ".join(problems)
        )


@dataclass(frozen=True)
class GMTSSelection:
    """The selection a micro-batch trains on.

    Attributes:
        selected: ``(B, T)`` bool mask of this micro-batch, or None (score 'none').
        unit_sums: token counts of the whole selection unit (this micro-batch, or every
            micro-batch of the optimizer step) summed over all processes; None without a
            selection.
        threshold: the unit's score threshold (None without a selection).
    """

    selected: torch.Tensor | None
    unit_sums: TokenSums | None
    threshold: float | None


@dataclass(frozen=True)
class _ScoredMicroBatch:
    """One buffered micro-batch of the selection window, scored without gradient; every
    tensor ``(B, T)`` (``ref_logprobs`` None without a KL term)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None
    policy: PolicyFactors


@dataclass(frozen=True)
class _WindowSelection:
    """The selection over one optimizer step's micro-batches (``gmts_unit='mini-batch'``).

    Attributes:
        start: the window's first TRL step (the cache key).
        masks: buffered slot -> ``(B, T)`` bool selection of that micro-batch.
        threshold: the window's score threshold.
        unit_sums: the window's token counts over all processes.
    """

    start: int
    masks: dict[int, torch.Tensor]
    threshold: float | None
    unit_sums: TokenSums


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

    def _gmts_scored(
        self, model: torch.nn.Module, batch: dict[str, Any], options: TRLLossOptions
    ) -> _ScoredMicroBatch:
        """One micro-batch scored as its training forward will be (no gradient)."""
        logprobs, entropy, _ = self._gmts_forward(model, batch)
        old_logprobs, ref_logprobs = self._gmts_score_inputs(batch, logprobs)
        policy = self._gmts_policy(options, batch, logprobs, old_logprobs)
        advantages = policy.advantages
        advantages = advantages[:, None] if advantages.dim() == 1 else advantages
        return _ScoredMicroBatch(
            logprobs=logprobs.detach(),
            entropy=entropy.detach().float(),
            old_logprobs=old_logprobs,
            advantages=advantages.expand_as(logprobs),
            mask=self._gmts_mask(batch),
            ref_logprobs=ref_logprobs,
            policy=policy,
        )

    @torch.no_grad()
    def _gmts_window(
        self, model: torch.nn.Module, loss_config: LossConfig, options: TRLLossOptions
    ) -> _WindowSelection:
        """Select over every micro-batch of the current optimizer step (all processes).

        One no-grad forward over the window's micro-batches (TRL's buffered slices) with the
        parameters this optimizer step differentiates at, so scores equal those of the
        training forwards. Cached per window.
        """
        state = TRLStepState.of(self)
        start = state.window_start
        cached = getattr(self, "_gmts_window_cache", None)
        if cached is not None and cached.start == start:
            return cached
        slots = state.window_slots()
        scored = [self._gmts_scored(model, state.buffered_inputs[slot], options) for slot in slots]

        def cat(name: str) -> torch.Tensor:  # (accumulation * B, T)
            return torch.cat([getattr(b, name) for b in scored], dim=0)

        objective = loss_config.objective
        paddings = {b.policy.vespo_padding_weight for b in scored} - {None}
        if paddings:  # one generation's micro-batches: TRL gives their padding one ratio
            if len(paddings) > 1:
                raise RuntimeError(f"TRL's IS ratio outside the mask differs: {paddings}")
            objective = replace(objective, vespo_padding_weight=paddings.pop())
        weights = [b.policy.importance_weights for b in scored]
        mask = cat("mask")
        result = select_for_update(
            self.gmts_selection,
            objective,
            logprobs=cat("logprobs"),
            old_logprobs=cat("old_logprobs"),
            advantages=cat("advantages"),
            response_mask=mask,
            entropy=cat("entropy"),
            ref_logprobs=cat("ref_logprobs") if self.beta != 0.0 else None,
            process_group=self._gmts_process_group(),
            step=start,
            importance_weights=None if weights[0] is None else torch.cat(weights, dim=0),
        )
        rows = [b.mask.shape[0] for b in scored]
        cache = _WindowSelection(
            start=start,
            masks=dict(zip(slots, torch.split(result.selected, rows, dim=0))),
            threshold=result.threshold,
            unit_sums=TokenSums.count(mask, result.selected).reduced(self._gmts_reduce),
        )
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
    ) -> GMTSSelection:
        """The selection of this micro-batch: from its step's window, or of its own."""
        if not self.gmts_selection.enabled:
            return GMTSSelection(selected=None, unit_sums=None, threshold=None)
        mask = self._gmts_mask(inputs)
        if self._gmts_uses_step_unit(mode):
            window = self._gmts_window(model, loss_config, options)
            state = TRLStepState.of(self)
            if inputs is not state.buffered_inputs[state.slot]:
                raise RuntimeError(
                    "gmts_unit='mini-batch' could not match this micro-batch to TRL's buffered "
                    "generation batch; use gmts_unit='micro-batch'"
                )
            return GMTSSelection(
                selected=window.masks[state.slot] & mask,
                unit_sums=window.unit_sums,
                threshold=window.threshold,
            )
        result = select_for_update(
            self.gmts_selection,
            loss_config.objective,
            logprobs=logprobs.detach(),
            old_logprobs=old_logprobs,
            advantages=policy.advantages,
            response_mask=mask,
            entropy=entropy.detach().float(),
            ref_logprobs=ref_logprobs,
            process_group=self._gmts_process_group(),
            step=TRLStepState.of(self).step,
            importance_weights=policy.importance_weights,
        )
        unit_sums = TokenSums.count(mask, result.selected).reduced(self._gmts_reduce)
        return GMTSSelection(result.selected, unit_sums, result.threshold)

    def _trl_divisor(
        self, options: TRLLossOptions, inputs: dict[str, Any], mask: torch.Tensor, mode: str
    ) -> tuple[float | None, float]:
        """``(divisor, accumulation scale)`` of TRL 1.16's ``loss_type`` for this micro-batch
        (:class:`gmts.integrations.trl_loss.DivisorInputs`)."""
        divisor = options.loss_type_entry.divisor
        return divisor(
            TRLStepState.of(self).divisor_inputs(
                rows=int(mask.shape[0]),
                num_items_in_batch=inputs.get("num_items_in_batch"),
                train=mode == "train",
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
        selection = self._gmts_select(
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

        divisor, scale = self._trl_divisor(options, inputs, mask, mode)
        denominators = None if divisor is None else LossDenominators(divisor, divisor)
        if selection.selected is not None and loss_config.normalize == "selected":
            # Paper eq. 2: divide by the selection unit's counts on every process (the core's
            # rule); DDP averages the per-process gradients, hence the division by n_proc. A
            # unit spanning the accumulation window needs no further accumulation scaling.
            n_proc = self.accelerator.num_processes
            unit = loss_config.denominators(selection.unit_sums)
            denominators = LossDenominators(unit.policy / n_proc, unit.kl / n_proc)
            if self._gmts_uses_step_unit(mode):
                scale = 1.0
            else:
                scale = float(self.current_gradient_accumulation_steps if mode == "train" else 1)

        loss, sums = policy_loss(
            logprobs,
            old_logprobs,
            policy.advantages,
            mask,
            loss_config,
            selected=selection.selected,
            ref_logprobs=ref_logprobs,
            entropy=entropy.detach().float(),
            denominators=denominators,
            importance_weights=policy.importance_weights,
        )
        unscaled = loss.detach()
        loss = loss / scale
        if self._entropy_bonus_enabled:
            # the bonus acts on the tokens the policy term trains on, as TRL's acts on
            # mask * entropy_mask: the GMTS selection takes the place of TRL's entropy mask
            carriers = mask if selection.selected is None else mask & selection.selected
            loss = loss - self._gmts_entropy_bonus(entropy, carriers, mode, unscaled)
        if aux_loss is not None:
            accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss.detach()).mean().item()
            )
        self._gmts_log(mode, sums.reduced(self._gmts_reduce), selection, options)
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
        self, mode: str, sums: TokenSums, selection: GMTSSelection, options: TRLLossOptions
    ) -> None:
        """Global (all-process) selection metrics through TRL's ``self._metrics``."""
        m = sums.metrics()
        metrics = self._metrics[mode]
        metrics["gmts/selected_fraction"].append(m["selected_fraction"])
        metrics["gmts/selected_tokens"].append(sums["selected_tokens"])
        metrics["gmts/valid_tokens"].append(sums["valid_tokens"])
        metrics["gmts/clip_fraction_selected"].append(m["clip_fraction_selected"])
        metrics["gmts/entropy_selected"].append(m["entropy_selected_mean"])
        metrics["gmts/entropy_all"].append(m["entropy_mean"])
        if selection.unit_sums is not None:
            metrics["gmts/unit_selected_tokens"].append(selection.unit_sums["selected_tokens"])
            metrics["gmts/unit_valid_tokens"].append(selection.unit_sums["valid_tokens"])
        if selection.threshold is not None:
            metrics["gmts/score_threshold"].append(float(selection.threshold))
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
