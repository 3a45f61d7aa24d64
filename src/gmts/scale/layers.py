"""Finding a Hugging Face causal LM's decoder layers, whatever its architecture.

The layers are the modules whose class names the model lists in ``_no_split_modules``
(``GPT2Block``, ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...): the units that FSDP shards
one by one and that the memory plan counts.
"""

from __future__ import annotations

import torch


def decoder_layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's decoder layers, from ``_no_split_modules``."""
    names = getattr(model, "_no_split_modules", None) or []
    present = {type(m).__name__ for m in model.modules()}
    found = {n for n in names if n in present}
    if not found:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__}: its _no_split_modules "
            f"is {list(names)}"
        )
    return found


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers in module order (see :func:`decoder_layer_classes`)."""
    names = decoder_layer_classes(model)
    return [m for m in model.modules() if type(m).__name__ in names]
