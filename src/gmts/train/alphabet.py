"""What a tokenizer can read: the characters of a dataset it cannot encode, checked before
training (the embedded model's tokenizer knows only ``0123456789+-*=>``; every other character
becomes its unknown token, so the model would train on text it cannot see).

Tokenizers without an unknown token (byte-level BPE: GPT-2, Qwen, Llama) encode every string,
and nothing is reported for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

LISTED_VOCAB_MAX = 512
"""A vocabulary up to this size is listed character by character in the error."""


def unknown_characters(
    tokenizer: Any, texts: Sequence[str], encoded: Sequence[Sequence[int]] | None = None
) -> list[str]:
    """The characters of ``texts`` that ``tokenizer`` encodes to its unknown token, sorted.

    Args:
        tokenizer: a Hugging Face tokenizer (``unk_token_id`` None: nothing is unknown).
        texts: the strings to check.
        encoded: their ids (``tokenizer(texts, add_special_tokens=False)``) if already at hand.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not texts:
        return []
    if encoded is None:
        encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    suspects = [text for text, ids in zip(texts, encoded) if unk in ids]
    if not suspects:
        return []
    characters = sorted({c for text in suspects for c in text})
    ids = tokenizer(characters, add_special_tokens=False)["input_ids"]
    return [c for c, char_ids in zip(characters, ids) if unk in char_ids]


def known_characters(tokenizer: Any) -> str | None:
    """The single characters ``tokenizer`` has a token for, in id order (special tokens
    excluded); None for a vocabulary too large to list (over ``LISTED_VOCAB_MAX``)."""
    vocab = tokenizer.get_vocab()
    if len(vocab) > LISTED_VOCAB_MAX:
        return None
    special = set(tokenizer.all_special_tokens)
    return "".join(t for t in sorted(vocab, key=vocab.get) if len(t) == 1 and t not in special)


def check_encodable(
    tokenizer: Any,
    prompts: Sequence[str],
    answers: Sequence[str],
    *,
    what: str,
    prompt_ids: Sequence[Sequence[int]] | None = None,
) -> None:
    """Raise ValueError (one line) when the prompts or gold answers of ``what`` hold
    characters ``tokenizer`` cannot encode, naming them and the characters it knows."""
    bad = sorted(
        set(unknown_characters(tokenizer, prompts, prompt_ids))
        | set(unknown_characters(tokenizer, answers))
    )
    if not bad:
        return
    known = known_characters(tokenizer)
    knows = (
        f"it knows only {known!r}"
        if known is not None
        else f"its vocabulary has {len(tokenizer.get_vocab())} tokens"
    )
    raise ValueError(
        f"{what}: the model's tokenizer cannot encode {len(bad)} character(s) of the prompts or "
        f"answers ({''.join(bad)[:80]!r}); {knows}. The embedded model reads only its task "
        "alphabet (docs/training.md, 'Your own data'): give model.path a Hugging Face model, or "
        "questions and answers in that alphabet (data.template=null, data.reward=exact)"
    )
