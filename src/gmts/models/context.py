"""Context guards: the longest prompt plus the generation budget must fit in the model.

A sequence longer than the model's positions crashes deep inside the position embedding
(``IndexError: index out of range in self`` for learned positions) or silently leaves the
range the model was trained on (rotary positions). ``gmts train``, ``gmts eval`` and
``gmts analyze`` therefore compare ``prompt tokens + max new tokens`` with the model's limit at
load time, before any sampling (and before the weights are read), and stop with an error that
names the numbers and the settings to change.

The limit is ``max_position_embeddings`` of the model's ``config.json`` (GPT-2's ``n_positions``)
and, when it is meaningful, the tokenizer's ``model_max_length`` (transformers fills in 1e30
when a tokenizer does not know its length; such values are ignored).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

UNKNOWN_LENGTH = 10**9
"""A tokenizer ``model_max_length`` at or above this is transformers' "unknown" filler."""


class ContextError(ValueError):
    """Prompt + generation budget do not fit in the model's context (one-line message)."""


@dataclass(frozen=True)
class ContextLimit:
    """The longest sequence (prompt + response) a model takes, and where that number is from.

    Attributes:
        positions: the limit in tokens.
        source: e.g. ``"max_position_embeddings of /models/x/config.json"``.
    """

    positions: int
    source: str

    def __str__(self) -> str:
        return f"{self.positions} ({self.source})"


def context_limit(
    model_config: Any, tokenizer: Any = None, where: str = "the model"
) -> ContextLimit | None:
    """The smaller of the config's ``max_position_embeddings`` and the tokenizer's meaningful
    ``model_max_length``; None when neither is known."""
    candidates = []
    positions = getattr(model_config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        candidates.append(ContextLimit(positions, f"max_position_embeddings of {where}"))
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < UNKNOWN_LENGTH:
        candidates.append(ContextLimit(length, f"model_max_length of {where}'s tokenizer"))
    return min(candidates, key=lambda c: c.positions) if candidates else None


def read_limit(
    path: str, tokenizer: Any = None, trust_remote_code: bool = False
) -> ContextLimit | None:
    """:func:`context_limit` of the model folder, adapter folder or hub id ``path`` (reads
    config.json only)."""
    from gmts.models.loading import load_model_config

    config = load_model_config(path, trust_remote_code=trust_remote_code)
    return context_limit(config, tokenizer, where=str(path))


def longest_prompt(tokenizer: Any, prompts: Iterable[str]) -> int:
    """The most tokens any of ``prompts`` encodes to (as the sampler encodes: no special
    tokens added); 0 for none."""
    texts = list(prompts)
    if not texts:
        return 0
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return max(len(ids) for ids in encoded)


def check_fits(
    *,
    prompt_tokens: int,
    new_tokens: int,
    limit: ContextLimit | None,
    what: str,
    settings: str,
) -> None:
    """Raise :class:`ContextError` unless ``prompt_tokens + new_tokens <= limit.positions``.

    Args:
        what: the owner of the prompts, e.g. ``"data.dataset gsm8k"`` or ``"benchmark math500"``.
        settings: the settings that change the numbers, named in the message.
    """
    if limit is None:
        return
    total = prompt_tokens + new_tokens
    if total > limit.positions:
        raise ContextError(
            f"{what}: the longest prompt ({prompt_tokens} tokens) + {new_tokens} new tokens = "
            f"{total} tokens exceeds the model's context of {limit}; change {settings}, or use a "
            "model with a longer context"
        )
