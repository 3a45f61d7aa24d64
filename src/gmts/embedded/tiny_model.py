"""A tiny causal language model built locally with ``from_config`` (no hub access).

The default (GPT-2, 2 layers, width 128, 4 heads, MLP 4x, learned positions, ~0.4M parameters)
matches the plain-PyTorch prototype that learned 2-3 digit addition by RLVR on 2 CPU cores
(../shared/notes/embedded-task-calibration.md). Llama and Qwen2 are offered for tests of the
"any Hugging Face causal LM" paths; they were slower per step in that calibration.

The weights are initialised here (``init_weights``), not by transformers: transformers changed
GPT-2's initialisation between 5.10 and 5.24 (the residual projections became scaled, and the
random draws moved), which changed the embedded warm start and every figure measured on it. Our
recipe draws each parameter from its own generator, seeded by the model seed and the
parameter's name, so the weights are the same for a seed whatever the transformers version, the
global RNG state or the order in which modules are defined.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

ARCHITECTURES = ("gpt2", "llama", "qwen2")

RESIDUAL_PROJECTIONS: dict[str, tuple[str, ...]] = {
    "gpt2": ("attn.c_proj.weight", "mlp.c_proj.weight"),
    "llama": ("self_attn.o_proj.weight", "mlp.down_proj.weight"),
    "qwen2": ("self_attn.o_proj.weight", "mlp.down_proj.weight"),
}
"""Per architecture, the name endings of the matrices that write into the residual stream (two
per block); ``init_weights`` scales their standard deviation by 1 / sqrt(2 * num_layers)."""


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
        init_std: standard deviation of the normal initialisation of embeddings and matrices.
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
    init_std: float = 0.02

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
        if not self.init_std > 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std!r}")

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
            # five elementwise passes, a large share of the tiny model's forward on a CPU.
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
        A float32 ``transformers`` causal LM in training mode, initialised by ``init_weights``
        from ``config.seed`` (the same weights on every transformers version) without touching
        the global RNG state.
    """
    from transformers import AutoModelForCausalLM

    config = config or TinyModelConfig()
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer must have an eos token")
    hf_config = _hf_config(tokenizer, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    init_weights(model, config)
    model.train()
    return model


def _generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator for one parameter: seeded by the model seed and the parameter's name."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@torch.no_grad()
def init_weights(model: torch.nn.Module, config: TinyModelConfig) -> None:
    """Overwrite every parameter of ``model`` with the tiny model's own initialisation.

    Embeddings and matrices (``nn.Linear``, GPT-2's ``Conv1D``): normal(0, ``init_std``); the two
    residual projections of each block (``RESIDUAL_PROJECTIONS``): normal(0, ``init_std`` /
    sqrt(2 * num_layers)), GPT-2's scheme; biases: zeros; norm weights (LayerNorm, RMSNorm):
    ones. Each random parameter is drawn from its own generator (``config.seed`` and its name),
    in float32 on the CPU. A parameter no rule covers raises ValueError, so transformers' own
    initialisation can never leak into the result. Shared (tied) parameters are set once.
    """
    from transformers.pytorch_utils import Conv1D

    residual = RESIDUAL_PROJECTIONS[config.architecture]
    residual_std = config.init_std / math.sqrt(2 * config.num_layers)
    names = {id(p): n for n, p in model.named_parameters()}  # a tied parameter: its first name
    done: set[int] = set()
    for module in model.modules():
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in done:
                continue
            done.add(id(param))
            name = names[id(param)]
            is_norm = isinstance(module, torch.nn.LayerNorm) or type(module).__name__.endswith(
                "RMSNorm"
            )
            if param_name == "bias" and (is_norm or isinstance(module, torch.nn.Linear | Conv1D)):
                param.zero_()
            elif param_name == "weight" and is_norm:
                param.fill_(1.0)
            elif param_name == "weight" and isinstance(
                module, torch.nn.Linear | Conv1D | torch.nn.Embedding
            ):
                std = residual_std if name.endswith(residual) else config.init_std
                draw = torch.empty(param.shape, dtype=torch.float32)
                draw.normal_(0.0, std, generator=_generator(config.seed, name))
                param.copy_(draw)
            else:
                raise ValueError(
                    f"init_weights: no rule for parameter {name!r} "
                    f"({type(module).__name__}.{param_name})"
                )
