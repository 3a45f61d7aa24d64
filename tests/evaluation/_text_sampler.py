"""A fake :class:`gmts.sampling.sampler.Sampler` for the harness tests: a subclass says which
texts answer each prompt (``complete``); ``sample`` returns them in a ``Rollout`` (one
placeholder token per row, rows grouped by prompt), as a real sampler would."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gmts.sampling.rollout import Rollout


class TextSampler:
    """Subclasses define ``complete(prompts, *, n, temperature, max_new_tokens, seed)`` -> a
    list of ``len(prompts)`` lists of ``n`` completions."""

    name = "fake"
    tokenizer = None
    generation_config = None
    stop_token_ids = [0]

    def complete(self, prompts: list[str], **kw: Any) -> list[list[str]]:
        raise NotImplementedError

    def session(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sample(self, problems, *, num_samples, max_new_tokens, temperature, seed) -> Rollout:
        prompts = [p if isinstance(p, str) else p.prompt for p in problems]
        texts = self.complete(
            prompts,
            n=num_samples,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            seed=seed,
        )
        rows = len(prompts) * num_samples
        ones = torch.ones(rows, 1, dtype=torch.bool)
        return Rollout(
            prompt_ids=torch.zeros(rows, 1, dtype=torch.long),
            prompt_mask=ones,
            response_ids=torch.zeros(rows, 1, dtype=torch.long),
            response_mask=ones,
            response_lengths=torch.ones(rows, dtype=torch.long),
            finished=torch.ones(rows, dtype=torch.bool),
            group_ids=torch.arange(len(prompts)).repeat_interleave(num_samples),
            prompts=[p for p in prompts for _ in range(num_samples)],
            completions=[text for group in texts for text in group],
            answers=[""] * rows,
            num_samples=num_samples,
        )

    def close(self) -> None:
        pass
