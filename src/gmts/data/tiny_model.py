"""A tiny causal language model built locally with ``from_config`` (no hub access).

The default (GPT-2, 2 layers, width 128, 4 heads, MLP 4x, learned positions, ~0.4M parameters)
matches the plain-PyTorch prototype that learned 2-3 digit addition by RLVR on 2 CPU cores
(../shared/notes/embedded-task-calibration.md). Llama and Qwen2 are offered for tests of the
"any Hugging Face causal LM" paths; they were 1.2-1.6x slower per step in that calibration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

ARCHITECTURES = ("gpt2", "llama", "qwen2")


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny model.

    Attributes:
        architecture: transformers model family: "gpt2" (learned positions, the default),
            "llama" or "qwen2" (rotary positions).
        num_layers: transformer blocks.
        hidden_size: model width.
        num_heads: attention heads; must divide ``hidden_size``.
        mlp_ratio: MLP width as a multiple of ``hidden_size``.
        max_positions: longest sequence (prompt + completion) the model can see.
        dropout: dropout probability everywhere (0 keeps sampling and training consistent).
        tie_embeddings: share the input embedding and the output head.
        seed: seed for the parameter initialisation (``build_tiny_model`` is deterministic).
    """

    architecture: str = "gpt2"
    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 4
    mlp_ratio: int = 4
    max_positions: int = 64
    dropout: float = 0.0
    tie_embeddings: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"architecture must be one of {list(ARCHITECTURES)}, got {self.architecture!r}"
            )
        for name in ("num_layers", "hidden_size", "num_heads", "mlp_ratio", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _hf_config(tokenizer: PreTrainedTokenizerBase, config: TinyModelConfig):
    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    common = dict(
        vocab_size=len(tokenizer),
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=config.tie_embeddings,
    )
    if config.architecture == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(
            n_layer=config.num_layers,
            n_embd=config.hidden_size,
            n_head=config.num_heads,
            n_inner=config.mlp_ratio * config.hidden_size,
            n_positions=config.max_positions,
            resid_pdrop=config.dropout,
            embd_pdrop=config.dropout,
            attn_pdrop=config.dropout,
            # exact GELU is one fused kernel; GPT-2's tanh approximation ("gelu_new") costs
            # five elementwise passes and made the whole forward ~2.3x slower on 2 CPU cores.
            activation_function="gelu",
            **common,
        )
    llama_like = dict(
        num_hidden_layers=config.num_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        intermediate_size=config.mlp_ratio * config.hidden_size,
        max_position_embeddings=config.max_positions,
        attention_dropout=config.dropout,
        **common,
    )
    if config.architecture == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**llama_like)
    from transformers import Qwen2Config

    return Qwen2Config(**llama_like)


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, config: TinyModelConfig | None = None
) -> PreTrainedModel:
    """Build a freshly initialised tiny causal LM for ``tokenizer``'s vocabulary.

    Args:
        tokenizer: gives the vocabulary size and the eos/pad ids (see ``build_char_tokenizer``).
        config: model shape; ``TinyModelConfig()`` when None.

    Returns:
        A float32 ``transformers`` causal LM in training mode, initialised from ``config.seed``
        without touching the global RNG state.
    """
    from transformers import AutoModelForCausalLM

    config = config or TinyModelConfig()
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer must have an eos token")
    hf_config = _hf_config(tokenizer, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.train()
    return model
