"""What the grouped forward computes for a batch of rows: distinct prompts, length buckets and
the positions counted in every step's record.

Rows of one question share their prompt (the same tokens, left-padded the same way). The
grouped layout (:mod:`gmts.train.grouped_forward`) runs each DISTINCT prompt once and the
responses in buckets of similar length; this module decides the buckets, from the masks alone,
and counts what they cost:

- **prompt buckets**: the distinct prompts sorted by length, longest first, cut so that each
  bucket's padded area (prompts x its longest) is at most 10% over its real tokens;
- **response buckets**: the rows with at least two response tokens, by the number of tokens
  the response pass feeds (``length - 1``: the prompt's last position predicts token 0, the
  last token predicts nothing), cut by the same rule.

The rule, greedy over lengths sorted descending: a bucket takes the next length ``l`` while
``(rows + 1) x first <= 1.1 x (real + l)``. Every bucket then satisfies
``rows x first <= 1.1 x real`` (a single row does), so the positions computed are at most 10%
over the real ones, per bucket and in total.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gmts.sampling.sequences import distinct_prompts

__all__ = ["ForwardPlan", "Positions", "length_buckets", "padded_positions", "plan_forward"]

_SLACK_NUM, _SLACK_DEN = 11, 10
"""A bucket's padded area may be 11/10 of its real tokens (integer arithmetic: exact)."""


@dataclass(frozen=True)
class Positions:
    """Positions of one or more model forwards.

    Attributes:
        computed: positions the model ran (every query position of every call, padding
            included).
        real: the unique real tokens: each distinct prompt's tokens once, plus every row's
            response tokens.
    """

    computed: int
    real: int

    def __add__(self, other: Positions) -> Positions:
        return Positions(self.computed + other.computed, self.real + other.real)


def length_buckets(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of ``lengths`` (each >= 1) in buckets, longest first (ties by index).

    Each bucket is a run of the descending order whose padded area ``len(bucket) x
    lengths[bucket[0]]`` is at most 1.1 x ``sum(lengths[bucket])`` (see the module docstring).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    buckets: list[list[int]] = []
    real = 0
    for i in order:
        if lengths[i] < 1:
            raise ValueError(f"bucket lengths must be >= 1, got {lengths[i]}")
        if buckets:
            bucket = buckets[-1]
            padded = (len(bucket) + 1) * lengths[bucket[0]]
            if _SLACK_DEN * padded <= _SLACK_NUM * (real + lengths[i]):
                bucket.append(i)
                real += lengths[i]
                continue
        buckets.append([i])
        real = lengths[i]
    return buckets


def _bucket_area(buckets: Sequence[Sequence[int]], lengths: Sequence[int]) -> int:
    """Padded positions of ``buckets`` (each sorted longest first)."""
    return sum(len(b) * lengths[b[0]] for b in buckets)


def padded_positions(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor
) -> Positions:
    """The positions of the padded layout: every row runs its whole prompt and response,
    ``B x (P + T)``; real as in :attr:`ForwardPlan.positions`."""
    _, prompt_rows = distinct_prompts(prompt_ids, prompt_mask)
    real = int(prompt_mask[prompt_rows].sum()) + int(response_mask.sum())
    B, P = prompt_ids.shape
    return Positions(computed=B * (P + response_mask.shape[1]), real=real)


@dataclass(frozen=True)
class ForwardPlan:
    """The calls of one grouped forward.

    Attributes:
        row_prompt: ``(B,)`` long, each row's distinct prompt (an index into ``prompt_rows``).
        prompt_rows: ``(u,)`` long, a row holding each distinct prompt.
        prompt_lengths: the ``u`` distinct prompts' real token counts.
        response_lengths: the ``B`` rows' response token counts (EOS included).
        prompt_buckets: distinct prompt indices per prompt call, longest first.
        response_buckets: row indices per response call, longest first; only rows with at
            least 2 response tokens (token 0 comes from the prompt call).
    """

    row_prompt: torch.Tensor
    prompt_rows: torch.Tensor
    prompt_lengths: tuple[int, ...]
    response_lengths: tuple[int, ...]
    prompt_buckets: tuple[tuple[int, ...], ...]
    response_buckets: tuple[tuple[int, ...], ...]

    @property
    def calls(self) -> int:
        """Model calls: one per bucket."""
        return len(self.prompt_buckets) + len(self.response_buckets)

    @property
    def fed_lengths(self) -> tuple[int, ...]:
        """Per row, the response tokens the response calls feed: ``length - 1``."""
        return tuple(max(n - 1, 0) for n in self.response_lengths)

    @property
    def positions(self) -> Positions:
        """Computed: every bucket's rows x its longest; real: the distinct prompts' tokens plus
        the response tokens."""
        computed = _bucket_area(self.prompt_buckets, self.prompt_lengths) + _bucket_area(
            self.response_buckets, self.fed_lengths
        )
        return Positions(computed, sum(self.prompt_lengths) + sum(self.response_lengths))

    def split(self, calls: int) -> ForwardPlan:
        """This plan in (up to) ``calls`` calls, by moving the shortest row of the fullest
        bucket into a call of its own, response buckets first. Removing a bucket's shortest
        row keeps its 10% bound and computes no more positions (only less padding). (Under
        FSDP every rank must make the same number of calls: :mod:`gmts.train.grouped_forward`.)
        """
        response = [list(b) for b in self.response_buckets]
        prompt = [list(b) for b in self.prompt_buckets]
        missing = calls - self.calls
        for buckets in (response, prompt):
            while missing > 0 and any(len(b) > 1 for b in buckets):
                fullest = max(range(len(buckets)), key=lambda i: len(buckets[i]))
                buckets.append([buckets[fullest].pop()])
                missing -= 1
        return ForwardPlan(
            row_prompt=self.row_prompt,
            prompt_rows=self.prompt_rows,
            prompt_lengths=self.prompt_lengths,
            response_lengths=self.response_lengths,
            prompt_buckets=tuple(tuple(b) for b in prompt),
            response_buckets=tuple(tuple(b) for b in response),
        )


def plan_forward(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor
) -> ForwardPlan:
    """The grouped forward's plan for rows of ``(B, P)`` left-padded prompts and ``(B, T)``
    right-padded responses.

    Raises:
        ValueError: a prompt mask that is not left padding (ones after zeros), a response mask
            that is not right padding, or a row without prompt tokens.
    """
    B, P = prompt_mask.shape
    T = response_mask.shape[1]
    prompt_lengths = prompt_mask.long().sum(dim=1)  # (B,)
    response_lengths = response_mask.long().sum(dim=1)  # (B,)
    columns = torch.arange(max(P, T), device=prompt_mask.device)
    if not torch.equal(prompt_mask.bool(), columns[:P] >= P - prompt_lengths[:, None]):
        raise ValueError("grouped forward: prompt_mask must be left padding (zeros, then ones)")
    if not torch.equal(response_mask.bool(), columns[:T] < response_lengths[:, None]):
        raise ValueError("grouped forward: response_mask must be right padding (ones, then zeros)")
    if B and int(prompt_lengths.min()) < 1:
        raise ValueError("grouped forward: every row needs at least one prompt token")
    row_prompt, prompt_rows = distinct_prompts(prompt_ids, prompt_mask)
    distinct_lengths = prompt_lengths[prompt_rows].tolist()
    lengths = response_lengths.tolist()
    fed = [max(n - 1, 0) for n in lengths]
    responding = [i for i in range(B) if fed[i] > 0]
    response_buckets = [
        [responding[j] for j in b] for b in length_buckets([fed[i] for i in responding])
    ]
    return ForwardPlan(
        row_prompt=row_prompt,
        prompt_rows=prompt_rows,
        prompt_lengths=tuple(distinct_lengths),
        response_lengths=tuple(lengths),
        prompt_buckets=tuple(tuple(b) for b in length_buckets(distinct_lengths)),
        response_buckets=tuple(tuple(b) for b in response_buckets),
    )
