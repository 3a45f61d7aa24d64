"""A one-token-per-character tokenizer for the built-in arithmetic tasks, built locally.

The vocabulary is the task alphabet (digits, operators, ``=``, ``>``), the end token ``$`` and an
unknown token ``?``. The end token is both ``eos`` and ``pad`` (as in GPT-2 style models): every
mask in gmts is built from sequence lengths, never from token values, so a pad that equals eos is
harmless and the default path exercises the case that real models hit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tasks.py imports END_TOKEN from here: keep transformers out of that path
    from transformers import PreTrainedTokenizerFast

END_TOKEN = "$"
"""Marks the end of a completion; the tokenizer's eos and pad token."""
UNK_TOKEN = "?"
TASK_ALPHABET = "0123456789+-*=>"
"""Characters the built-in tasks use (one token each)."""


def build_char_tokenizer(alphabet: str = TASK_ALPHABET) -> PreTrainedTokenizerFast:
    """Build a character-level tokenizer with ``tokenizers`` (no hub access).

    Args:
        alphabet: the characters that get their own token, in id order. The end token ``$``
            (eos == pad) and the unknown token ``?`` are appended. Characters outside the
            alphabet encode to the unknown token.

    Returns:
        A ``PreTrainedTokenizerFast`` with eos/pad/unk set, left padding, no bos, and a decoder
        that joins characters without spaces. ``save_pretrained``/``from_pretrained`` round-trip.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not alphabet:
        raise ValueError("alphabet must not be empty")
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    bad = {END_TOKEN, UNK_TOKEN} & set(alphabet)
    if bad:
        raise ValueError(f"alphabet must not contain the reserved characters {sorted(bad)}")
    symbols = [*alphabet, END_TOKEN, UNK_TOKEN]
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every character is its own pre-token; the decoder fuses tokens back without spaces.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=END_TOKEN,
        pad_token=END_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        model_max_length=1024,
    )
    return tokenizer
