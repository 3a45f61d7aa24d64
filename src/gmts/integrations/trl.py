"""GMTS / ETS token selection inside TRL's ``GRPOTrainer`` (TRL >= 1.10), without a fork.

``GMTSGRPOConfig`` adds the core ``SelectionConfig`` fields (prefixed ``gmts_``) to
``GRPOConfig``; ``GMTSGRPOTrainer`` replaces only ``_compute_loss``:

1. one forward pass (TRL's own ``_get_per_token_logps_and_entropies``) gives the current
   log-probs (with gradient) and entropies of the micro-batch;
2. omega is computed from exactly the tensors TRL's loss uses: current, old
   (``old_per_token_logps``, or the detached current ones when TRL skips them, so r = 1) and
   reference log-probs, the advantages, ``epsilon`` / ``epsilon_high`` and TRL's k3 KL with
   ``beta`` and ``use_bias_correction_kl``;
3. exactly k = ceil(ratio * N) tokens are selected by the configured score, N counted over the
   selection unit on every accelerate process together (one global threshold, no
   torch.quantile);
4. the loss is aggregated by the core's ``policy_loss``:
   ``gmts_normalize="selected"`` is the paper's eq. 2 (a token-mean over the selected tokens of
   all processes, whatever ``loss_type``); ``gmts_normalize="all"`` keeps the divisor of TRL's
   ``loss_type`` (what TRL's ``top_entropy_quantile`` and the authors' code do).

The selection unit (``gmts_selection_unit``) is by default the whole optimizer step: all
micro-batches of one gradient-accumulation window on all processes (the paper's mini-batch);
with ``gradient_accumulation_steps > 1`` that costs one extra no-grad forward over the window
at its first micro-batch. ``'micro-batch'`` selects each micro-batch (on all processes) on its
own, as TRL's own ``top_entropy_quantile`` does.

TRL options whose gradient is not the clipped objective that omega describes (other loss
types, sequence-level importance sampling, two-sided clipping ``delta``, off-policy masks, vLLM
importance-sampling correction, entropy bonuses, TRL's own entropy mask) are rejected when the
trainer is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from gmts.core.config import SelectionConfig
from gmts.core.objectives import ObjectiveConfig, loss_denominator, policy_loss
from gmts.core.step import SelectionResult, select_for_update

__all__ = ["GMTSGRPOConfig", "GMTSGRPOTrainer", "SUPPORTED_LOSS_TYPES", "check_trl_args"]

SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
"""TRL loss types whose per-token gradient is the clipped PPO objective omega describes."""

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

_SELECTION_FIELDS = ("score", "ratio", "largest", "scope", "normalize", "kl_tokens", "seed")


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
    gmts_normalize: str = field(
        default=_default("normalize"), metadata={"help": _core_help("normalize")}
    )
    gmts_kl_tokens: str = field(
        default=_default("kl_tokens"), metadata={"help": _core_help("kl_tokens")}
    )
    gmts_selection_unit: str = field(
        default="step",
        metadata={
            "help": "Where the top-ratio is taken: 'step' (all micro-batches of one optimizer "
            "step on all processes, the paper's mini-batch; costs one extra no-grad forward per "
            "step when gradient_accumulation_steps > 1) or 'micro-batch' (each micro-batch on "
            "all processes, like TRL's top_entropy_quantile; no extra pass)."
        },
    )
    gmts_seed: int | None = field(
        default=None,
        metadata={"help": _core_help("seed") + " None: use the trainer's `seed`."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gmts_selection_config()  # validates the gmts_* fields now, not at the first step

    def gmts_selection_config(self) -> SelectionConfig:
        """The core ``SelectionConfig`` these arguments describe."""
        values = {name: getattr(self, f"gmts_{name}") for name in _SELECTION_FIELDS}
        if values["seed"] is None:
            values["seed"] = int(self.seed)
        try:
            return SelectionConfig(**values)
        except ValueError as err:
            raise ValueError(f"invalid gmts_* setting: {err}") from err


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
    if args.loss_type not in SUPPORTED_LOSS_TYPES:
        problems.append(
            f"loss_type={args.loss_type!r}: supported are {list(SUPPORTED_LOSS_TYPES)} "
            "(other losses have a different per-token gradient than the clipped objective)"
        )
    if args.top_entropy_quantile < 1.0:
        problems.append(
            "top_entropy_quantile < 1 is TRL's own entropy mask; set it to 1.0 and use "
            "gmts_score='entropy' with gmts_ratio (and gmts_normalize='all', "
            "gmts_kl_tokens='all' to reproduce TRL's loss)"
        )
    if args.importance_sampling_level != "token":
        problems.append(
            f"importance_sampling_level={args.importance_sampling_level!r}: only 'token' "
            "(sequence-level ratios give every token of a sequence the same omega)"
        )
    if getattr(args, "delta", None) is not None:
        problems.append("delta (two-sided clipping) changes omega; set delta=None")
    if getattr(args, "off_policy_mask_threshold", None) is not None:
        problems.append("off_policy_mask_threshold is not supported; set it to None")
    if getattr(args, "use_vllm", False) and getattr(
        args, "vllm_importance_sampling_correction", False
    ):
        problems.append(
            "use_vllm with vllm_importance_sampling_correction=True multiplies the token loss "
            "by an importance weight omega does not include; set "
            "vllm_importance_sampling_correction=False"
        )
    if getattr(args, "entropy_coef", 0.0) != 0.0 or getattr(args, "use_adaptive_entropy", False):
        problems.append("the entropy bonus (entropy_coef / use_adaptive_entropy) is not supported")
    if getattr(args, "use_liger_kernel", False):
        problems.append("use_liger_kernel computes the loss outside _compute_loss; set it False")
    if args.gmts_selection_unit not in ("step", "micro-batch"):
        problems.append(
            f"gmts_selection_unit={args.gmts_selection_unit!r}: use 'step' or 'micro-batch'"
        )
    elif (
        args.gmts_selection_unit == "step"
        and selection.enabled
        and args.steps_per_generation is not None
        and args.steps_per_generation % args.gradient_accumulation_steps != 0
    ):
        problems.append(
            "gmts_selection_unit='step' needs steps_per_generation to be a multiple of "
            "gradient_accumulation_steps (an optimizer step must not span two generations)"
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


class GMTSGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` training on the tokens GMTS (or ETS, ...) selects.

    Construct it exactly like ``GRPOTrainer`` with ``args=GMTSGRPOConfig(...)``. Besides TRL's
    metrics it logs, per optimizer step: ``gmts/selected_fraction``, ``gmts/selected_tokens``,
    ``gmts/valid_tokens`` (global over processes), ``gmts/score_threshold``,
    ``gmts/clip_fraction_selected``, ``gmts/entropy_selected`` and ``gmts/entropy_all``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        train_args = kwargs.get("args", args[2] if len(args) > 2 else None)
        check_trl_args(train_args)  # before any model loading or generation setup
        super().__init__(*args, **kwargs)
        self.gmts_selection: SelectionConfig = train_args.gmts_selection_config()
        self.gmts_last: dict[str, float] = {}  # counts of the last micro-batch (tests, debugging)

    # ----------------------------------------------------------------------------------------

    def _gmts_objective(self, aggregation: str) -> ObjectiveConfig:
        """TRL's clip and KL settings as a core ObjectiveConfig."""
        return ObjectiveConfig(
            clip_low=float(self.epsilon_low),
            clip_high=float(self.epsilon_high),
            dual_clip=None,
            kl_coef=float(self.beta),
            kl_ratio_correction=bool(self.beta != 0.0 and self.args.use_bias_correction_kl),
            kl_clamp=None,
            aggregation=aggregation,
        )

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

    def _gmts_uses_step_unit(self, mode: str) -> bool:
        return (
            mode == "train"
            and self.gmts_selection.enabled
            and self.args.gmts_selection_unit == "step"
            and self.current_gradient_accumulation_steps > 1
        )

    @torch.no_grad()
    def _gmts_window(self, model: torch.nn.Module, group: Any) -> dict[str, Any]:
        """Select over every micro-batch of the current optimizer step (all processes).

        One no-grad forward over the window's micro-batches (TRL's buffered slices) with the
        parameters this optimizer step differentiates at, so scores equal those of the
        training forwards. Cached per window.
        """
        accumulation = self.current_gradient_accumulation_steps
        start = int(self._step) - int(self._step) % accumulation
        cached = getattr(self, "_gmts_window_cache", None)
        if cached is not None and cached["start"] == start:
            return cached
        per_generation = self.args.steps_per_generation
        slots = [(start + i) % per_generation for i in range(accumulation)]
        batches = [self._buffered_inputs[slot] for slot in slots]
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in ("lp", "ent", "old", "adv", "mask")}
        refs = []
        for batch in batches:
            logprobs, entropy, _ = self._gmts_forward(model, batch)
            old_logprobs, ref_logprobs = self._gmts_score_inputs(batch, logprobs)
            adv = batch["advantages"]
            parts["lp"].append(logprobs.detach())
            parts["ent"].append(entropy.detach().float())
            parts["old"].append(old_logprobs)
            parts["adv"].append(adv[:, None].expand_as(logprobs) if adv.dim() == 1 else adv)
            parts["mask"].append(self._gmts_mask(batch))
            refs.append(ref_logprobs)
        cat = {k: torch.cat(v, dim=0) for k, v in parts.items()}  # (accumulation * B, T)
        result = select_for_update(
            self.gmts_selection,
            self._gmts_objective("token-mean"),
            logprobs=cat["lp"],
            old_logprobs=cat["old"],
            advantages=cat["adv"],
            response_mask=cat["mask"],
            entropy=cat["ent"],
            ref_logprobs=torch.cat(refs, dim=0) if self.beta != 0.0 else None,
            process_group=group,
            step=start,
        )
        rows = [b.shape[0] for b in parts["mask"]]
        masks = dict(zip(slots, torch.split(result.selected, rows, dim=0)))
        cache = {
            "start": start,
            "masks": masks,
            "threshold": result.threshold,
            "selected_tokens": loss_denominator(
                cat["mask"], result.selected, "token-mean", "selected", group
            ),
            "valid_tokens": loss_denominator(cat["mask"], None, "token-mean", "all", group),
        }
        self._gmts_window_cache = cache
        return cache

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        aux_enabled = bool(getattr(self, "aux_loss_enabled", False))
        logprobs, entropy, aux_loss = self._gmts_forward(
            model, inputs, compute_aux_loss=aux_enabled
        )
        response_mask = self._gmts_mask(inputs)  # (B, T)
        advantages = inputs["advantages"]  # (B,) or (B, T)
        old_logprobs, ref_logprobs = self._gmts_score_inputs(inputs, logprobs)

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        n_proc = self.accelerator.num_processes
        group = self._gmts_process_group()
        sel_cfg = self.gmts_selection
        normalize = sel_cfg.normalize if sel_cfg.enabled else "all"

        aggregation, denominator, post_scale = self._gmts_aggregation(
            inputs, response_mask, normalize, accumulation, n_proc
        )
        objective = self._gmts_objective(aggregation)
        # counting sets of the selection unit (micro-batch or optimizer step), all processes
        unit_selected = unit_valid = None
        if self._gmts_uses_step_unit(mode):
            window = self._gmts_window(model, group)
            slot = int(self._step) % self.args.steps_per_generation
            if inputs is not self._buffered_inputs[slot]:
                raise RuntimeError(
                    "gmts_selection_unit='step' could not match this micro-batch to TRL's "
                    "buffered generation batch; use gmts_selection_unit='micro-batch'"
                )
            selected = window["masks"][slot] & response_mask
            result = SelectionResult(selected=selected, scores=None, threshold=window["threshold"])
            unit_selected, unit_valid = window["selected_tokens"], window["valid_tokens"]
            post_scale = 1.0 if normalize == "selected" else post_scale
        else:
            result = select_for_update(
                sel_cfg,
                objective,
                logprobs=logprobs.detach(),
                old_logprobs=old_logprobs,
                advantages=advantages,
                response_mask=response_mask,
                entropy=entropy.detach().float(),
                ref_logprobs=ref_logprobs,
                process_group=group,
                step=int(self._step),
            )
            selected = result.selected  # (B, T) bool or None
            if selected is not None:
                unit_selected = loss_denominator(
                    response_mask, selected, "token-mean", "selected", group
                )
                unit_valid = loss_denominator(response_mask, None, "token-mean", "all", group)

        kl_denominator = None
        if normalize == "selected" and selected is not None:
            # Paper eq. 2: divide by S, the selected count of the whole selection unit on every
            # process; DDP averages the per-process gradients, hence S / num_processes here.
            denominator = unit_selected / n_proc
            if self.beta != 0.0:
                kl_denominator = unit_valid / n_proc

        loss, _ = policy_loss(
            logprobs,
            old_logprobs,
            advantages,
            response_mask,
            **objective.loss_kwargs(),
            ref_logprobs=ref_logprobs,
            selected=selected,
            normalize=normalize,
            kl_tokens=sel_cfg.kl_tokens,
            denominator=denominator,
            kl_denominator=kl_denominator,
        )
        loss = loss / post_scale
        if aux_loss is not None:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss.detach()).mean().item()
            )
        self._gmts_log(
            mode, logprobs, old_logprobs, ref_logprobs, advantages, response_mask, entropy, result
        )
        self.gmts_last["unit_selected_tokens"] = unit_selected
        self.gmts_last["unit_valid_tokens"] = unit_valid
        return loss

    def _gmts_aggregation(
        self,
        inputs: dict[str, Any],
        response_mask: torch.Tensor,
        normalize: str,
        accumulation: int,
        n_proc: int,
    ) -> tuple[str, float | None, float]:
        """``(core aggregation, policy divisor, extra divisor)`` reproducing TRL's ``loss_type``.

        Only used as is for ``normalize='all'``; ``'selected'`` replaces the divisor by S.
        """
        loss_type = self.loss_type
        rows = float(response_mask.shape[0])
        if normalize == "selected":
            return "token-mean", None, float(accumulation)
        if loss_type == "grpo":  # mean over local rows of per-sequence token means
            return "seq-mean-token-mean", rows, float(accumulation)
        if loss_type == "dr_grpo":  # sum / (B * max_completion_length)
            return "token-mean", rows * float(self.max_completion_length), float(accumulation)
        if loss_type == "bnpo":  # token-mean over every process's tokens of this micro-batch
            group = self._gmts_process_group()
            den = loss_denominator(response_mask, None, "token-mean", "all", group) / n_proc
            return "token-mean", den, float(accumulation)
        # dapo: TRL divides by the generation batch's global token count, rescaled to one
        # accumulation window per process; that already accounts for accumulation.
        den = float(inputs["num_items_in_batch"].clamp(min=1.0)) / n_proc
        if self.model.training:
            den = den * accumulation / self.args.steps_per_generation
        return "token-mean", den, 1.0

    @torch.no_grad()
    def _gmts_log(
        self,
        mode: str,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        entropy: torch.Tensor,
        result: Any,
    ) -> None:
        """Global (all-process) selection metrics through TRL's ``self._metrics``."""
        adv = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(logprobs)
        ratio = torch.exp(logprobs.detach() - old_logprobs)  # (B, T)
        low = (ratio < 1 - self.epsilon_low) & (adv < 0)
        high = (ratio > 1 + self.epsilon_high) & (adv > 0)
        clipped = (low | high) & response_mask
        selected = response_mask if result.selected is None else (result.selected & response_mask)
        ent = entropy.detach().float()
        parts = [
            response_mask.sum(),
            selected.sum(),
            (clipped & selected).sum(),
            torch.where(response_mask, ent, 0.0).sum(),
            torch.where(selected, ent, 0.0).sum(),
            (low & response_mask).sum(),
            (high & response_mask).sum(),
        ]
        if ref_logprobs is not None:
            log_rho = ref_logprobs - logprobs.detach()
            kl = torch.exp(log_rho) - log_rho - 1
            if self.args.use_bias_correction_kl:
                kl = kl * ratio
            parts.append(torch.where(response_mask, kl, 0.0).sum())
        local = torch.stack([p.double() for p in parts])
        total = self.accelerator.reduce(local, reduction="sum").tolist()
        valid, n_sel, clip_sel, ent_all, ent_sel, n_low, n_high = total[:7]
        self.gmts_last = {
            "local_valid_tokens": float(local[0]),
            "local_selected_tokens": float(local[1]),
            "valid_tokens": valid,
            "selected_tokens": n_sel,
        }

        def frac(num: float, den: float) -> float:
            return num / den if den > 0 else math.nan

        metrics = self._metrics[mode]
        metrics["gmts/selected_fraction"].append(frac(n_sel, valid))
        metrics["gmts/selected_tokens"].append(n_sel)
        metrics["gmts/valid_tokens"].append(valid)
        metrics["gmts/clip_fraction_selected"].append(frac(clip_sel, n_sel))
        metrics["gmts/entropy_selected"].append(frac(ent_sel, n_sel))
        metrics["gmts/entropy_all"].append(frac(ent_all, valid))
        if result.threshold is not None:
            metrics["gmts/score_threshold"].append(float(result.threshold))
        # TRL's usual keys, so its dashboards keep working
        metrics["entropy"].append(frac(ent_all, valid))
        metrics["clip_ratio/low_mean"].append(frac(n_low, valid))
        metrics["clip_ratio/high_mean"].append(frac(n_high, valid))
        metrics["clip_ratio/region_mean"].append(frac(n_low + n_high, valid))
        if ref_logprobs is not None:
            metrics["kl"].append(frac(total[7], valid))
