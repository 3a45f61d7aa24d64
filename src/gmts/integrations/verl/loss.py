"""The GMTS actor loss for verl's engine workers (verl >= 0.9), without a fork.

verl's engine workers run the actor update as: mini-batch ``TensorDict`` ->
``engine.train_batch(data, loss_function)`` -> global token count (all-reduced over data-parallel
ranks) -> micro-batches -> ``loss_function(model_output, data, dp_group)`` per micro-batch.
:class:`GMTSPolicyLoss` is such a ``loss_function`` (installed with the worker's ``set_loss_fn``)
with one extra step, :meth:`GMTSPolicyLoss.prepare_mini_batch`, that the plugin's engine hook
calls on the whole mini-batch before it is split.

Both of verl's trainer paths reach this code, with different layouts of the response fields
(``response_mask``, ``old_log_probs``, ``advantages``, ``ref_log_prob``,
``rollout_is_weights``):

- the V1 trainer (``trainer.use_v1=true``, verl 0.9's default) hands over jagged nested tensors
  ``(B, j)`` (one row per answer, its own length), ``old_log_probs`` often in bf16;
- the legacy trainer hands over padded ``(B, R)`` tensors.

Both are read the way verl's own ``ppo_loss`` reads them: ``data.select(...).to_padded_tensor()``
gives padded ``(B, R)`` tensors, R = the longest response of the (mini- or micro-) batch.

1. per-token quantities of the mini-batch (padded, float32 whatever the input dtype):
   ``score_inputs='current'`` runs one extra no-grad forward pass with the parameters about to
   be updated (exact r, I(r, A), KL and entropy for every mini-batch); ``'rollout'`` uses
   ``old_log_probs`` (r = 1);
2. omega of verl's own objective: ``actor.policy_loss.loss_mode`` and ``kl_loss_type`` as the
   matching core objective (:mod:`~gmts.integrations.verl.loss_modes`), with the importance
   weights that loss applies (verl's ``rollout_is_weights``; for ``bypass_mode`` the IS weights
   and rejections verl computes inside its loss) folded in by the core;
3. the core's selection step (:func:`gmts.core.step.selection_step`, as the standalone trainer
   and TRL), with the engine's DP group: exactly k = ceil(ratio * N) tokens selected over the
   mini-batch of all data-parallel ranks, their global counts and the loss's divisors; the
   mask is stored per row as
   ``data["gmts_selected"]`` in the layout of ``response_mask`` (jagged nested when that is
   nested, padded otherwise), so it follows the rows through verl's micro-batching and
   reordering, and the global selected count S as ``gmts_num_selected``.

The loss is verl's own policy loss function (its ``loss_mode``) on the full response mask with
the unselected tokens' loss zeroed (:mod:`~gmts.integrations.verl.terms`), aggregated and
divided by the core's rule (``gmts.core.loss.LossConfig``: its ``aggregation``, and the
divisors of the selection step on the mini-batch's global counts, computed once in
:func:`prepare_selection`): ``normalize='selected'`` is eq. 2, a token-mean over S whatever
verl's ``loss_agg_mode``; ``normalize='all'`` keeps verl's aggregation counting every valid
token (N for token-mean; per answer |o_i|, then the rows, for seq-mean-token-mean). The KL loss
(verl's ``kl_penalty``) covers the selected tokens (``kl_tokens='selected'``) or all valid
tokens (``'all'``), with the core's KL divisor. The entropy bonus stays verl's (all tokens,
verl's divisor). Without a selection (score='none') the loss is verl's ``ppo_loss`` itself.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from gmts.core.config import SelectionConfig
from gmts.core.loss import LossConfig
from gmts.core.objectives import ObjectiveConfig
from gmts.core.step import UpdateBatch, UpdateLayout, selection_step
from gmts.integrations.verl.actor_config import VERL_AGGREGATIONS, loss_mode_name
from gmts.integrations.verl.loss_modes import (
    check_actor_config,
    get_loss_mode,
    objective_from_actor_config,
)
from gmts.integrations.verl.settings import GMTSVerlSettings
from gmts.integrations.verl.terms import MicroBatch

__all__ = [
    "GMTSPolicyLoss",
    "SELECTED_KEY",
    "VERL_AGGREGATIONS",
    "check_actor_config",
    "gmts_ppo_loss",
    "objective_from_actor_config",
    "prepare_selection",
]

SELECTED_KEY = "gmts_selected"
PICKED_KEY = "gmts_cov_picked"  # clip_cov / kl_cov's pick over the mini-batch (omega scores)
NUM_SELECTED_KEY = "gmts_num_selected"
THRESHOLD_KEY = "gmts_threshold"
DIVISORS_KEY = "gmts_divisors"  # (policy, KL) from the core's LossConfig.denominators


# --------------------------------------------------------------------------------------------
# the response fields, in either of verl's layouts


def padded_response_fields(data: Any, keys: list[str]) -> Any:
    """``keys`` of ``data`` as padded ``(B, R)`` tensors, the way verl's ``ppo_loss`` reads them.

    ``data.select(*keys).to_padded_tensor()``: jagged nested fields (V1 trainer) are padded with
    zeros to R = the longest response in ``data``; padded fields (legacy trainer) pass unchanged.
    """
    missing = [key for key in keys if key not in data]
    if missing:
        raise ValueError(f"the actor mini-batch has no {missing} (fields: {sorted(data.keys())})")
    return data.select(*keys).to_padded_tensor()


def _like_response_mask(selected: torch.Tensor, data: Any) -> torch.Tensor:
    """``selected`` ``(B, R)`` in the layout of ``data['response_mask']``: jagged nested ``(B, j)``
    when that is nested (verl's ``response_to_nested``), else padded; on its device."""
    response_mask = data["response_mask"]
    selected = selected.to(response_mask.device)
    if not response_mask.is_nested:
        return selected
    from verl.workers.utils.padding import response_to_nested

    return response_to_nested(selected, response_mask)


# --------------------------------------------------------------------------------------------
# selection on the whole mini-batch


def prepare_selection(
    data: Any,
    settings: GMTSVerlSettings,
    objective: ObjectiveConfig,
    *,
    actor_config: Any = None,
    logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    process_group: Any = None,
    step: int = 0,
) -> Any:
    """Select the tokens of a whole (local shard of a) mini-batch and store the result in it.

    Args:
        data: verl ``TensorDict`` with ``response_mask``, ``old_log_probs``, ``advantages``,
            (for a KL objective) ``ref_log_prob`` and optionally ``rollout_is_weights``, each
            padded ``(B, R)`` (legacy trainer) or jagged nested ``(B, j)`` (V1 trainer).
        objective: the core objective omega differentiates
            (:func:`objective_from_actor_config`).
        actor_config: verl's actor config; its loss mode decides the importance weights folded
            into omega (bypass_mode computes its own). None: the batch's
            ``rollout_is_weights``, as every loss mode but bypass_mode applies them.
        logprobs, entropy: ``(B, R)`` current-policy statistics from the extra pass, or None
            (rollout inputs: logprobs = old_log_probs, so r = 1). R must be the padded width of
            the response fields (verl's ``no_padding_2_padding`` gives it).
        process_group: the data-parallel group; selection and counts are global over it.
        step: seeds the 'random' score.

    Returns:
        ``data``, with ``gmts_selected`` (bool, in the layout of ``response_mask``) and the
        non-tensor entries ``gmts_num_selected`` (global S, at least 1) and ``gmts_threshold``.
        Scores and selection are computed in float32 whatever the fields' dtype (V1 delivers
        ``old_log_probs`` in bf16). Without a selection (score 'none'): ``data`` unchanged, so
        the loss is verl's own ``ppo_loss``.
    """
    from verl.utils import tensordict_utils as tu

    if not settings.selection.enabled:
        return data
    batch = _update_batch(data, settings, objective, actor_config, logprobs, entropy, process_group)
    chosen = selection_step(
        LossConfig.of(objective, settings.selection),
        batch,
        layout=UpdateLayout(process_group=process_group),  # verl's aggregation scales by DP
        step=step,
    )
    response_mask = batch.response_mask
    selected = response_mask if chosen.selected is None else chosen.selected & response_mask
    counts, divisors = chosen.counts, chosen.denominators
    data[SELECTED_KEY] = _like_response_mask(selected, data)
    if chosen.picked is not None and settings.needs_omega:  # omega used this pick: so must the loss
        data[PICKED_KEY] = _like_response_mask(chosen.picked & response_mask, data)
    threshold = math.nan if chosen.threshold is None else float(chosen.threshold)
    tu.assign_non_tensor(
        data,
        **{
            NUM_SELECTED_KEY: max(counts["selected_tokens"], 1.0),
            DIVISORS_KEY: (divisors.policy, divisors.kl),
            THRESHOLD_KEY: threshold,
        },
    )
    return data


def _update_batch(
    data: Any,
    settings: GMTSVerlSettings,
    objective: ObjectiveConfig,
    actor_config: Any,
    logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    process_group: Any,
) -> UpdateBatch:
    """The mini-batch's response fields as the core's :class:`UpdateBatch`: padded ``(B, R)``
    float32 on the selection's device, with the importance weights verl's loss applies."""
    keys = ["response_mask", "old_log_probs", "advantages"]
    keys += [k for k in ("rollout_is_weights",) if k in data]
    if objective.kl_coef > 0:
        keys.append("ref_log_prob")
    fields = padded_response_fields(data, keys)
    device = _selection_device(logprobs, process_group, fields["response_mask"].device)
    response_mask = fields["response_mask"].to(device).bool()  # (B, R)
    width = response_mask.shape[1]
    old_logprobs = fields["old_log_probs"].to(device).float()  # (B, R)
    advantages = fields["advantages"].to(device).float()  # (B, R)
    batch_weights = None
    if "rollout_is_weights" in fields:
        batch_weights = fields["rollout_is_weights"].to(device).float()  # (B, R)
        if bool((batch_weights[response_mask] < 0).any()):
            raise ValueError("rollout_is_weights has negative entries; GMTS needs weights >= 0")
    ref_logprobs = None
    if objective.kl_coef > 0:
        ref_logprobs = fields["ref_log_prob"].to(device).float()
    for name, value in (("logprobs", logprobs), ("entropy", entropy)):
        if value is not None and tuple(value.shape) != tuple(response_mask.shape):
            raise ValueError(
                f"{name} has shape {tuple(value.shape)}, the mini-batch's padded response "
                f"fields {(response_mask.shape[0], width)}"
            )
    current = old_logprobs if logprobs is None else logprobs.to(device).float()
    importance_weights = batch_weights
    if settings.needs_omega and actor_config is not None:  # the weights verl's loss applies
        mode = get_loss_mode(loss_mode_name(actor_config))
        importance_weights = mode.importance_weights(
            actor_config, current, old_logprobs, response_mask, batch_weights
        )
    return UpdateBatch(
        logprobs=current,
        old_logprobs=old_logprobs,
        advantages=advantages,
        response_mask=response_mask,
        entropy=None if entropy is None else entropy.to(device).float(),
        ref_logprobs=ref_logprobs,
        importance_weights=importance_weights,
    )


def _selection_device(
    logprobs: torch.Tensor | None, process_group: Any, home: torch.device
) -> torch.device:
    """Where to select: with the model outputs, on the GPU for an NCCL group, else at home."""
    if logprobs is not None:
        return logprobs.device
    if process_group is not None and torch.distributed.get_backend(process_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return home


# --------------------------------------------------------------------------------------------
# the per-micro-batch loss


def gmts_ppo_loss(
    config: Any,
    model_output: Any,
    data: Any,
    dp_group: Any = None,
    *,
    settings: GMTSVerlSettings,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``ppo_loss`` restricted to the selected tokens (same signature plus ``settings``).

    Args:
        config: verl ``ActorConfig``. model_output: ``{"log_probs", "entropy"?}`` of the
            micro-batch (packed or nested over prompt + response, as the engine returns them).
            data: the micro-batch ``TensorDict`` (padded or nested response fields), carrying
            ``gmts_selected`` from :func:`prepare_selection` unless selection is off.

    Returns:
        ``(loss, metrics)`` like ``ppo_loss``; loss is scaled so that summing it over
        micro-batches and averaging gradients over DP ranks gives the mini-batch loss.

    Only the selected tokens carry policy (and, with ``kl_tokens='selected'``, KL) loss: verl's
    own policy loss function of ``policy_loss.loss_mode`` runs on the full response mask with
    the unselected tokens' loss zeroed (:mod:`~gmts.integrations.verl.terms`), divided by the
    core's divisor (``gmts_divisors`` from :func:`prepare_selection`). Without a selection
    (score='none', or a forward-only evaluation of the loss) this is verl's ``ppo_loss``.
    """
    if SELECTED_KEY not in data:
        if not settings.selection.enabled or not torch.is_grad_enabled():
            # nothing is trained on a selection: the loss is verl's own over every valid token
            from verl.workers.utils.losses import ppo_loss

            return ppo_loss(config, model_output, data, dp_group)
        raise ValueError(
            f"micro-batch has no {SELECTED_KEY!r}: the GMTS engine hook did not run on the "
            "mini-batch (is the gmts verl plugin registered in this worker process?)"
        )
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric

    selection = settings.selection
    micro, entropy, ref_log_prob = _micro_batch(config, model_output, data, selection)
    response_mask, info = micro.response_mask, micro.info
    batch_num_tokens = info["batch_num_tokens"]
    num_selected = tu.get_non_tensor_data(data=data, key=NUM_SELECTED_KEY, default=None)
    threshold = tu.get_non_tensor_data(data=data, key=THRESHOLD_KEY, default=math.nan)
    uses_global_info = (
        info["dp_size"] > 1
        or batch_num_tokens is not None
        or info["global_batch_size"] is not None
        or config.loss_scale_factor is not None
    )
    metric_aggregation = AggregationType.SUM if uses_global_info else AggregationType.MEAN
    pg_loss, pg_metrics = get_loss_mode(loss_mode_name(config)).policy_term(micro)
    metrics: dict[str, Any] = dict(Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN))
    metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)
    loss = pg_loss

    if entropy is not None:  # verl's entropy bonus, over every valid token, verl's divisor
        entropy_loss = agg_loss(
            loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **info
        )
        loss = loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=metric_aggregation)

    if config.use_kl_loss:
        kl_divisor = tu.get_non_tensor_data(data=data, key=DIVISORS_KEY, default=None)[1]
        kl_loss = _kl_loss(config, micro, ref_log_prob, selection.kl_tokens, kl_divisor)
        loss = loss + kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss, aggregation=metric_aggregation)
        metrics["kl_coef"] = config.kl_loss_coef

    if batch_num_tokens:
        metrics["gmts/selected_fraction"] = float(num_selected or 0) / float(batch_num_tokens)
        metrics["gmts/score_threshold"] = float(threshold)
    return loss, metrics


def _kl_loss(
    config: Any,
    micro: MicroBatch,
    ref_log_prob: torch.Tensor,
    kl_tokens: str,
    divisor: float,
) -> torch.Tensor:
    """verl's KL loss (its ``kl_penalty``) over the selected tokens (``kl_tokens='selected'``)
    or every valid one, aggregated as the policy term and divided by the core's KL divisor."""
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    kld = kl_penalty(
        logprob=micro.log_prob, ref_logprob=ref_log_prob, kl_penalty=config.kl_loss_type
    )  # (B, R)
    carriers = micro.keep.bool() if kl_tokens == "selected" else micro.response_mask
    kld = torch.where(carriers, kld, torch.zeros_like(kld))  # counted over the answer
    kl_info = replace(micro, divisor=divisor).verl_info(micro.aggregation)
    return agg_loss(
        loss_mat=kld,
        loss_mask=micro.response_mask,
        loss_agg_mode=micro.aggregation.name,
        **kl_info,
    )


def _micro_batch(
    config: Any, model_output: Any, data: Any, selection: SelectionConfig
) -> tuple[MicroBatch, torch.Tensor | None, torch.Tensor | None]:
    """The micro-batch's padded ``(B, R)`` fields as a :class:`MicroBatch` (the unselected
    tokens' ``keep`` 0), with its padded entropy and reference log-probs (None when absent)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    log_prob = no_padding_2_padding(model_output["log_probs"], data)  # (B, R)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    divisors = tu.get_non_tensor_data(data=data, key=DIVISORS_KEY, default=None)
    if divisors is None:
        raise ValueError(f"micro-batch has no {DIVISORS_KEY!r} (see prepare_selection)")
    wanted = ["response_mask", "old_log_probs", "advantages", SELECTED_KEY]
    wanted += [k for k in ("rollout_is_weights", "ref_log_prob", PICKED_KEY) if k in data]
    fields = padded_response_fields(data, wanted)
    response_mask = fields["response_mask"].bool()  # (B, R)
    selected = fields[SELECTED_KEY].bool() & response_mask
    info = {
        "dp_size": data["dp_size"],
        "batch_num_tokens": data["batch_num_tokens"],  # valid tokens of the mini-batch, all ranks
        "global_batch_size": data["global_batch_size"],
        "loss_scale_factor": config.loss_scale_factor,
    }
    # the core's rule: eq. 2's token-mean over S, or the objective's own aggregation
    aggregation = LossConfig.of(objective_from_actor_config(config), selection).aggregation(
        selection=True
    )
    micro = MicroBatch(
        config=config,
        log_prob=log_prob,
        old_log_prob=fields["old_log_probs"],
        advantages=fields["advantages"],
        response_mask=response_mask,
        keep=selected.to(log_prob.dtype),
        rollout_is_weights=fields.get("rollout_is_weights", None),
        aggregation=aggregation,
        divisor=divisors[0],
        normalize=selection.normalize,
        info=info,
        picked=fields[PICKED_KEY].bool() & response_mask if PICKED_KEY in fields else None,
    )
    return micro, entropy, fields.get("ref_log_prob", None)


class GMTSPolicyLoss:
    """A verl engine-worker loss function (``set_loss_fn``) with GMTS selection.

    ``__call__`` has ``ppo_loss``'s signature; :meth:`prepare_mini_batch` is called by the
    plugin's ``BaseEngine.train_batch`` hook on every mini-batch before micro-batching.
    Picklable, so verl can ship it to its Ray workers.
    """

    def __init__(self, config: Any, settings: GMTSVerlSettings) -> None:
        if not isinstance(settings, GMTSVerlSettings):
            raise ValueError(f"settings must be GMTSVerlSettings, got {type(settings).__name__}")
        check_actor_config(config, settings)
        self.config = config
        self.settings = settings
        # the core objective omega differentiates (None without a selection: verl's own loss)
        self.objective = objective_from_actor_config(config) if settings.selection.enabled else None
        self.steps = 0

    def __call__(
        self, model_output: Any, data: Any, dp_group: Any = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        return gmts_ppo_loss(self.config, model_output, data, dp_group, settings=self.settings)

    def prepare_mini_batch(self, engine: Any, data: Any) -> Any:
        """Select on the whole mini-batch ``data`` (this rank's shard), global over DP ranks."""
        if not self.settings.selection.enabled:
            return data
        group = _dp_group(engine)
        logprobs = entropy = None
        if self.settings.score_inputs == "current":
            logprobs, entropy = current_statistics(engine, data)
        prepare_selection(
            data,
            self.settings,
            self.objective,
            actor_config=self.config,
            logprobs=logprobs,
            entropy=entropy,
            process_group=group,
            step=self.steps,
        )
        self.steps += 1
        return data


def _dp_group(engine: Any) -> Any:
    """The engine's data-parallel group when torch.distributed runs with more than one rank."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    group = engine.get_data_parallel_group()
    if group is None or torch.distributed.get_world_size(group=group) <= 1:
        return None
    return group


@torch.no_grad()
def current_statistics(engine: Any, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact variant's extra pass: ``(logprobs, entropy)`` ``(B, R)`` at the current weights.

    Runs ``engine.infer_batch`` (forward only, no grad) on the mini-batch with entropy on, then
    restores the mini-batch's own ``calculate_entropy`` flag.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    keep = tu.get_non_tensor_data(data=data, key="calculate_entropy", default=False)
    tu.assign_non_tensor(data, calculate_entropy=True)
    try:
        output = engine.infer_batch(data, loss_function=None)
    finally:
        tu.assign_non_tensor(data, calculate_entropy=keep)
    model_output = output.get("model_output") if output is not None else None
    if not model_output or "log_probs" not in model_output or "entropy" not in model_output:
        raise ValueError(
            "the engine returned no log_probs/entropy on this rank (pipeline-parallel stages "
            "other than the last have no outputs); GMTS's exact pass needs them on every rank"
        )
    logprobs = no_padding_2_padding(model_output["log_probs"], data).float()
    entropy = no_padding_2_padding(model_output["entropy"], data).float()
    return logprobs, entropy
