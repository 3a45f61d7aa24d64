"""LoRA adapters through peft: what ``model.lora`` configures, and the plumbing every command shares.

- :class:`LoraConfig`: rank, alpha, dropout and target modules (``model.lora`` of the trainer's
  config; null there means full fine-tuning).
- :func:`check_targets`: the target modules checked against the model's ``config.json`` alone
  (a ``meta``-device copy, no weights), before anything is loaded.
- :func:`add_adapters`: a causal LM -> a peft ``PeftModelForCausalLM`` whose base is frozen (its
  parameters keep the dtype they were loaded in) and whose adapters are new float32 tensors
  (the only trainable parameters: lora_B = 0, so the model starts as the base).
- :func:`load_adapter_weights`: the adapters of a saved adapter folder put back (resume);
  :func:`merge_saved_adapters`: merged into their base (every other reader).
- :class:`AdaptersOff`: the base model itself, as a callable: the LoRA model with its adapters
  switched off (the KL reference without a second copy of the weights).
- :func:`merged_weights`: the base model's parameters with the adapters merged in
  (``W + scaling * B @ A``), streamed one tensor at a time (weight sync to an inference engine).
- Adapter folders (what a LoRA run's checkpoints hold in ``model/``: ``adapter_config.json``,
  ``adapter_model.safetensors`` and the tokenizer): :func:`is_adapter_folder`,
  :func:`adapter_base_path`. :func:`gmts.models.loading.load_model` loads one as base + adapters,
  merged.

peft is imported on use (``pip install peft``; the ``train`` extra has it).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "ADAPTER_CONFIG",
    "ALL_LINEAR",
    "AdaptersOff",
    "LoraConfig",
    "adapter_base_path",
    "add_adapters",
    "check_targets",
    "is_adapter_folder",
    "load_adapter_weights",
    "merged_weights",
]

ADAPTER_CONFIG = "adapter_config.json"
"""The file that marks a peft adapter folder."""
ALL_LINEAR = "all-linear"
"""peft's shorthand for every linear layer except the output head (verl's default too)."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class LoraConfig:
    """LoRA adapters (Hu et al. 2021) on the policy: ``W x + (alpha / rank) * B A x``.

    ``model.lora`` of the trainer's config; null there means full fine-tuning.
    """

    rank: int = field(default=8, metadata=_help("r: inner dimension of each adapter (B A)."))
    alpha: float = field(
        default=16.0, metadata=_help("lora_alpha: the adapter's output is scaled by alpha / rank.")
    )
    dropout: float = field(
        default=0.0,
        metadata=_help(
            "lora_dropout on the adapter's input. Above 0 every training forward (old "
            "log-probs, loss) draws its own mask, so the importance ratio is not exactly 1 at "
            "the first update; 0 keeps the ratios exact."
        ),
    )
    target_modules: str | tuple[str, ...] = field(
        default=ALL_LINEAR,
        metadata=_help(
            "Modules that get adapters: 'all-linear' (every linear layer but the output "
            "head) or a list of module names, e.g. [q_proj, k_proj, v_proj, o_proj]; a name "
            "matches a module whose qualified name is it or ends in '.<name>' (peft's rule). "
            "A name that matches no module of the model is an error before any weight is read."
        ),
    )

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):
            self.target_modules = tuple(self.target_modules)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"model.lora.rank: must be an integer >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"model.lora.alpha: must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.lora.dropout: must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, str):
            if targets != ALL_LINEAR:
                raise ValueError(
                    f"model.lora.target_modules: expected {ALL_LINEAR!r} or a list of module "
                    f"names, got {targets!r}"
                )
        elif not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(
                f"model.lora.target_modules: expected a non-empty list of module names, got "
                f"{list(targets)!r}"
            )

    @property
    def scaling(self) -> float:
        """The factor on ``B A``: ``alpha / rank``."""
        return self.alpha / self.rank

    def to_peft(self, *, fan_in_fan_out: bool = False) -> Any:
        """The equivalent ``peft.LoraConfig`` (task CAUSAL_LM, no bias training).

        Args:
            fan_in_fan_out: the targets store their weight as (in, out) (GPT-2's ``Conv1D``).
        """
        import peft

        targets = self.target_modules
        return peft.LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets if isinstance(targets, str) else list(targets),
            fan_in_fan_out=fan_in_fan_out,
            bias="none",
            task_type="CAUSAL_LM",
        )


# --------------------------------------------------------------------------- targets


def _linear_classes() -> tuple[type, ...]:
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


def _check_names(model: torch.nn.Module, lora: LoraConfig) -> None:
    """Every listed target name matches at least one module of ``model`` (peft's matching
    rule); ValueError naming the model's linear layers otherwise."""
    if isinstance(lora.target_modules, str):
        return
    names = [name for name, _ in model.named_modules() if name]
    linear = sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, _linear_classes())}
    )
    unknown = [
        t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)
    ]
    if unknown:
        raise ValueError(
            f"model.lora.target_modules: {unknown} match no module of {type(model).__name__}; "
            f"its linear layers are {linear}"
        )


def _uses_conv1d(model: torch.nn.Module, lora: LoraConfig) -> bool:
    """Whether the targets are GPT-2 style ``Conv1D`` layers (weights stored (in, out))."""
    from transformers.pytorch_utils import Conv1D

    conv = [n for n, m in model.named_modules() if isinstance(m, Conv1D)]
    if isinstance(lora.target_modules, str):
        return bool(conv)
    return any(n == t or n.endswith(f".{t}") for n in conv for t in lora.target_modules)


def add_adapters(
    model: torch.nn.Module,
    lora: LoraConfig,
    *,
    seed: int = 0,
    base_path: str | os.PathLike[str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """``model`` with LoRA adapters: a ``peft.PeftModelForCausalLM`` (``model`` is modified).

    The base's parameters are frozen in the dtype they have (the caller loads them in the
    compute dtype); the adapters are the only parameters with ``requires_grad``, in ``dtype``
    (float32: master weights). lora_A is drawn from a generator seeded with ``seed`` (the
    global RNG is left as it was, so every rank draws the same adapters); lora_B is 0.

    Args:
        base_path: recorded in ``adapter_config.json`` as the base model (resolved to an
            absolute path when it is a local folder).

    Raises:
        ValueError: a target name matches no module, or peft cannot adapt a matched module.
    """
    import peft

    _check_names(model, lora)
    config = lora.to_peft(fan_in_fan_out=_uses_conv1d(model, lora))
    if base_path is not None:
        local = Path(base_path).expanduser()
        config.base_model_name_or_path = str(local.resolve()) if local.exists() else str(base_path)
    with torch.random.fork_rng(devices=[]), _quiet_peft():
        torch.manual_seed(seed)
        try:
            peft_model = peft.get_peft_model(model, config, autocast_adapter_dtype=False)
        except ValueError as exc:
            raise ValueError(f"model.lora.target_modules: {exc}") from None
    for name, param in peft_model.named_parameters():
        if param.requires_grad:
            param.data = param.data.to(dtype)
        elif "lora_" in name:  # pragma: no cover - peft freezes the base, never an adapter
            raise AssertionError(f"adapter parameter {name} is frozen")
    return peft_model


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft asks transformers' deprecated ``is_gradient_checkpointing``: not ours to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def check_targets(
    model_config: Any, lora: LoraConfig | None, *, trust_remote_code: bool = False
) -> int:
    """Adapt a ``meta``-device copy of ``model_config``'s causal LM (no memory, no weights) and
    return the adapter parameter count (0 when ``lora`` is None: full fine-tuning).

    Raises:
        ValueError: a target name matches no module of the model (the message lists its linear
            layers), or peft cannot adapt a matched module.
    """
    if lora is None:
        return 0
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config, trust_remote_code=trust_remote_code)
    adapted = add_adapters(model, lora)
    return sum(p.numel() for p in adapted.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- saved adapters


def is_adapter_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a peft adapter folder (``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``adapter_config.json`` of an adapter folder."""
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())


def adapter_base_path(path: str | os.PathLike[str]) -> str:
    """The base model an adapter folder was trained on (``base_model_name_or_path``).

    Raises:
        ValueError: the folder names no base, or names a local folder that no longer exists.
    """
    base = adapter_config(path).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{Path(path) / ADAPTER_CONFIG} names no base model")
    looks_local = os.path.isabs(base) or base.startswith(".")
    if looks_local and not Path(base).exists():
        raise ValueError(
            f"the LoRA adapters in {path} were trained on {base}, which does not exist here; "
            f"put the base model there (or edit base_model_name_or_path in {ADAPTER_CONFIG})"
        )
    return str(base)


def load_adapter_weights(model: Any, path: str | os.PathLike[str]) -> None:
    """Copy the adapters saved in folder ``path`` into ``model`` (a :func:`add_adapters` result
    with the same configuration), exactly.

    Raises:
        ValueError: the saved adapters were made with another rank / alpha / dropout, or their
            tensors do not match the model's adapters one to one.
    """
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    saved = adapter_config(path)
    ours = model.peft_config["default"]
    for key in ("r", "lora_alpha", "lora_dropout"):
        if saved.get(key) != getattr(ours, key):
            raise ValueError(
                f"the adapters in {path} have {key}={saved.get(key)}, the config "
                f"{getattr(ours, key)}; resume with the same model.lora"
            )
    weights = load_peft_weights(str(path), device="cpu")
    expected = {n for n, p in model.named_parameters() if p.requires_grad}
    try:
        result = set_peft_model_state_dict(model, weights)
    except RuntimeError as exc:  # a shape mismatch
        raise ValueError(f"the adapters in {path} do not fit the model: {exc}") from None
    missing = sorted(expected & set(result.missing_keys))
    if missing or result.unexpected_keys:
        raise ValueError(
            f"the adapters in {path} do not match model.lora.target_modules: missing "
            f"{missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}"
        )


def merge_saved_adapters(base: torch.nn.Module, path: str | os.PathLike[str]) -> Any:
    """``base`` (loaded from :func:`adapter_base_path`) with the adapters of folder ``path``
    merged in (peft's ``merge_and_unload``; float32 adapters, one rounding to the base's
    dtype): a plain model of the base's class, its parameters requiring grad as
    ``from_pretrained``'s do (peft froze them)."""
    from peft import PeftModel

    with _quiet_peft():
        adapted = PeftModel.from_pretrained(base, str(path), autocast_adapter_dtype=True)
    return adapted.merge_and_unload().requires_grad_(True)


# --------------------------------------------------------------------------- using adapters


class AdaptersOff:
    """The base model of a LoRA model: calling it runs ``model`` with its adapters disabled.

    The KL reference of a LoRA run is the starting policy, i.e. the frozen base (lora_B starts
    at 0), so it needs no second copy of the weights. It has the model's forward signature.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)


def _lora_layers(base: torch.nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}


@torch.no_grad()
def merged_weights(model: Any, *, every_name: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's parameters with the active adapters merged in, one at a time.

    Yields ``(name, tensor)`` for every parameter of the base model (``model.get_base_model()``;
    tied weights once, in ``named_parameters`` order) under its own name (e.g.
    ``model.layers.0.self_attn.q_proj.weight``, as in the base's safetensors): for an adapted
    module's weight ``W + scaling * B @ A`` (peft's ``get_delta_weight``: ``(out, in)``, or
    ``(in, out)`` for ``Conv1D``), computed in float32 (autocast off) and rounded once to
    ``W``'s dtype (what peft's ``merge_and_unload`` gives); every other parameter is the model's own tensor, not
    copied. Only one merged tensor is alive at a time, so no second model is materialised.
    The model is not changed. Under FSDP, iterate inside ``strategy.sampling(model)`` (the
    layers gathered). A model without adapters (full fine-tuning) yields its own
    ``named_parameters()``, so a weight sync needs no branch. ``every_name``: a tied weight
    under each of its names (an inference engine's in-place reload waits for every name).
    """
    if not hasattr(model, "get_base_model"):
        yield from model.named_parameters(remove_duplicate=not every_name)
        return
    base = model.get_base_model()
    layers = _lora_layers(base)
    for name, param in base.named_parameters(remove_duplicate=not every_name):
        layer_name, rest = _owning_layer(name, layers)
        if layer_name is None:
            yield name, param
            continue
        if not rest.startswith("base_layer."):
            continue  # an adapter tensor (lora_A / lora_B ...)
        layer, leaf = layers[layer_name], rest.removeprefix("base_layer.")
        public = f"{layer_name}.{leaf}"
        if leaf != "weight" or layer.merged or layer.disable_adapters:
            yield public, param
            continue
        merged = param.float()
        # float32 even inside an autocast region (sampling under replicate's bf16 runs in one)
        with torch.autocast(param.device.type, enabled=False):
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    if adapter in layer.lora_variant:
                        raise ValueError(f"merged_weights: {layer_name} has a LoRA variant")
                    merged = merged + layer.get_delta_weight(adapter).float()
        yield public, merged.to(param.dtype)


def _owning_layer(name: str, layers: dict[str, Any]) -> tuple[str | None, str]:
    """``(LoRA layer, rest of the name)`` of parameter ``name`` (``(None, name)`` outside)."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in layers:
            return prefix, ".".join(parts[i:])
    return None, name
