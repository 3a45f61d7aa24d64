"""Actor mini-batches in the two layouts of verl 0.9.1, built with verl's own functions.

Not a test module: imported by the verl tests (and the two-rank worker) through ``sys.path``.

Both builders start from the same answers (prompt and response token ids, the old policy's and
the reference policy's log-probs over prompt + response as the engine returns them, one reward
per answer) and follow the code path of one trainer:

- :func:`v1_actor_batch` (``trainer.use_v1=true``): ``AgentLoopWorkerTQ._agent_loop_postprocess``
  (one record per answer, stacked by ``tensordict_utils.list_of_dict_to_tensordict`` into jagged
  nested tensors), ``_compute_old_log_prob`` / ``_compute_ref_log_prob``
  (``response_from_nested``), ``_compute_advantage`` (padded through ``to_padded_tensor``, verl's
  GRPO estimator, back with ``response_to_nested``).
- :func:`legacy_actor_batch` (``trainer.use_v1=false``): the agent loop's left/right padding
  (``pad_sequence_to_length``), ``compute_position_id_with_mask``, ``compute_response_mask``,
  ``no_padding_2_padding`` for the log-probs, verl's GRPO estimator, then
  ``RayPPOTrainer._update_actor``: ``DataProto.to_tensordict`` and ``left_right_2_no_padding``.

Then :func:`mini_batches` splits a batch as ``TrainingWorker.train_mini_batch`` does
(``tensordict_utils.make_iterator``) and :func:`micro_batches` as the engine does
(``prepare_micro_batches``, dynamic batch sizes reorder rows). A ``row_id`` field travels with
the rows so a test can hand each micro-batch the model output of exactly its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

PAD = 0
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Answers:
    """Per answer i: token ids and the engine's packed outputs over prompt + response."""

    prompt_ids: list[torch.Tensor]  # (P_i,)
    response_ids: list[torch.Tensor]  # (R_i,)
    old_logprobs: list[torch.Tensor]  # (P_i + R_i,) shifted by one, as the engine returns them
    ref_logprobs: list[torch.Tensor]  # (P_i + R_i,)
    current_logprobs: list[torch.Tensor]  # (P_i + R_i,) the policy being trained
    current_entropy: list[torch.Tensor]  # (P_i + R_i,)
    rewards: list[float]
    uids: list[str]
    rollout_is_weights: list[torch.Tensor] | None = None  # (R_i,) or None

    def __len__(self) -> int:
        return len(self.prompt_ids)


def make_answers(
    seed: int, groups: int = 3, n: int = 2, max_prompt: int = 5, max_response: int = 6, **kw
) -> Answers:
    """``groups`` questions with ``n`` answers each, random lengths (one answer of full length).

    ``rollout_is_weights=True``: per-token weights in [0.5, 1.5). ``far_reference=True``: every
    third token's reference log-prob 4 nats above the policy's (verl's low_var_kl clamps there).
    """
    g = torch.Generator().manual_seed(seed)
    prompts, responses, old, ref, cur, ent, rewards, uids = ([] for _ in range(8))
    for q in range(groups):
        prompt = torch.randint(
            1, 50, (int(torch.randint(2, max_prompt + 1, (1,), generator=g)),), generator=g
        )
        for _ in range(n):
            r = (
                max_response
                if not responses
                else int(torch.randint(1, max_response + 1, (1,), generator=g))
            )
            responses.append(torch.randint(1, 50, (r,), generator=g))
            prompts.append(prompt.clone())
            total = len(prompt) + r
            base = -1.5 + 0.4 * torch.randn(total, generator=g)
            old.append(base)
            ref.append(base + 0.3 * torch.randn(total, generator=g))
            cur.append(base + 0.25 * torch.randn(total, generator=g))
            ent.append(1.0 + torch.rand(total, generator=g))
            rewards.append(float(torch.rand(1, generator=g)))
            uids.append(f"q{q}")
    if kw.get("far_reference"):
        for row in ref:
            row[::3] += 4.0
    weights = None
    if kw.get("rollout_is_weights"):
        weights = [0.5 + torch.rand(len(r), generator=g) for r in responses]
    return Answers(prompts, responses, old, ref, cur, ent, rewards, uids, weights)


def _grpo_advantages(response_mask: torch.Tensor, answers: Answers) -> torch.Tensor:
    """verl's GRPO estimator on outcome rewards at each answer's last token; ``(B, R)``."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_level_rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    lengths = response_mask.sum(-1)
    for i, reward in enumerate(answers.rewards):
        token_level_rewards[i, int(lengths[i]) - 1] = reward
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards, response_mask, np.array(answers.uids, dtype=object)
    )
    return advantages


def v1_actor_batch(answers: Answers, old_dtype: torch.dtype = torch.bfloat16):
    """The actor's batch as the V1 trainer stores it in TransferQueue (jagged nested fields)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    records = []
    for i in range(len(answers)):  # AgentLoopWorkerTQ._agent_loop_postprocess
        prompts, responses = answers.prompt_ids[i], answers.response_ids[i]
        input_ids = torch.cat([prompts, responses])
        records.append(
            {
                "prompts": prompts,
                "responses": responses,
                "response_mask": torch.ones(len(responses), dtype=torch.int64),
                "loss_mask": torch.ones(len(responses), dtype=torch.int64),
                "input_ids": input_ids,
                "position_ids": torch.arange(len(input_ids)),
                "row_id": torch.tensor(i),
            }
        )
    data = tu.list_of_dict_to_tensordict(records)
    offsets = data["input_ids"].offsets()

    def engine_output(per_answer: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return torch.nested.nested_tensor_from_jagged(torch.cat(per_answer).to(dtype), offsets)

    # _compute_old_log_prob / _compute_ref_log_prob
    data["old_log_probs"] = response_from_nested(
        engine_output(answers.old_logprobs, old_dtype), data["response_mask"]
    )
    data["ref_log_prob"] = response_from_nested(
        engine_output(answers.ref_logprobs, torch.float32), data["response_mask"]
    )
    # _compute_advantage: padded for the estimator, nested again for the update
    response_mask = data["response_mask"]
    padded = data.select("response_mask").to_padded_tensor()["response_mask"]
    data["advantages"] = response_to_nested(_grpo_advantages(padded, answers), response_mask)
    if answers.rollout_is_weights is not None:
        weights = torch.nn.utils.rnn.pad_sequence(answers.rollout_is_weights, batch_first=True)
        data["rollout_is_weights"] = response_to_nested(weights, response_mask)
    return data


def legacy_actor_batch(answers: Answers):
    """The actor's batch as ``RayPPOTrainer._update_actor`` hands it over (padded fields)."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_response_mask
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.torch_functional import pad_sequence_to_length
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    width_p = max(len(p) for p in answers.prompt_ids)
    width_r = max(len(r) for r in answers.response_ids)

    def pad(rows: list[torch.Tensor], width: int, left: bool) -> torch.Tensor:
        return torch.cat([pad_sequence_to_length(r[None], width, PAD, left_pad=left) for r in rows])

    prompts = pad(answers.prompt_ids, width_p, left=True)  # (B, P)
    responses = pad(answers.response_ids, width_r, left=False)  # (B, R)
    attention_mask = torch.cat(
        [
            pad([torch.ones_like(p) for p in answers.prompt_ids], width_p, left=True),
            pad([torch.ones_like(r) for r in answers.response_ids], width_r, left=False),
        ],
        dim=1,
    )
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
        "row_id": torch.arange(len(answers)),
    }
    batch = DataProto.from_single_dict(tensors)
    batch.batch["response_mask"] = compute_response_mask(batch)
    for key, per_answer in (
        ("old_log_probs", answers.old_logprobs),
        ("ref_log_prob", answers.ref_logprobs),
    ):  # the engine's packed output over the valid tokens, padded back per response
        batch.batch[key] = no_padding_2_padding(torch.cat(per_answer), batch.batch)
    batch.batch["advantages"] = _grpo_advantages(batch.batch["response_mask"], answers)
    if answers.rollout_is_weights is not None:
        batch.batch["rollout_is_weights"] = torch.nn.utils.rnn.pad_sequence(
            answers.rollout_is_weights, batch_first=True
        )
    return left_right_2_no_padding(batch.to_tensordict())  # RayPPOTrainer._update_actor


BUILDERS = {"v1": v1_actor_batch, "legacy": legacy_actor_batch}


def mini_batches(data, mini_batch_size: int, seed: int = 0, shuffle: bool = True) -> list:
    """``TrainingWorker.train_mini_batch``'s split (``tensordict_utils.make_iterator``)."""
    from verl.utils import tensordict_utils as tu

    return list(
        tu.make_iterator(
            data, mini_batch_size, epochs=1, seed=seed, dataloader_kwargs={"shuffle": shuffle}
        )
    )


def engine_info(
    data, *, dp_size: int = 1, batch_num_tokens: int | None = None, global_batch_size=None
):
    """The non-tensor entries the engine adds before micro-batching (``forward_backward_batch``)."""
    from verl.utils import tensordict_utils as tu

    if batch_num_tokens is None:
        batch_num_tokens = int(data["loss_mask"].sum())
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=len(data) * dp_size if global_batch_size is None else global_batch_size,
    )
    return data


def micro_batches(data, max_token_len: int | None = None, micro_batch_size: int = 2) -> list:
    """The engine's split (``prepare_micro_batches``); with ``max_token_len`` dynamic batch
    sizes regroup (and reorder) rows by length."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    if max_token_len is None:
        tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch_size)
    else:
        tu.assign_non_tensor(data, use_dynamic_bsz=True, max_token_len_per_gpu=max_token_len)
    micro, _ = prepare_micro_batches(data, dp_group=None, same_micro_num_in_dp=True)
    return micro


def model_output(answers: Answers, data, key: str = "current_logprobs", leaf=None):
    """The engine's output for the rows of ``data``: nested over prompt + response per row.

    ``leaf``: a flat tensor over all answers' tokens (in answer order) to take the values from
    (e.g. one with ``requires_grad``), else ``answers.<key>``.
    """
    per_answer = getattr(answers, key)
    if leaf is None:
        leaf = torch.cat(per_answer)
    lengths = torch.tensor([len(t) for t in per_answer])
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    rows = [int(i) for i in data["row_id"]]
    values = torch.cat([leaf[starts[i] : starts[i + 1]] for i in rows])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[rows].cumsum(0)])
    return torch.nested.nested_tensor_from_jagged(values, offsets)


# --------------------------------------------------------------------------------------------
# helpers shared by the verl tests: an actor config, a mini-batch, the loss over micro-batches


def actor_config(**overrides):
    """verl's ``ActorConfig`` for the tests (clip 0.2 / 0.28, k3 KL 0.05, token-mean, vanilla);
    ``policy_loss`` may be a dict, its ``rollout_correction`` a dict too."""
    from verl.trainer.config import RolloutCorrectionConfig
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    policy = dict(overrides.pop("policy_loss", {}) or {})
    if isinstance(policy.get("rollout_correction"), dict):
        policy["rollout_correction"] = RolloutCorrectionConfig(**policy["rollout_correction"])
    kwargs = dict(
        strategy="fsdp",
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode="token-mean",
        use_kl_loss=True,
        kl_loss_coef=0.05,
        kl_loss_type="low_var_kl",
        entropy_coeff=0.0,
        policy_loss=PolicyLossConfig(**policy),
    )
    kwargs.update(overrides)
    return ActorConfig(**kwargs)


def mini_batch(layout: str, seed: int, old_dtype: torch.dtype = torch.bfloat16, **answer_kw):
    """``(answers, mini-batch)``: all answers in one actor mini-batch, shuffled by verl's
    iterator, with the engine's info (``engine_info``). ``old_dtype``: the V1 layout's dtype of
    ``old_log_probs`` (bf16 as V1 often stores them; the legacy layout's are float32)."""
    answers = make_answers(seed, **answer_kw)
    data = v1_actor_batch(answers, old_dtype) if layout == "v1" else legacy_actor_batch(answers)
    (mini,) = mini_batches(data, len(answers), seed=seed)
    return answers, engine_info(mini)


def leaves(answers: Answers, requires_grad: bool = True):
    """Flat leaves of the current log-probs and entropies over all answers' tokens."""
    logprobs = torch.cat(answers.current_logprobs).clone().requires_grad_(requires_grad)
    entropy = torch.cat(answers.current_entropy).clone().requires_grad_(requires_grad)
    return logprobs, entropy


def current_padded(answers: Answers, mini, key: str = "current_logprobs") -> torch.Tensor:
    """``(B, R)`` current log-probs (or ``key``) of the mini-batch's rows, padded like verl."""
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(model_output(answers, mini, key), mini)


def select(mini, answers: Answers, settings, config):
    """The plugin's ``prepare_selection`` with the statistics the engine's extra pass returns."""
    from gmts.integrations.verl.loss import objective_from_actor_config, prepare_selection

    objective = objective_from_actor_config(config) if settings.selection.enabled else None
    return prepare_selection(
        mini,
        settings,
        objective,
        actor_config=config,
        logprobs=current_padded(answers, mini),
        entropy=current_padded(answers, mini, "current_entropy"),
    )


def loss_over_micro_batches(
    loss_fn, mini, answers: Answers, flat_leaves, with_entropy: bool = False,
    max_token_len: int | None = None, micro_batch_size: int = 2, seed: int | None = None,
):  # fmt: skip
    """Sum of ``loss_fn(model_output, micro)`` over verl's micro-batches (dynamic sizes
    regroup and reorder rows), back-propagated into ``flat_leaves``: ``(loss, grads,
    last metrics)``. ``seed``: the global RNG seed set first (clip_cov draws from it)."""
    for leaf in flat_leaves:
        leaf.grad = None
    if seed is not None:
        torch.manual_seed(seed)
    total = torch.zeros(())
    metrics = {}
    for micro in micro_batches(mini, max_token_len, micro_batch_size):
        output = {"log_probs": model_output(answers, micro, leaf=flat_leaves[0])}
        if with_entropy:
            output["entropy"] = model_output(answers, micro, "current_entropy", flat_leaves[1])
        loss, metrics = loss_fn(output, micro)
        loss.backward()
        total = total + loss.detach()
    grads = [leaf.grad.clone() for leaf in flat_leaves[: 2 if with_entropy else 1]]
    return total, grads, metrics


def flat_to_padded(answers: Answers, mini, flat: torch.Tensor) -> torch.Tensor:
    """A flat per-token tensor over all answers (e.g. a leaf's gradient) as ``(B, R)`` of the
    mini-batch's rows (the engine's shift by one, as ``no_padding_2_padding`` does)."""
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(model_output(answers, mini, leaf=flat), mini)


def padded_to_flat(answers: Answers, mini):
    """``(B, R) -> flat``: a differentiable map from padded current log-probs of the
    mini-batch's rows back into the engine's flat layout (prompt positions keep the answers'
    current log-probs), for ``gmts.loss_omega`` of a verl loss."""
    base = torch.cat(answers.current_logprobs)
    index = flat_to_padded(answers, mini, torch.arange(len(base), dtype=torch.float64)).long()
    mask = padded_response_mask(mini)

    def to_flat(padded: torch.Tensor) -> torch.Tensor:
        return base.detach().clone().index_put((index[mask],), padded[mask])

    return to_flat


def padded_response_mask(data) -> torch.Tensor:
    """``(B, R)`` bool response mask of ``data`` (padded like verl's ``ppo_loss``)."""
    return data.select("response_mask").to_padded_tensor()["response_mask"].bool()
