"""The verl column of the objective rows of the conformance matrix (tests/conformance/_objectives.py).

``verl_cell(row)``: the verl plugin's loss (``GMTSPolicyLoss``, the class verl's workers run)
with the actor config ``row.verl`` (verl 0.9.1's own spelling of the objective: its
``policy_loss.loss_mode``, clip ratios, ``kl_loss_type``) and the paper preset, on an actor
mini-batch of verl's default (V1) trainer built with verl's own functions
(tests/integrations/verl_batches.py), exactly as the preset rows' verl engine does
(``_matrix.verl``): advantages from verl's GRPO estimator on ``REWARDS`` (``GROUP_SIZE``
answers per question), rows not shuffled, micro-batches of 2 rows, the engine's output (the
log-probs over prompt + response per answer) taken from one flat leaf, the gradient read back
per response token. ``old_log_probs`` are bf16, as V1 stores them (the batch's values are
bf16-exact); verl's dppo_* evaluate pi_old = exp(old_log_probs) in bf16 for their trust
regions, which flips no token's membership on this batch
(tests/integrations/test_verl_loss_modes.py pins down where it does).

Not a test module: loaded by tests/conformance/test_conformance_verl.py through _objectives.py.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

objectives = sys.modules["_objectives"]  # loaded first by _objectives._engine_cell
matrix = objectives.matrix
Cell = objectives.Cell
B, T, DTYPE = objectives.B, objectives.T, objectives.DTYPE


def _actor_config(overrides: dict[str, Any]) -> Any:
    """verl's ActorConfig with the row's overrides (``policy_loss``: PolicyLossConfig fields)."""
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    values = dict(overrides)
    policy = PolicyLossConfig(**values.pop("policy_loss", {}))
    return ActorConfig(
        strategy="fsdp",
        rollout_n=objectives.GROUP_SIZE,
        ppo_micro_batch_size_per_gpu=2,
        entropy_coeff=0.0,
        policy_loss=policy,
        **values,
    )


def _per_answer(values: torch.Tensor, fill: float) -> list[torch.Tensor]:
    """Engine layout: position P - 1 + t of answer i holds response token t's value."""
    out = []
    for i, (p, n) in enumerate(zip(matrix._VERL_PROMPTS, matrix.LENGTHS)):
        row = torch.full((p + n,), fill, dtype=torch.float32)
        row[p - 1 : p - 1 + n] = values[i, :n].float()
        out.append(row)
    return out


def verl_cell(row: Any) -> Any:
    """The row's loss and gradient through the verl plugin, or its refusal."""
    from verl.workers.utils.padding import no_padding_2_padding

    from gmts.integrations.verl.loss import GMTSPolicyLoss, prepare_selection
    from gmts.integrations.verl.settings import GMTSVerlSettings

    vb = matrix._verl_batches()
    try:
        config = _actor_config(row.verl)
        loss_fn = GMTSPolicyLoss(config, GMTSVerlSettings(selection=objectives.selection()))
    except ValueError as err:
        return Cell(refused=matrix._first_problem(err))

    batch = objectives.objective_batch()
    answers = vb.Answers(
        prompt_ids=[torch.arange(5, 5 + p) for p in matrix._VERL_PROMPTS],
        response_ids=[torch.arange(1, n + 1) for n in matrix.LENGTHS],
        old_logprobs=_per_answer(batch.old_logprobs, -1.0),
        ref_logprobs=_per_answer(batch.ref_logprobs, -1.0),
        current_logprobs=_per_answer(batch.logprobs, -1.0),
        current_entropy=_per_answer(batch.entropy, 1.0),
        rewards=list(objectives.REWARDS),
        uids=[f"q{i // objectives.GROUP_SIZE}" for i in range(B)],
    )
    data = vb.v1_actor_batch(answers)
    (mini,) = vb.mini_batches(data, B, shuffle=False)
    mini = vb.engine_info(mini)
    prepare_selection(
        mini,
        loss_fn.settings,
        loss_fn.objective,
        actor_config=config,
        logprobs=no_padding_2_padding(vb.model_output(answers, mini), mini),
        entropy=no_padding_2_padding(vb.model_output(answers, mini, "current_entropy"), mini),
    )
    leaf = torch.cat(answers.current_logprobs).requires_grad_(True)
    total = torch.zeros(())
    for micro in vb.micro_batches(mini, micro_batch_size=2):
        loss, _ = loss_fn({"log_probs": vb.model_output(answers, micro, leaf=leaf)}, micro)
        loss.backward()
        total = total + loss.detach()
    grad = torch.zeros(B, T, dtype=DTYPE)
    start = 0
    for i, (p, n) in enumerate(zip(matrix._VERL_PROMPTS, matrix.LENGTHS)):
        grad[i, :n] = leaf.grad[start + p - 1 : start + p - 1 + n].to(DTYPE)
        start += p + n
    return Cell(float(total), grad)
