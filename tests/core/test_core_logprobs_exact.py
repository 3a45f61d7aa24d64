"""The tiled log-prob kernels against autograd of the naive full log-softmax, in float64.

Forward values (log-probs, entropy, logit-gradient norm) and the gradients to the hidden
states and to the LM-head weight, with blocks that cut rows, several vocabulary tiles per
block, several token blocks per weight gradient, temperature != 1, and float32 / bf16 inputs
against the float64 reference of the same (rounded) numbers.
"""

from __future__ import annotations

import pytest
import torch

import gmts


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def naive_reference(hidden, weight, labels, temperature, upstream):
    """Autograd of the full (B, T, V) log-softmax in the inputs' dtype upcast to float64:
    (logprobs, entropy, G, d/d hidden, d/d weight) of sum(upstream * logprobs)."""
    h = hidden.detach().double().requires_grad_(True)
    w = weight.detach().double().requires_grad_(True)
    logp = torch.log_softmax((h @ w.T) / temperature, dim=-1)  # (B, T, V)
    lp = logp.gather(-1, labels[..., None]).squeeze(-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    onehot = torch.nn.functional.one_hot(labels, weight.shape[0]).double()
    g = (onehot - p).norm(dim=-1)
    gh, gw = torch.autograd.grad((lp * upstream.double()).sum(), (h, w))
    return lp.detach(), entropy.detach(), g.detach(), gh, gw


def _data(b, t, v, h, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) / h**0.5 * 3
    labels = torch.randint(0, v, (b, t), generator=g)
    labels[0, :3] = torch.tensor([0, min(v - 1, 1023), v - 1])  # tile edges
    upstream = torch.randn(b, t, generator=g, dtype=torch.float64)
    return hidden.to(dtype), weight.to(dtype), labels, upstream


# (V, chunk_size): V < 1024 (one tile per block, blocks of `chunk` tokens); V = 3000 with
# chunk 1 (blocks of 2 positions cut the rows of 7, three column tiles of 1024, 1024, 952) and
# chunk 5 (two rows a block, tiles of 1071 columns); the default (one block, one tile).
LAYOUTS = [(700, 3), (3000, 1), (3000, 5), (3000, None)]


@pytest.mark.parametrize(("vocab", "chunk_size"), LAYOUTS)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_from_hidden_float64_equals_autograd_of_naive(vocab, chunk_size, temperature):
    hidden, weight, labels, upstream = _data(3, 7, vocab, 16, seed=vocab + (chunk_size or 0))
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    stats = gmts.token_statistics_from_hidden(
        h, w, labels, temperature=temperature, chunk_size=chunk_size, logit_grad_norm=True
    )
    gh, gw = torch.autograd.grad((stats.logprobs * upstream).sum(), (h, w))
    lp, ent, g, rh, rw = naive_reference(hidden, weight, labels, temperature, upstream)
    assert stats.logprobs.dtype == torch.float64 and gh.dtype == gw.dtype == torch.float64
    for got, want in [(stats.logprobs, lp), (stats.entropy, ent), (stats.logit_grad_norm, g)]:
        assert _relative(got, want) < 1e-12
    assert _relative(gh, rh) < 1e-12
    assert _relative(gw, rw) < 1e-12


@pytest.mark.parametrize(("vocab", "chunk_size"), LAYOUTS)
def test_logits_path_float64_equals_autograd_of_naive(vocab, chunk_size):
    hidden, weight, labels, upstream = _data(3, 7, vocab, 16, seed=1)
    logits = (hidden @ weight.T).requires_grad_(True)  # (B, T, V) float64
    stats = gmts.token_statistics(
        logits, labels, temperature=0.6, chunk_size=chunk_size, logit_grad_norm=True
    )
    (grad,) = torch.autograd.grad((stats.logprobs * upstream).sum(), logits)
    ref = logits.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(ref / 0.6, dim=-1)
    lp = logp.gather(-1, labels[..., None]).squeeze(-1)
    (ref_grad,) = torch.autograd.grad((lp * upstream).sum(), ref)
    entropy = -(logp.exp() * logp).sum(-1)
    assert _relative(stats.logprobs, lp) < 1e-12
    assert _relative(stats.entropy, entropy) < 1e-12
    assert _relative(grad, ref_grad) < 1e-12


@pytest.mark.parametrize("need", ["hidden", "weight"])
def test_from_hidden_gradient_to_one_input_only(need):
    hidden, weight, labels, upstream = _data(2, 9, 3000, 8, seed=3)
    h = hidden.clone().requires_grad_(need == "hidden")
    w = weight.clone().requires_grad_(need == "weight")
    stats = gmts.token_statistics_from_hidden(h, w, labels, temperature=1.3, chunk_size=2)
    (grad,) = torch.autograd.grad((stats.logprobs * upstream).sum(), h if need == "hidden" else w)
    _, _, _, rh, rw = naive_reference(hidden, weight, labels, 1.3, upstream)
    assert _relative(grad, rh if need == "hidden" else rw) < 1e-12


@pytest.mark.parametrize(("vocab", "chunk_size"), LAYOUTS)
def test_from_hidden_float32_against_float64_reference(vocab, chunk_size):
    """float32 in, float32 reductions: within float32 rounding of the exact values."""
    hidden, weight, labels, upstream = _data(3, 7, vocab, 16, seed=5, dtype=torch.float32)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    stats = gmts.token_statistics_from_hidden(
        h, w, labels, temperature=0.6, chunk_size=chunk_size, logit_grad_norm=True
    )
    gh, gw = torch.autograd.grad((stats.logprobs * upstream.float()).sum(), (h, w))
    lp, ent, g, rh, rw = naive_reference(hidden, weight, labels, 0.6, upstream)
    assert stats.logprobs.dtype == torch.float32 and gh.dtype == gw.dtype == torch.float32
    for got, want in [(stats.logprobs, lp), (stats.entropy, ent), (stats.logit_grad_norm, g)]:
        assert _relative(got, want) < 1e-5
    assert _relative(gh, rh) < 1e-5
    assert _relative(gw, rw) < 1e-5


@pytest.mark.parametrize(("vocab", "chunk_size"), LAYOUTS)
def test_from_hidden_bf16_against_float64_reference(vocab, chunk_size):
    """bf16 in: matmuls in bf16 (the logits are rounded to bf16, as the model's lm_head
    returns them), reductions in float32. Values are exact for those rounded logits; the
    gradients carry bf16 rounding, like autograd of the naive bf16 path."""
    hidden, weight, labels, upstream = _data(3, 7, vocab, 16, seed=7, dtype=torch.bfloat16)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    stats = gmts.token_statistics_from_hidden(
        h, w, labels, temperature=0.6, chunk_size=chunk_size, logit_grad_norm=True
    )
    gh, gw = torch.autograd.grad((stats.logprobs * upstream.float()).sum(), (h, w))
    assert stats.logprobs.dtype == torch.float32 and gh.dtype == gw.dtype == torch.bfloat16
    rounded_logits = (hidden @ weight.T).double() / 0.6  # (B, T, V) bf16 logits, exactly
    logp = torch.log_softmax(rounded_logits, dim=-1)
    lp = logp.gather(-1, labels[..., None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert _relative(stats.logprobs, lp) < 1e-5
    assert _relative(stats.entropy, entropy) < 1e-5
    _, _, _, rh, rw = naive_reference(hidden, weight, labels, 0.6, upstream)
    # naive autograd in bf16 rounds the logit gradient and both products to bf16 as well
    naive_h, naive_w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    naive_logp = torch.log_softmax((naive_h @ naive_w.T).float() / 0.6, dim=-1)
    naive_lp = naive_logp.gather(-1, labels[..., None]).squeeze(-1)
    nh, nw = torch.autograd.grad((naive_lp * upstream.float()).sum(), (naive_h, naive_w))
    assert _relative(gh, rh) < 2 * max(_relative(nh, rh), 2**-8)
    assert _relative(gw, rw) < 2 * max(_relative(nw, rw), 2**-8)


def test_entropy_of_large_logits_has_no_cancellation():
    """Logits around 1e3, peaked softmax: the entropy's error is float32 rounding of numbers of
    order 1 (about 1e-7), not of the logits' magnitude (ulp(1e3) = 6e-5, what
    ``-sum p (z - lse)`` with ``lse ~ 1e3`` would give)."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(4, 6, 3000, generator=g, dtype=torch.float64) * 3
    logits[..., 5] += 30.0  # peaked: the entropy is small
    logits = (logits + 1000.0).float()  # (B, T, V) float32 input
    labels = torch.full((4, 6), 5)
    ref = torch.log_softmax(logits.double(), dim=-1)
    entropy = -(ref.exp() * ref).sum(-1)
    assert float(entropy.max()) < 1e-2
    stats = gmts.token_statistics(logits, labels, chunk_size=2)
    torch.testing.assert_close(stats.entropy.double(), entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(stats.logprobs.double(), ref[..., 5], rtol=0, atol=1e-6)
    # the same logits as hidden @ weight with an identity weight: tiled over the vocabulary
    tiled = gmts.token_statistics_from_hidden(logits, torch.eye(3000), labels, chunk_size=1)
    torch.testing.assert_close(tiled.entropy.double(), entropy, rtol=0, atol=1e-6)
    torch.testing.assert_close(tiled.logprobs.double(), ref[..., 5], rtol=0, atol=1e-6)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_logit_in_a_later_tile_is_rejected(value):
    hidden, weight, labels, _ = _data(2, 5, 3000, 8, seed=9, dtype=torch.float32)
    weight[2500, 0] = value  # column 2500: the third tile of 1024 columns
    with pytest.raises(ValueError, match="finite"):
        gmts.token_statistics_from_hidden(hidden, weight, labels, chunk_size=1)


def test_no_tokens():
    weight = torch.randn(3000, 8, requires_grad=True)
    hidden = torch.randn(0, 8, requires_grad=True)
    stats = gmts.token_statistics_from_hidden(hidden, weight, torch.zeros(0, dtype=torch.long))
    assert stats.logprobs.shape == (0,)
    (gw,) = torch.autograd.grad(stats.logprobs.sum(), weight)
    assert gw.shape == weight.shape and not bool(gw.any())


def test_gradient_of_a_confident_token_with_large_logits():
    """1 - p(label) = 3e-4 at logits near 1e3, float32. The logit gradient is small, and its
    precision hangs on how p is formed: here e^(z - M) / S, no worse than float32 autograd of
    the naive log-softmax (1.1e-2 relative here); from z - lse, with lse ~ 1e3 carrying
    ulp(1e3) = 6e-5 into every p, it was 0.15."""
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(3, 4, 3000, generator=g, dtype=torch.float64) * 2
    logits[..., 7] += 22.0
    logits = (logits + 1000.0).float().requires_grad_(True)  # (B, T, V)
    labels = torch.full((3, 4), 7)
    upstream = torch.randn(3, 4, generator=g)
    ref = logits.detach().double().requires_grad_(True)
    lp = torch.log_softmax(ref, dim=-1)[..., 7]
    (ref_grad,) = torch.autograd.grad((lp * upstream.double()).sum(), ref)
    naive = logits.detach().clone().requires_grad_(True)
    naive_lp = torch.log_softmax(naive, dim=-1)[..., 7]
    (naive_grad,) = torch.autograd.grad((naive_lp * upstream).sum(), naive)
    bound = min(3e-3, _relative(naive_grad, ref_grad))
    stats = gmts.token_statistics(logits, labels, chunk_size=2)
    (grad,) = torch.autograd.grad((stats.logprobs * upstream).sum(), logits)
    assert _relative(grad, ref_grad) < bound
    hidden = logits.detach().clone().requires_grad_(True)
    tiled = gmts.token_statistics_from_hidden(hidden, torch.eye(3000), labels, chunk_size=1)
    (grad,) = torch.autograd.grad((tiled.logprobs * upstream).sum(), hidden)
    assert _relative(grad, ref_grad) < bound
