"""Fixtures for the evaluation tests: a byte-level tokenizer and a tiny random Qwen2 model, and
the embedded tiny model with its character tokenizer.

Everything is built locally (the Hub is unreachable in CI). The tokenizer has one token per
byte plus ChatML special tokens, so any benchmark text round-trips; the model is a one-layer
Qwen2 with random weights: the tests check the pipeline, never accuracy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One intra-op thread: on the shared 2-core CI machine the tiny models run ~15x faster
    than with 2 contending threads (measured: 0.8 s vs 16 s for one `gmts eval` run)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_byte_tokenizer(chat_template: str | None = None):
    """A PreTrainedTokenizerFast with 256 byte tokens + 3 special tokens (ids 256-258)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def build_tiny_qwen(vocab_size: int, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config)


@pytest.fixture(scope="session")
def make_byte_tokenizer():
    """The builder itself (conftest modules are not importable under --import-mode=importlib)."""
    return build_byte_tokenizer


@pytest.fixture(scope="session")
def make_tiny_qwen():
    """The builder itself (as :func:`make_byte_tokenizer`)."""
    return build_tiny_qwen


@pytest.fixture(scope="session")
def byte_tokenizer():
    return build_byte_tokenizer()


@pytest.fixture(scope="session")
def chat_tokenizer():
    from gmts.data.prompts import CHATML_TEMPLATE

    return build_byte_tokenizer(CHATML_TEMPLATE)


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory) -> Path:
    """A saved HF model dir (config.json, weights, tokenizer with the ChatML template)."""
    from gmts.data.prompts import CHATML_TEMPLATE

    tok = build_byte_tokenizer(CHATML_TEMPLATE)
    model = build_tiny_qwen(len(tok))
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    path = tmp_path_factory.mktemp("tiny_chat_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_task_model_dir(tmp_path_factory) -> Path:
    """The embedded tiny model (random weights) and its char tokenizer, saved."""
    from gmts.embedded.tiny_model import build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    path = tmp_path_factory.mktemp("tiny_task_model")
    build_tiny_model(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path
