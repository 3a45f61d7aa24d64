"""The architectures of the shipped configs' models, for planning without the Hub.

``gmts plan`` and the GPU benchmark need each model's ``config.json`` but not its weights. When
``model.path`` is a hub id and the Hub cannot be reached, these transcriptions of the public
``config.json`` files (``https://huggingface.co/<id>/blob/main/config.json``; copied by hand,
not fetched here) stand in. Only the fields that decide shapes and the context are kept.
"""

from __future__ import annotations

from typing import Any

_QWEN25_SMALL = {  # Qwen2.5 1.5B family: hidden 1536, 28 layers, 12 query / 2 key-value heads
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
_QWEN25_7B = {  # Qwen2.5 7B family: hidden 3584, 28 layers, 28 query / 4 key-value heads
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}

KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-Math-1.5B": {
        **_QWEN25_SMALL,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
    },
    "Qwen/Qwen2.5-Math-7B": {**_QWEN25_7B, "max_position_embeddings": 4096, "rope_theta": 10000.0},
    "Qwen/Qwen2.5-1.5B": {
        **_QWEN25_SMALL,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
    },
    "Qwen/Qwen2.5-7B": {**_QWEN25_7B, "max_position_embeddings": 131072, "rope_theta": 1000000.0},
    "Qwen/Qwen2.5-Coder-1.5B": {
        **_QWEN25_SMALL,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
    },
    "Qwen/Qwen2.5-Coder-7B": {
        **_QWEN25_7B,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
    },
    "Qwen/Qwen3-8B": {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
    },
}


def known_config(model_id: str) -> Any:
    """The transformers config of a known model id (ValueError listing the known ids)."""
    from transformers import AutoConfig

    if model_id not in KNOWN_MODELS:
        raise ValueError(f"unknown model {model_id!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    fields = dict(KNOWN_MODELS[model_id])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def model_config(path: str, trust_remote_code: bool = False) -> tuple[Any, str]:
    """``(config, source)`` of ``model.path``: its config.json when readable, else the known
    transcription of a hub id (source says which). A LoRA adapter folder gives its base's."""
    from gmts.models.loading import load_model_config
    from gmts.models.lora import adapter_base_path, is_adapter_folder

    if is_adapter_folder(path):
        path = adapter_base_path(path)
    try:
        return load_model_config(path, trust_remote_code=trust_remote_code), path
    except OSError:
        if path in KNOWN_MODELS:
            return known_config(path), f"{path} (transcribed shape, gmts.scale.known_models)"
        raise ValueError(f"model.path: cannot read the config of {path!r}") from None
