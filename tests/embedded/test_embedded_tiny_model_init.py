"""The tiny model's own initialisation: every parameter ours, the same on every transformers."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from gmts.embedded.tiny_model import (
    RESIDUAL_PROJECTIONS,
    TinyModelConfig,
    _hf_config,
    build_tiny_model,
    init_weights,
)
from gmts.embedded.tokenizer import build_char_tokenizer

ARCHS = ("gpt2", "llama", "qwen2")


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tie", [True, False])
def test_weights_ignore_the_global_rng_and_keep_it(tok, arch, tie):
    config = TinyModelConfig(architecture=arch, tie_embeddings=tie, num_layers=2, seed=5)
    torch.manual_seed(0)
    a = build_tiny_model(tok, config)
    torch.manual_seed(1)
    state = torch.get_rng_state()
    b = build_tiny_model(tok, config)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    assert _digest(a) == _digest(b)
    other = build_tiny_model(tok, TinyModelConfig(architecture=arch, tie_embeddings=tie, seed=6))
    assert _digest(other) != _digest(a)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_is_overwritten(tok, arch):
    """Whatever transformers' own initialisation left behind (here: NaN everywhere), nothing of
    it survives init_weights."""
    from transformers import AutoModelForCausalLM

    config = TinyModelConfig(architecture=arch, tie_embeddings=False, seed=2)
    model = AutoModelForCausalLM.from_config(_hf_config(tok, config))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    init_weights(model, config)
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
    assert _digest(model) == _digest(build_tiny_model(tok, config))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_recipe_by_parameter_kind(tok, arch):
    config = TinyModelConfig(architecture=arch, num_layers=3, hidden_size=64, num_heads=2)
    model = build_tiny_model(tok, config)
    residual_std = config.init_std / math.sqrt(2 * config.num_layers)
    seen_residual = 0
    for name, p in model.named_parameters():
        if name.endswith("bias") or name.endswith("norm.weight") or ".ln_" in name:
            expected = 0.0 if name.endswith("bias") else 1.0
            assert torch.all(p == expected), name
            continue
        std = float(p.detach().std())
        if name.endswith(RESIDUAL_PROJECTIONS[arch]):
            seen_residual += 1
            assert std == pytest.approx(residual_std, rel=0.1), name
        else:
            assert std == pytest.approx(config.init_std, rel=0.1), name
        assert abs(float(p.detach().mean())) < 0.2 * std, name
    assert seen_residual == 2 * config.num_layers
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied


def test_default_weights_are_the_pinned_ones(tok):
    """The default tiny model's state dict, hashed on transformers 5.10.4 and 5.24.0 (torch 2.13):
    a change here changes the embedded warm start and every figure measured on it."""
    assert _digest(build_tiny_model(tok)) == "a9270899c170d15b"


def test_a_parameter_without_a_rule_is_an_error(tok):
    from transformers import AutoModelForCausalLM

    config = TinyModelConfig()
    model = AutoModelForCausalLM.from_config(_hf_config(tok, config))
    model.transformer.register_parameter("extra_scale", torch.nn.Parameter(torch.ones(3)))
    with pytest.raises(ValueError, match="transformer.extra_scale"):
        init_weights(model, config)
    with pytest.raises(ValueError, match="init_std"):
        TinyModelConfig(init_std=0.0)
