"""gmts.sampling.packed_linear: oneDNN-prepacked linear layers while sampling on a CPU, checked
against the plain ``torch.nn.functional.linear`` and against the unpacked sampler."""

from __future__ import annotations

import pytest
import torch

from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
from gmts.embedded.tokenizer import build_char_tokenizer
from gmts.sampling.packed_linear import can_prepack, prepacked_linears
from gmts.sampling.rollout import generate_rollouts

pytestmark = pytest.mark.skipif(not can_prepack("cpu"), reason="this torch build has no oneDNN")

PROMPTS = ["7=", "12+5=", "123+456=", "99*9="]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _model(tok, arch: str) -> torch.nn.Module:
    small = dict(num_layers=2, hidden_size=64, num_heads=2, max_positions=48)
    return build_tiny_model(tok, TinyModelConfig(architecture=arch, seed=5, **small)).eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (3, 1, 24), (2, 7, 24)])
def test_packed_layer_computes_the_plain_linear(bias, shape):
    """Any leading shape and any number of rows (not only the packing hint's) give
    ``x @ W^T + b`` up to float32 rounding; the plain forward is back afterwards."""
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(*shape, 24, generator=gen)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)
    with torch.no_grad(), prepacked_linears(layer, rows=8) as packed:
        assert packed == 1 and "forward" in vars(layer)
        got = layer(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "forward" not in vars(layer)


def test_what_is_packed_and_restored_on_error(tok):
    """Every plain float32 ``nn.Linear`` of a llama is packed (GPT-2's Conv1D layers are not
    ``nn.Linear``; its output projection is); an error inside the context still restores
    every layer."""
    llama = _model(tok, "llama")
    linears = [m for m in llama.modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    with pytest.raises(RuntimeError, match="boom"), prepacked_linears(llama, rows=4) as packed:
        assert packed == len(linears)
        raise RuntimeError("boom")
    assert not any("forward" in vars(m) for m in linears)
    gpt2 = _model(tok, "gpt2")
    with prepacked_linears(gpt2, rows=4) as packed:
        assert packed == sum(type(m) is torch.nn.Linear for m in gpt2.modules()) >= 1


def test_other_dtypes_and_replaced_forwards_are_left_alone():
    """A bfloat16 layer is not packed, nor one whose forward someone else replaced."""
    half = torch.nn.Linear(8, 8).to(torch.bfloat16)
    with prepacked_linears(half, rows=2) as packed:
        assert packed == 0 and "forward" not in vars(half)
    hooked = torch.nn.Linear(8, 8)
    sentinel = lambda x: x  # noqa: E731
    hooked.forward = sentinel
    with prepacked_linears(hooked, rows=2) as packed:
        assert packed == 0
    assert hooked.forward is sentinel
    with pytest.raises(ValueError, match="rows must be >= 1"), prepacked_linears(hooked, rows=0):
        pass


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_prepacked_sampling_samples_the_unpacked_tokens(tok, arch, temperature):
    """The sampler with prepacked weights draws the tokens the plain path draws for the same
    seed (the logits agree up to rounding), on batches with and without chunking."""
    model = _model(tok, arch)
    for batch_size in (None, 5):
        kwargs = dict(
            num_samples=4, max_new_tokens=16, temperature=temperature, seed=3, batch_size=batch_size
        )
        plain = generate_rollouts(model, tok, PROMPTS, **kwargs)
        packed = generate_rollouts(model, tok, PROMPTS, prepack=True, **kwargs)
        assert torch.equal(packed.response_ids, plain.response_ids)
        assert torch.equal(packed.response_lengths, plain.response_lengths)
    assert not any("forward" in vars(m) for m in model.modules())
