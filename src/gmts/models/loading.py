"""Loading the policy: resolve ``model.path`` (local directory, hub id or the embedded warm
start) and load model + tokenizer ready for RL (dropout off, pad token set)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from gmts.train.config import TrainConfig

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model_path(cfg: TrainConfig, progress: bool = False) -> str:
    """The model directory (or hub id) to load; raises ValueError with one line if missing."""
    path = cfg.model.path
    if path == "embedded":
        from gmts.embedded.warmstart import warm_start

        return str(warm_start(cfg.data.task, seed=cfg.seed, progress=progress))
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ValueError(
                f"model.path: {p} is not a Hugging Face model directory (no config.json)"
            )
        return str(p)
    if _HUB_ID.match(path) and not path.startswith("."):
        return path  # a hub id: from_pretrained reports if it cannot be reached
    raise ValueError(f"model.path: {path} does not exist")


def load_tokenizer(path: str, cfg: TrainConfig) -> Any:
    """The tokenizer of ``path`` with a pad token (eos when it has none)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=cfg.model.trust_remote_code
        )
    except OSError as exc:
        raise ValueError(f"model.path: cannot load {path!r}: {_first_line(exc)}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, cfg: TrainConfig, dtype: torch.dtype) -> Any:
    """The causal LM of ``path`` on the CPU in ``dtype``, dropout off, in training mode
    (the strategy moves or shards it; :mod:`gmts.scale.strategy`).

    The policy is loaded in float32 (its master weights) whatever ``model.dtype`` says; the
    frozen reference model in the compute dtype.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar is the only one
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=cfg.model.trust_remote_code
        )
    except OSError as exc:
        raise ValueError(f"model.path: cannot load {path!r}: {_first_line(exc)}") from None
    for module in model.modules():  # RL ratios need the same function in every pass
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if cfg.model.gradient_checkpointing:
        _enable_activation_checkpointing(model)
        model.config.use_cache = False
    model.train()
    return model


def _enable_activation_checkpointing(model: Any) -> None:
    """Recompute activations in backward, non-reentrant (the variant that works under FSDP2 and
    autocast), with the API of the installed transformers: ``activation_checkpointing_enable``
    (transformers >= 5.2x; ``gradient_checkpointing_enable`` is deprecated there) or the older
    name."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_policy(path: str, cfg: TrainConfig, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) of ``path`` on ``device`` with float32 weights, dropout off: the
    one-process policy without a strategy (tests, analyses)."""
    return load_model(path, cfg, torch.float32).to(device), load_tokenizer(path, cfg)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
