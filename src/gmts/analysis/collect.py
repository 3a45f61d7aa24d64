"""Sample answers and measure every response token: the data behind the paper's Figures 2-3.

:func:`analyze_rollout` runs each sampled sequence once through the model and reads off, per
response token: the entropy E, the probability p (and eps = 1 - p), the exact logit-gradient
norm G (Proposition 3.1), omega, the ETS / GMTS / logit-grad scores, and the TRUE gradient norms
over all parameters, ``||grad log pi(o_t)||`` and ``||grad l_t|| = |omega_t| * ||grad log pi(o_t)||``
(see :mod:`gmts.analysis.gradnorms` for why that identity is exact).

omega is taken on-policy, as at the first update after sampling: old = current log-probs, so
r = 1 and nothing is clipped; the advantage is the group-normalised reward (GRPO/DAPO), and
without a KL term omega_t = A_i for every token of answer i.
"""

from __future__ import annotations

import random
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from gmts._progress import Progress, count_forwards
from gmts.analysis.gradnorms import (
    DEFAULT_MAX_CHUNK_BYTES,
    iter_row_gradient_norms,
    trainable_parameters,
)
from gmts.core import (
    ObjectiveConfig,
    ScoreInputs,
    compute_scores,
    gradient_coefficient,
    group_advantages,
    token_statistics,
)

__all__ = ["PROXY_SCORES", "TokenAnalysis", "analyze_rollout", "sample_and_analyze"]

PROXY_SCORES = ("entropy", "gmts", "logit-grad")
"""Registered scores compared with the oracle: ETS, GMTS and the exact logit-gradient score."""


@dataclass
class TokenAnalysis:
    """Per-token measurements of B = Q * G sampled answers (rows of a group contiguous).

    Every per-token tensor is ``(B, T)`` float32 on the CPU, aligned with ``response_mask`` and 0
    where it is False.

    Attributes:
        response_ids: ``(B, T)`` long sampled tokens.
        response_mask: ``(B, T)`` bool, True on response tokens (EOS included).
        group_ids: ``(B,)`` long question index 0..Q-1.
        rewards, advantages: ``(B,)`` float32 (group-normalised rewards).
        logprob: log pi(o_t); prob: p = pi(o_t); eps: 1 - p (computed as -expm1(log p)).
        entropy: E_t; logit_grad_norm: G_t = ||d log pi(o_t) / d z_t||.
        omega: the gradient coefficient d l_t / d log pi(o_t) (on-policy: A_i).
        grad_logprob_norm: ``||grad_theta log pi(o_t)||_2`` over all trainable parameters.
        grad_objective_norm: ``||grad_theta l_t||_2 = |omega_t| * grad_logprob_norm``.
        scores: name -> ``(B, T)`` score: "entropy" (ETS), "gmts", "logit-grad", and "oracle"
            (= grad_objective_norm).
        token_text: per row, the decoded text of each response token.
        prompts, completions, answers: B strings each.
        num_samples: G.
        timings: seconds spent sampling and measuring.
        meta: model / task / settings, for the report.
    """

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    logprob: torch.Tensor
    prob: torch.Tensor
    eps: torch.Tensor
    entropy: torch.Tensor
    logit_grad_norm: torch.Tensor
    omega: torch.Tensor
    grad_logprob_norm: torch.Tensor
    grad_objective_norm: torch.Tensor
    scores: dict[str, torch.Tensor]
    token_text: list[list[str]]
    prompts: list[str]
    completions: list[str]
    answers: list[str]
    num_samples: int
    timings: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.response_mask.shape[0]

    @property
    def num_groups(self) -> int:
        return int(self.group_ids.max()) + 1 if self.num_rows else 0


def _token_texts(tokenizer: Any, response_ids: torch.Tensor, lengths: list[int]) -> list[list[str]]:
    texts = []
    for row, n in zip(response_ids.tolist(), lengths):
        texts.append([tokenizer.decode([tok], skip_special_tokens=False) for tok in row[:n]])
    return texts


def _checked_advantages(
    rollout: Any, rewards: torch.Tensor, std_normalize: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(``rewards`` as a float32 ``(B,)`` CPU tensor, their group advantages ``(B,)``, G),
    after checking that there is one reward per row and that G divides the rows."""
    B, T = rollout.response_mask.shape
    rewards = torch.as_tensor(rewards, dtype=torch.float32).reshape(-1).cpu()
    if rewards.numel() != B:
        raise ValueError(f"rewards: expected {B} values (one per row), got {rewards.numel()}")
    G = int(rollout.num_samples)
    if G < 1 or B % G != 0:
        raise ValueError(f"rollout.num_samples: {G} does not divide the {B} rows")
    advantages = group_advantages(rewards, G, std_normalize=std_normalize).float()  # (B,)
    return rewards, advantages, G


def _token_scores(
    objective: ObjectiveConfig, measured: Any, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(omega ``(B, T)``, name -> ``(B, T)`` score: every proxy score and "oracle", the true
    ``|omega| * ||grad log pi||``) from the measured tokens; ``mask``: ``(B, T)`` bool."""
    logprob = measured.logprob
    # on-policy: old = current log-probs, so r = 1 and omega = A (no KL term)
    omega = gradient_coefficient(objective, logprob, logprob, advantages, mask)  # (B, T)
    inputs = ScoreInputs(
        entropy=measured.entropy, omega=omega, logit_grad_norm=measured.logit_grad, mask=mask
    )
    scores = {name: compute_scores(name, inputs).masked_fill(~mask, 0.0) for name in PROXY_SCORES}
    # exact: l_t depends on theta via log pi only
    scores["oracle"] = omega.abs() * measured.grad_logprob  # (B, T)
    return omega, scores


def analyze_rollout(
    model: torch.nn.Module,
    tokenizer: Any,
    rollout: Any,
    rewards: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    std_normalize: bool = True,
    method: str = "auto",
    progress: bool = False,
) -> TokenAnalysis:
    """Measure every response token of ``rollout`` (a :class:`gmts.sampling.rollout.Rollout`).

    Args:
        model: the policy that sampled the rollout (eval mode is set here and restored).
        tokenizer: decodes single tokens for the HTML view.
        rollout: B = Q * G rows, ``num_samples`` = G, groups contiguous.
        rewards: ``(B,)`` rewards of the rows.
        temperature: the sampling temperature (log pi is taken at it, as in training).
        chunk_size / max_chunk_bytes: see :func:`gmts.analysis.gradnorms.batched_grad_norms`.
        clip_low / clip_high: the clip range passed to omega (inactive on-policy, r = 1).
        std_normalize: GRPO advantages (True) or mean-centred ones (False).
        method: how the true norms are computed: "auto" (batched VJPs, falling back to the
            per-token loop if the model's backward cannot be vmapped), "batched" or "loop".
        progress: show the answers measured on stderr (:mod:`gmts._progress`).

    Returns:
        A :class:`TokenAnalysis` on the CPU.
    """
    rewards, advantages, G = _checked_advantages(rollout, rewards, std_normalize)
    params = trainable_parameters(model)
    measured = _measure_tokens(
        model,
        rollout,
        params,
        temperature=temperature,
        method=method,
        chunk_size=chunk_size,
        max_chunk_bytes=max_chunk_bytes,
        progress=progress,
    )
    logprob = measured.logprob
    mask = rollout.response_mask.bool().cpu()
    objective = ObjectiveConfig(clip_low=clip_low, clip_high=clip_high)
    omega, scores = _token_scores(objective, measured, advantages, mask)
    lengths = mask.sum(dim=1).tolist()
    return TokenAnalysis(
        response_ids=rollout.response_ids.cpu(),
        response_mask=mask,
        group_ids=rollout.group_ids.cpu().long(),
        rewards=rewards,
        advantages=advantages,
        logprob=logprob,
        prob=logprob.exp().masked_fill(~mask, 0.0),
        eps=(-torch.expm1(logprob)).masked_fill(~mask, 0.0),
        entropy=measured.entropy,
        logit_grad_norm=measured.logit_grad,
        omega=omega,
        grad_logprob_norm=measured.grad_logprob,
        grad_objective_norm=scores["oracle"],
        scores=scores,
        token_text=_token_texts(tokenizer, rollout.response_ids.cpu(), lengths),
        prompts=list(rollout.prompts),
        completions=list(rollout.completions),
        answers=list(rollout.answers),
        num_samples=G,
        timings={"measure_seconds": measured.seconds},
        meta={
            "temperature": temperature,
            "num_parameters": sum(p.numel() for p in params),
            "omega": "on-policy (r = 1), no KL: omega = group-normalised advantage",
            "std_normalize": std_normalize,
            "gradient_method": measured.methods,
            "warnings": measured.warnings,
        },
    )


@dataclass(frozen=True)
class _Measured:
    """Every response token's statistics and true gradient norm, ``(B, T)`` each (0 off the
    response), with how they were computed."""

    logprob: torch.Tensor
    entropy: torch.Tensor
    logit_grad: torch.Tensor
    grad_logprob: torch.Tensor
    methods: list[str]
    seconds: float
    warnings: list[str]


def _measure_tokens(
    model: torch.nn.Module,
    rollout: Any,
    params: list[torch.nn.Parameter],
    *,
    temperature: float,
    method: str,
    chunk_size: int | None,
    max_chunk_bytes: int,
    progress: bool = False,
) -> _Measured:
    """Run the model over the rollout once per row, in eval mode (dropout off: the measured
    gradients are those of the sampling policy; the mode is restored)."""
    B, T = rollout.response_mask.shape
    logprob, entropy = torch.zeros(B, T), torch.zeros(B, T)
    logit_grad, grad_logprob = torch.zeros(B, T), torch.zeros(B, T)
    was_training = model.training
    model.eval()
    methods_used: set[str] = set()
    start = time.perf_counter()
    shown = Progress(f"gradient norms ({B} answers)", B, "answers", enabled=progress)
    # vmap warns when an op of the backward has no batching rule (it then loops internally:
    # still exact, slower); such messages are kept for the report and re-emitted once each
    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        try:
            rows = iter_row_gradient_norms(
                model,
                rollout.input_ids,
                rollout.attention_mask,
                rollout.response_mask.bool(),
                params,
                temperature=temperature,
                method=method,
                chunk_size=chunk_size,
                max_chunk_bytes=max_chunk_bytes,
            )
            for b, logits, labels, norms, used in rows:  # (n, V), (n,), (n,)
                n = labels.numel()
                methods_used.add(used)
                stats = token_statistics(logits, labels, logit_grad_norm=True)
                logprob[b, :n] = stats.logprobs.detach().cpu()
                entropy[b, :n] = stats.entropy.cpu()
                logit_grad[b, :n] = stats.logit_grad_norm.cpu()
                grad_logprob[b, :n] = norms.cpu()
                shown.update()
        finally:
            model.train(was_training)
            shown.close()
    seconds = time.perf_counter() - start
    messages = sorted({str(w.message).splitlines()[0][:300] for w in recorded})
    for message in messages:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    return _Measured(
        logprob, entropy, logit_grad, grad_logprob, sorted(methods_used), seconds, messages
    )


def sample_and_analyze(
    model: torch.nn.Module,
    tokenizer: Any,
    task: Any,
    *,
    questions: int,
    samples: int,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    chunk_size: int | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    method: str = "auto",
    progress: bool = False,
) -> TokenAnalysis:
    """Sample ``samples`` answers for each of ``questions`` problems of ``task``, then measure.

    Args:
        task: a :class:`gmts.embedded.tasks.Task` (``sample``, ``reward``, ``max_new_tokens``).
        questions: K >= 1; samples: G >= 2 (a group needs two answers for an advantage).
        seed: draws the problems and seeds the sampler.
        max_new_tokens: generation budget (default: the task's).
        progress: show the sampling and the measuring on stderr (:mod:`gmts._progress`).
    """
    if questions < 1:
        raise ValueError(f"questions: must be >= 1, got {questions}")
    if samples < 2:
        raise ValueError(f"samples: must be >= 2 (group-normalised advantages), got {samples}")
    from gmts.sampling.rollout import generate_rollouts

    problems = task.sample(questions, random.Random(seed))
    start = time.perf_counter()
    budget = max_new_tokens or task.max_new_tokens
    what = f"sampling ({len(problems)} questions x {samples} answers)"
    shown = Progress(what, budget, "tokens", enabled=progress)
    with shown, count_forwards(model, shown.update):  # one forward per sampled token
        rollout = generate_rollouts(
            model,
            tokenizer,
            problems,
            num_samples=samples,
            max_new_tokens=budget,
            temperature=temperature,
            seed=seed,
        )
    sample_seconds = time.perf_counter() - start
    rewards = torch.tensor(
        [task.reward(c, a) for c, a in zip(rollout.completions, rollout.answers)]
    )
    analysis = analyze_rollout(
        model,
        tokenizer,
        rollout,
        rewards,
        temperature=temperature,
        chunk_size=chunk_size,
        max_chunk_bytes=max_chunk_bytes,
        method=method,
        progress=progress,
    )
    analysis.timings["sample_seconds"] = sample_seconds
    analysis.meta.update(
        task=getattr(task, "name", str(task)), seed=seed, questions=questions, samples=samples
    )
    return analysis
