"""One way to find and load a model, for every command (train, eval, analyze, plan, export).

- :func:`resolve_model_path`: what a model argument designates. Accepted, tried in order:
  ``"embedded"`` (the cached warm start of a built-in task, built on first use); a named model
  (``smollm2-135m-instruct``, :mod:`gmts.models.named`) or a ``.gguf`` file (converted once
  into the cache as a Hugging Face folder); a Hugging
  Face model folder (``config.json``) or a peft LoRA adapter folder (``adapter_config.json``,
  what a LoRA run's checkpoints hold); a gmts checkpoint (``<run>/checkpoints/step_000100``,
  the model in ``model/``); a gmts training run (its newest checkpoint whose weights match
  its manifest, :mod:`gmts.models.manifest`); a hub id (``org/name``, where the hub is
  reachable).
- :func:`pick_device`: ``auto`` (this rank's GPU when CUDA is available, else the CPU),
  ``cpu``, ``cuda`` (this rank's GPU) or ``cuda:N``.
- :func:`load_tokenizer`, :func:`load_model`: the tokenizer with a pad token; the causal LM with
  dropout off (RL ratios need the same function in every pass), on the CPU, in the dtype asked.
  An adapter folder loads as its base model with the adapters merged in
  (:mod:`gmts.models.lora`), so every command reads a LoRA run like any other.
- :func:`load_model_config`: the ``config.json`` of a model (of an adapter folder's base).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from gmts.models.lora import (
    ADAPTER_CONFIG,
    adapter_base_path,
    is_adapter_folder,
    merge_saved_adapters,
)
from gmts.models.manifest import newest_intact
from gmts.models.named import (
    GGUFConversionError,
    available_named_models,
    convert_gguf,
    is_gguf_path,
    named_model_folder,
)

__all__ = [
    "CHECKPOINTS_DIR",
    "DTYPES",
    "EMBEDDED",
    "ModelPathError",
    "load_model",
    "load_model_config",
    "load_tokenizer",
    "pick_device",
    "resolve_model_path",
    "step_dir_name",
    "step_of",
    "torch_dtype",
]

EMBEDDED = "embedded"
CHECKPOINTS_DIR = "checkpoints"
"""A training run keeps its checkpoints in ``<run>/checkpoints/step_000010/`` (``model/`` in each)."""
_STEP_DIR = re.compile(r"^step_(\d+)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class ModelPathError(ValueError):
    """A model argument that names no usable model (the message fits on one line)."""


def step_dir_name(step: int) -> str:
    """The folder name of checkpoint ``step``: ``step_000010``."""
    return f"step_{step:06d}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint folder name, None for any other name."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def resolve_model_path(
    path: str | os.PathLike[str],
    *,
    task: str = "addition",
    seed: int = 0,
    progress: bool = False,
) -> str:
    """The Hugging Face model folder (or hub id) that ``path`` designates (see module docstring).

    Args:
        path: the model argument. task, seed: which warm start ``"embedded"`` means.
        progress: show the warm start's progress bar if it has to be trained.

    Raises:
        ModelPathError: the path does not exist, or holds none of the layouts.
    """
    text = str(path)
    if text == EMBEDDED:
        from gmts.embedded.warmstart import warm_start

        return str(warm_start(task, seed=seed, progress=progress))
    if text in available_named_models() or is_gguf_path(text):
        try:
            if is_gguf_path(text):
                return str(convert_gguf(text))
            return str(named_model_folder(text))
        except GGUFConversionError as exc:
            raise ModelPathError(str(exc)) from None
    root = Path(text).expanduser()
    if not root.exists():
        if _HUB_ID.match(text) and not text.startswith("."):
            return text  # a hub id: from_pretrained reports if it cannot be reached
        raise ModelPathError(f"model path does not exist: {root}{_named_hint(text)}")
    if _is_model_folder(root):
        return str(root)
    if _is_model_folder(root / "model"):
        return str(root / "model")
    steps = []
    if (root / CHECKPOINTS_DIR).is_dir():
        for child in (root / CHECKPOINTS_DIR).iterdir():
            step = step_of(child.name)
            if step is not None and _is_model_folder(child / "model"):
                steps.append((step, child))
    if steps:  # the newest whose weights match its manifest (a damaged one is warned of)
        newest, skipped = newest_intact(steps, under="model/")
        if newest is None:
            raise ModelPathError(f"every checkpoint of {root} is damaged: {'; '.join(skipped)}")
        return str(newest / "model")
    raise ModelPathError(
        f"no model found at {root}: expected config.json (or a LoRA run's {ADAPTER_CONFIG}) "
        f"there, in model/, or in {CHECKPOINTS_DIR}/step_*/model/"
    )


def _named_hint(text: str) -> str:
    """For a bare name (no folder in it): the names a model argument accepts, and the closest
    to ``text`` (``smollm2-135m`` -> ``smollm2-135m-instruct``)."""
    if "/" in text or os.sep in text:
        return ""
    import difflib

    names = [EMBEDDED, *available_named_models()]
    close = difflib.get_close_matches(text.lower(), names, n=1, cutoff=0.5)
    if not close:  # a prefix is a match too (a name cut short)
        close = [n for n in names if n.startswith(text.lower()) or text.lower().startswith(n)]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f" (nor a named model: {', '.join(names)}){hint}"


def _is_model_folder(path: Path) -> bool:
    """A Hugging Face model folder or a peft adapter folder."""
    return (path / "config.json").is_file() or is_adapter_folder(path)


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """The device ``name`` means for the process with ``local_rank``; ValueError when CUDA is
    asked for but not available."""
    if name == "auto":
        return (
            torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        )
    device = torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def torch_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """A dtype name as a torch dtype; ``"auto"``: bfloat16 on a GPU, float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def load_tokenizer(
    path: str | os.PathLike[str], *, trust_remote_code: bool = False, pad_token: bool = True
) -> Any:
    """The tokenizer of ``path``; with ``pad_token`` it gets one (eos) when it has none."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as exc:
        message = f"cannot load a tokenizer from {str(path)!r}: {_first_line(exc)}"
        raise ModelPathError(message) from None
    if pad_token and tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    training: bool = True,
) -> Any:
    """The causal LM of ``path`` on the CPU in ``dtype``, dropout off.

    An adapter folder (a LoRA run's checkpoint) gives its base model, loaded in ``dtype``, with
    the adapters merged in (``merge_and_unload``: ``W + scaling * B A`` computed in float32,
    rounded once to ``dtype``): a plain model of the base's class.

    Args:
        gradient_checkpointing: recompute activations in backward (non-reentrant).
        training: ``model.train()`` (the trainer; dropout stays off) or ``model.eval()``.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bar is the only one
    if is_adapter_folder(path):
        model = _load_merged(path, dtype=dtype, trust_remote_code=trust_remote_code)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, trust_remote_code=trust_remote_code
            )
        except OSError as exc:
            message = f"cannot load a model from {str(path)!r}: {_first_line(exc)}"
            raise ModelPathError(message) from None
    for module in model.modules():  # RL ratios need the same function in every pass
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    if gradient_checkpointing:
        _enable_activation_checkpointing(model)
        model.config.use_cache = False
    contiguous_head_input(model)
    return model.train(training)


def contiguous_head_input(model: Any) -> None:
    """Make the output layer's input contiguous (a forward pre-hook on
    ``get_output_embeddings()``).

    With ``logits_to_keep`` the model slices its last hidden states (``hidden[:, -k:, :]``, not
    contiguous) before the output layer. For a 3-D non-contiguous input and a weight that needs
    no gradient (a frozen reference, a LoRA run's frozen base, any no-grad pass with frozen
    weights), torch's CPU ``linear`` falls back to a batched matmul that materialises the
    weight once per row: with a 32k vocabulary, width 256 and 8 rows that is 131 MB (measured),
    with Qwen2.5's 152k x 1536 and 64 rows some 30 GB. A contiguous copy of the kept hidden
    states (B x k x H) avoids it; the values are the same.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_gmts_contiguous_input", False):
        return

    def hook(module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
            return (args[0].contiguous(), *args[1:])
        return None

    head.register_forward_pre_hook(hook)
    head._gmts_contiguous_input = True


def _load_merged(
    path: str | os.PathLike[str], *, dtype: torch.dtype, trust_remote_code: bool
) -> Any:
    """The base of adapter folder ``path`` in ``dtype`` with its adapters merged in."""
    try:
        base_path = adapter_base_path(path)
    except ValueError as exc:
        raise ModelPathError(str(exc)) from None
    base = load_model(base_path, dtype=dtype, trust_remote_code=trust_remote_code)
    return merge_saved_adapters(base, path)


def load_model_config(path: str | os.PathLike[str], *, trust_remote_code: bool = False) -> Any:
    """The transformers config of model ``path`` (of its base, for an adapter folder) from
    ``config.json`` alone; ``OSError`` when it cannot be read (an unreachable hub id)."""
    from transformers import AutoConfig

    if is_adapter_folder(path):
        try:
            path = adapter_base_path(path)
        except ValueError as exc:
            raise ModelPathError(str(exc)) from None
        return load_model_config(path, trust_remote_code=trust_remote_code)
    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def _enable_activation_checkpointing(model: Any) -> None:
    """Recompute activations in backward, non-reentrant (the variant that works under FSDP2 and
    autocast), with the API of the installed transformers: ``activation_checkpointing_enable``
    (transformers >= 5.23, where ``gradient_checkpointing_enable`` is deprecated) or the older
    name."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
