"""Random grouped prompt + response rows for the forward-layout tests (not a test module).

Rows are laid out as the sampler lays them out: the rows of a group are consecutive and share
one prompt, left-padded with the pad id; responses are right-padded with it; a response shorter
than the budget ends with EOS (inside its mask); pad id = EOS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gmts.sampling.sequences import PromptResponse


@dataclass(frozen=True)
class Rows(PromptResponse):
    """``(B, P)`` prompts and ``(B, T)`` responses (PromptResponse's four tensors)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.response_ids.shape[0]

    def rows(self, index: slice | torch.Tensor) -> Rows:
        return Rows(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))


def grouped_rows(
    *,
    seed: int,
    vocab: int,
    eos: int,
    prompt_lengths: Sequence[int],
    response_lengths: Sequence[Sequence[int]],
    width: int | None = None,
    budget: int | None = None,
) -> Rows:
    """Group ``g`` has one random prompt of ``prompt_lengths[g]`` tokens and one row per entry
    of ``response_lengths[g]`` (that many response tokens, EOS included when under the budget).

    ``width`` / ``budget``: the prompt and response widths ``P`` / ``T`` (default: the
    longest)."""
    g = torch.Generator().manual_seed(seed)
    P = width or max(prompt_lengths)
    T = budget or max(max(r) for r in response_lengths)
    rows: list[tuple[torch.Tensor, ...]] = []
    for plen, lengths in zip(prompt_lengths, response_lengths):
        prompt = torch.full((P,), eos)
        prompt[P - plen :] = torch.randint(0, vocab, (plen,), generator=g)
        for n in lengths:
            response = torch.full((T,), eos)
            response[:n] = torch.randint(0, vocab, (n,), generator=g)
            if 0 < n < T:
                response[n - 1] = eos  # stopped: EOS is the last real token
            rows.append((prompt, torch.arange(P) >= P - plen, response, torch.arange(T) < n))
    return Rows(*(torch.stack(parts) for parts in zip(*rows)))


def random_rows(seed: int, *, vocab: int, eos: int, width: int = 9, budget: int = 8) -> Rows:
    """1-4 groups of 1-5 rows, prompts of 1..width tokens, responses of 0..budget tokens."""
    g = torch.Generator().manual_seed(10_000 + seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=g))

    groups = draw(1, 4)
    return grouped_rows(
        seed=seed,
        vocab=vocab,
        eos=eos,
        prompt_lengths=[draw(1, width) for _ in range(groups)],
        response_lengths=[[draw(0, budget) for _ in range(draw(1, 5))] for _ in range(groups)],
        width=width,
        budget=budget,
    )
