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
        from gmts.train.warmstart import warm_start

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


def load_policy(path: str, cfg: TrainConfig, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) from a local directory or hub id, on ``device``, dropout off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar is the only one

    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    kw = {"trust_remote_code": cfg.model.trust_remote_code}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kw)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw).to(device)
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"model.path: cannot load {path!r}: {first}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    for module in model.modules():  # RL ratios need the same function in every pass
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    model.train()
    return model, tokenizer
