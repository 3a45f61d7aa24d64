"""How the KV-cached sampler draws a token from a row's probabilities: :data:`DRAWS`.

Each draw takes ``(a, V)`` probabilities (rows summing to 1, float32) of ``a`` rows of a batch
of ``b``, the indices of those rows, and a ``torch.Generator``, and returns ``(a,)`` token ids
distributed as the rows say. A draw consumes the random numbers of the whole batch of ``b``
rows and uses the given rows' part, so a row's token does not depend on which other rows are
still generating: the sampler drops finished rows from its batch (:mod:`gmts.sampling.rollout`)
and keeps the stream it had with every row present. The draws differ in the random numbers they
consume, so the same seed gives other tokens under another draw:

- ``multinomial`` (the default): the tokens of ``torch.multinomial(probs, 1)``, the stream
  every committed record of this project was sampled with, and ``transformers``' ``generate``'s.
  For one sample per row ``torch.multinomial`` fills a ``(b, V)`` tensor with exponential
  numbers ``q`` (``empty_like(probs).exponential_(1, generator)``) and keeps the largest
  ``p / q`` of each row (ATen's ``multinomial_out``, the same on CPU and CUDA); the draw does
  exactly that for the ``b`` rows and takes the argmax of its ``a`` rows (the tests compare it
  with ``torch.multinomial`` over seeds and shapes). On a 49,152-entry vocabulary with 32 rows it
  took 44 ms a step on this project's 2-core machine, single-threaded: 16% of a SmolLM2-135M
  decoding step; it stays b x V numbers a step however many rows are still generating.
- ``inverse_cdf``: one uniform number per row (``b`` a step), placed in the row's cumulative
  distribution (float64 running sums, so rounding moves at most about 1e-16 of probability
  between neighbouring tokens); about 1 ms for the same step. Tokens of probability 0 are never
  drawn.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gmts._registry import Registry

__all__ = ["DRAWS", "Draw", "draw_inverse_cdf", "draw_multinomial"]

Draw = Callable[[torch.Tensor, torch.Generator, torch.Tensor, int], torch.Tensor]
"""``(probs (a, V) float32, generator, rows (a,) long, batch b) -> tokens (a,) long``: ``probs``
are the rows ``rows`` (increasing, distinct) of a batch of ``b`` rows."""

DRAWS: Registry[Draw] = Registry("sampling draw")


@DRAWS.decorator("multinomial")
def draw_multinomial(
    probs: torch.Tensor, generator: torch.Generator, rows: torch.Tensor, batch: int
) -> torch.Tensor:
    """(a, V) -> (a,): rows ``rows`` of ``torch.multinomial(all_probs, 1)`` for a ``(batch, V)``
    ``all_probs`` holding ``probs`` in those rows (the other rows do not change the tokens)."""
    _check_probabilities(probs)
    race = torch.empty((batch, probs.shape[1]), dtype=probs.dtype, device=probs.device)
    race.exponential_(1, generator=generator)  # (b, V): torch.multinomial's q
    if rows.shape[0] != batch:
        race = race[rows]  # (a, V)
    return torch.div(probs, race, out=race).argmax(dim=-1)


def _check_probabilities(probs: torch.Tensor) -> None:
    """The checks ``torch.multinomial`` makes, with its messages."""
    if not bool((probs.max() < torch.inf) & (probs.min() >= 0)):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((probs.sum(dim=-1) == 0).any()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


@DRAWS.decorator("inverse_cdf")
def draw_inverse_cdf(
    probs: torch.Tensor, generator: torch.Generator, rows: torch.Tensor, batch: int
) -> torch.Tensor:
    """(a, V) -> (a,): the first token whose float64 cumulative probability exceeds
    ``u * total`` for one uniform ``u`` in [0, 1) per row (drawn for the ``batch`` rows)."""
    cdf = probs.to(torch.float64).cumsum_(dim=-1)  # (a, V)
    u = torch.rand((batch, 1), dtype=torch.float64, generator=generator, device=probs.device)
    if rows.shape[0] != batch:
        u = u[rows]  # (a, 1)
    target = u * cdf[:, -1:]  # (a, 1), strictly below the row's total
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)
