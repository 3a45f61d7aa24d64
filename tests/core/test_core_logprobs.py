"""Chunked and from-hidden token statistics against the naive full-logits computation."""

from __future__ import annotations

import math

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import gmts


def naive_statistics(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0):
    """The obviously-correct version: full (N, V) float32 log-softmax."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (..., V)
    lp = logp.gather(-1, labels[..., None]).squeeze(-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    onehot = torch.nn.functional.one_hot(labels, logits.shape[-1]).float()
    g = (onehot - p).norm(dim=-1)  # ||d log p_label / d (z / T)||
    return lp, entropy.detach(), g.detach()


def _data(dtype, b=3, t=5, v=37, h=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g).to(dtype)
    weight = (torch.randn(v, h, generator=g) / h**0.5 * 3).to(dtype)
    labels = torch.randint(0, v, (b, t), generator=g)
    upstream = torch.randn(b, t, generator=g)  # arbitrary weights on the log-probs
    return hidden, weight, labels, upstream


TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_chunked_logits_path_matches_naive(dtype, temperature, chunk_size):
    hidden, weight, labels, upstream = _data(dtype)
    logits = (hidden @ weight.T).detach().requires_grad_(True)  # (B, T, V) in dtype
    stats = gmts.token_statistics(
        logits, labels, temperature=temperature, chunk_size=chunk_size, logit_grad_norm=True
    )
    (grad,) = torch.autograd.grad((stats.logprobs * upstream).sum(), logits)

    ref_logits = logits.detach().clone().requires_grad_(True)
    lp, ent, g = naive_statistics(ref_logits, labels, temperature)
    (ref_grad,) = torch.autograd.grad((lp * upstream).sum(), ref_logits)

    for got in (stats.logprobs, stats.entropy, stats.logit_grad_norm):
        assert got.dtype == torch.float32 and got.shape == labels.shape
    # values are computed in float32 from the same inputs: tight even for bf16 input
    torch.testing.assert_close(stats.logprobs, lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.entropy, ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.logit_grad_norm, g, rtol=1e-5, atol=1e-5)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad.float(), ref_grad.float(), **TOL[dtype])
    assert not stats.entropy.requires_grad and not stats.logit_grad_norm.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 1.3])
@pytest.mark.parametrize("chunk_size", [2, None])
def test_from_hidden_matches_naive(dtype, temperature, chunk_size):
    hidden, weight, labels, upstream = _data(dtype)
    h1 = hidden.clone().requires_grad_(True)
    w1 = weight.clone().requires_grad_(True)
    stats = gmts.token_statistics_from_hidden(
        h1, w1, labels, temperature=temperature, chunk_size=chunk_size, logit_grad_norm=True
    )
    gh, gw = torch.autograd.grad((stats.logprobs * upstream).sum(), (h1, w1))

    h2 = hidden.clone().requires_grad_(True)
    w2 = weight.clone().requires_grad_(True)
    lp, ent, g = naive_statistics(h2 @ w2.T, labels, temperature)
    rh, rw = torch.autograd.grad((lp * upstream).sum(), (h2, w2))

    torch.testing.assert_close(stats.logprobs, lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.entropy, ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.logit_grad_norm, g, rtol=1e-5, atol=1e-5)
    assert gh.dtype == dtype and gw.dtype == dtype
    torch.testing.assert_close(gh.float(), rh.float(), **TOL[dtype])
    torch.testing.assert_close(gw.float(), rw.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size", [1, 2, 7, None])
def test_from_hidden_backward_tiles_over_tokens_and_vocabulary(dtype, chunk_size):
    """V above the backward's narrowest vocabulary tile: the gradient is assembled from several
    (tokens x columns) tiles, labels fall in every tile, and the hidden states are a slice."""
    hidden, weight, labels, upstream = _data(dtype, b=3, t=6, v=3000, h=8, seed=4)
    labels[0, :3] = torch.tensor([0, 1023, 2999])  # tile edges
    h1 = hidden.clone().requires_grad_(True)
    w1 = weight.clone().requires_grad_(True)
    stats = gmts.token_statistics_from_hidden(
        h1[:, :-1], w1, labels[:, :-1], temperature=1.3, chunk_size=chunk_size
    )
    gh, gw = torch.autograd.grad((stats.logprobs * upstream[:, :-1]).sum(), (h1, w1))

    h2 = hidden.clone().requires_grad_(True)
    w2 = weight.clone().requires_grad_(True)
    lp, _, _ = naive_statistics(h2[:, :-1] @ w2.T, labels[:, :-1], 1.3)
    rh, rw = torch.autograd.grad((lp * upstream[:, :-1]).sum(), (h2, w2))
    torch.testing.assert_close(stats.logprobs, lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gh.float(), rh.float(), **TOL[dtype])
    torch.testing.assert_close(gw.float(), rw.float(), **TOL[dtype])
    assert not bool(gh[:, -1].any())  # the last position was not used


def test_wrappers_and_gradient_to_weight_only():
    hidden, weight, labels, _ = _data(torch.float32)
    w = weight.clone().requires_grad_(True)
    lp, ent = gmts.token_logprobs_and_entropy_from_hidden(hidden, w, labels, chunk_size=3)
    (gw,) = torch.autograd.grad(lp.sum(), w)
    lp2, ent2 = gmts.token_logprobs_and_entropy(hidden @ weight.T, labels)
    torch.testing.assert_close(lp.detach(), lp2)
    torch.testing.assert_close(ent, ent2)
    assert gw.shape == weight.shape


def test_logit_grad_norm_edge_cases():
    """G = sqrt(1 - 2 p_t + sum p^2): 0 for a certain token, sqrt((V-1)/V) for uniform."""
    v = 10
    logits = torch.zeros(1, 2, v)
    logits[0, 0, 3] = 1e4  # p = one-hot on token 3
    labels = torch.tensor([[3, 4]])
    stats = gmts.token_statistics(logits, labels, logit_grad_norm=True)
    assert stats.logit_grad_norm[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    assert stats.entropy[0, 0].item() == pytest.approx(0.0, abs=1e-6)
    uniform = gmts.token_statistics(torch.zeros(1, 1, v), labels[:, :1], logit_grad_norm=True)
    assert uniform.logit_grad_norm.item() == pytest.approx(((v - 1) / v) ** 0.5, rel=1e-6)
    assert uniform.entropy.item() == pytest.approx(torch.log(torch.tensor(float(v))).item())


def test_bad_inputs():
    hidden, weight, labels, _ = _data(torch.float32)
    logits = hidden @ weight.T
    with pytest.raises(ValueError, match="labels"):
        gmts.token_statistics(logits, labels + 100)
    with pytest.raises(ValueError, match="labels"):
        gmts.token_statistics(logits, labels.float())
    with pytest.raises(ValueError, match="logits"):
        gmts.token_statistics(logits[:, :-1], labels)
    bad = logits.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        gmts.token_statistics(bad, labels)
    bad[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        gmts.token_statistics(bad, labels, chunk_size=2)
    with pytest.raises(ValueError, match="temperature"):
        gmts.token_statistics(logits, labels, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        gmts.token_statistics(logits, labels, chunk_size=0)
    with pytest.raises(ValueError, match="lm_head_weight"):
        gmts.token_statistics_from_hidden(hidden, weight[:, :-1], labels)
    with pytest.raises(ValueError, match="dtype"):
        gmts.token_statistics_from_hidden(hidden, weight.double(), labels)
    with pytest.raises(ValueError, match="hidden"):
        gmts.token_statistics_from_hidden(hidden[:, :-1], weight, labels)


# ---------------------------------------------------------------------------------------------
# memory: count the bytes of the tensors that are alive at once


class PeakTensorMemory(TorchDispatchMode):
    """Tracks the bytes of tensor storages allocated inside the mode and alive at once.

    Storages that exist before entering (inputs, parameters) count zero. Freed storages are
    detected with weak references after each op. This is an exact count of tensor memory on
    any device, including the backward pass (autograd runs CPU backward on this thread).
    """

    def __init__(self, *existing: torch.Tensor) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        for t in existing:
            ref = StorageWeakRef(t.untyped_storage())
            self.live[ref.cdata] = (ref, 0)
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key, (ref, nbytes) in list(self.live.items()):
            if nbytes and ref.expired():
                del self.live[key]
                self.current -= nbytes
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                if ref.cdata not in self.live:
                    self.live[ref.cdata] = (ref, storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for backward during ``fn`` (unique storages)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_paths_use_less_memory(dtype):
    torch.manual_seed(0)
    n, v, h, chunk = 256, 1000, 16, 16
    hidden = torch.randn(1, n, h).to(dtype)
    weight = (torch.randn(v, h) / 4).to(dtype)
    labels = torch.randint(0, v, (1, n))
    logits = (hidden @ weight.T).detach()
    full_fp32 = n * v * 4

    def run_naive(x):
        lp, ent, _ = naive_statistics(x, labels)
        lp.sum().backward()

    def run_chunked(x):
        gmts.token_statistics(x, labels, chunk_size=chunk).logprobs.sum().backward()

    def run_from_hidden(hd, w):
        gmts.token_statistics_from_hidden(hd, w, labels, chunk_size=chunk).logprobs.sum().backward()

    peaks, saved = {}, {}
    x = logits.clone().requires_grad_(True)
    with PeakTensorMemory(x) as m:
        run_naive(x)
    peaks["naive"] = m.peak
    saved["naive"] = _saved_bytes(
        lambda: naive_statistics(logits.clone().requires_grad_(True), labels)
    )

    x = logits.clone().requires_grad_(True)
    with PeakTensorMemory(x) as m:
        run_chunked(x)
    peaks["chunked"] = m.peak
    x = logits.clone().requires_grad_(True)
    saved["chunked"] = _saved_bytes(lambda: gmts.token_statistics(x, labels, chunk_size=chunk))

    hd, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    with PeakTensorMemory(hd, w) as m:
        run_from_hidden(hd, w)
    peaks["from_hidden"] = m.peak
    saved["from_hidden"] = _saved_bytes(
        lambda: gmts.token_statistics_from_hidden(hd, w, labels, chunk_size=chunk)
    )
    grad_bytes = n * v * logits.element_size()  # the logits gradient the chunked path returns
    block = chunk * v * 4
    # naive keeps (N, V) float32 tensors alive; the chunked path only the input's gradient plus
    # a few (chunk, V) blocks; from hidden, neither (N, V) logits nor their gradient exist.
    assert peaks["naive"] >= 2 * full_fp32
    assert peaks["chunked"] <= grad_bytes + 8 * block + 64 * n
    assert peaks["from_hidden"] <= 8 * block + 2 * v * h * 4 + 64 * n
    assert peaks["from_hidden"] < peaks["naive"] / 4
    # saved for backward: naive saves (N, V) log-softmax output; we save O(N) besides inputs
    assert saved["naive"] >= full_fp32
    inputs = logits.numel() * logits.element_size()
    assert saved["chunked"] <= inputs + 64 * n
    assert saved["from_hidden"] <= hidden.numel() * hidden.element_size() + v * h * 2 * 4 + 64 * n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_from_hidden_tiles_stay_within_a_block(dtype):
    """V above the narrowest vocabulary tile: blocks of many tokens cut into column tiles;
    forward and backward together hold a few (chunk, V)-sized tiles beyond the inputs, the
    float32 weight gradient and O(N H) rows, never (N, V)."""
    torch.manual_seed(1)
    n, v, h, chunk = 128, 3000, 16, 4
    hidden = torch.randn(2, n // 2, h).to(dtype).requires_grad_(True)
    weight = (torch.randn(v, h) / 4).to(dtype).requires_grad_(True)
    labels = torch.randint(0, v, (2, n // 2))
    with PeakTensorMemory(hidden, weight) as m:
        stats = gmts.token_statistics_from_hidden(hidden, weight, labels, chunk_size=chunk)
        stats.logprobs.sum().backward()
    tile = chunk * v * 4  # one (chunk, V) float32 block
    assert m.peak <= 4 * tile + v * h * 4 + 64 * n * h
    assert m.peak < n * v * 4 / 2  # below half of one (N, V) float32 tensor


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("position", ["label", "other"])
def test_every_kind_of_non_finite_logit_is_rejected(value, position):
    hidden, weight, labels, _ = _data(torch.float32)
    logits = hidden @ weight.T
    j = int(labels[1, 2]) if position == "label" else (int(labels[1, 2]) + 1) % logits.shape[-1]
    logits[1, 2, j] = value
    with pytest.raises(ValueError, match="finite"):
        gmts.token_statistics(logits, labels, chunk_size=4)
    w = weight.clone()
    w[j, 0] = value  # a non-finite weight gives non-finite logits in every row
    with pytest.raises(ValueError, match="finite"):
        gmts.token_statistics_from_hidden(hidden, w, labels, chunk_size=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_from_hidden_matches_naive(dtype):
    hidden, weight, labels, upstream = _data(dtype, b=4, t=33, v=1000, h=64)
    hidden, weight, labels, upstream = (x.cuda() for x in (hidden, weight, labels, upstream))
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    stats = gmts.token_statistics_from_hidden(h1, w1, labels, chunk_size=16)
    gh, gw = torch.autograd.grad((stats.logprobs * upstream).sum(), (h1, w1))
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    lp, ent, _ = naive_statistics(h2 @ w2.T, labels)
    rh, rw = torch.autograd.grad((lp * upstream).sum(), (h2, w2))
    torch.testing.assert_close(stats.logprobs, lp.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(stats.entropy, ent, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gh.float(), rh.float(), **TOL[dtype])
    torch.testing.assert_close(gw.float(), rw.float(), **TOL[dtype])


@pytest.mark.parametrize("chunk_size", [3, 8, 12, None])
def test_sliced_model_output_is_not_copied_whole(chunk_size):
    """``out.logits[:, :-1]`` is non-contiguous; blocks are views or chunk-sized copies."""
    hidden, weight, labels, upstream = _data(torch.float32, b=6, t=20, v=300)
    full = torch.cat([hidden @ weight.T, torch.randn(6, 1, 300)], dim=1)  # (B, T + 1, V)
    full.requires_grad_(True)
    logits = full[:, :-1]
    assert not logits.is_contiguous()
    with PeakTensorMemory(full) as tracker:
        stats = gmts.token_statistics(logits, labels, chunk_size=chunk_size)
    lp, ent, _ = naive_statistics(logits, labels)
    torch.testing.assert_close(stats.logprobs, lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats.entropy, ent, rtol=1e-5, atol=1e-5)
    (grad,) = torch.autograd.grad((stats.logprobs * upstream).sum(), full)
    (ref_grad,) = torch.autograd.grad((lp * upstream).sum(), full)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    if chunk_size is not None:
        whole = logits.numel() * 4
        assert tracker.peak < whole / 2  # a few (chunk, V) blocks, no copy of the whole input


@pytest.mark.parametrize("shape", [(7,), (2, 3, 4)])
def test_other_label_ranks(shape):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(*shape, 11, generator=g)
    labels = torch.randint(0, 11, shape, generator=g)
    stats = gmts.token_statistics(logits, labels, chunk_size=2, logit_grad_norm=True)
    lp, ent, gn = naive_statistics(logits, labels)
    assert stats.logprobs.shape == shape
    torch.testing.assert_close(stats.logprobs, lp)
    torch.testing.assert_close(stats.entropy, ent)
    torch.testing.assert_close(stats.logit_grad_norm, gn)
    hidden = torch.randn(*shape, 4, generator=g)
    weight = torch.randn(11, 4, generator=g)
    from_h = gmts.token_statistics_from_hidden(hidden, weight, labels, chunk_size=5)
    torch.testing.assert_close(from_h.logprobs, naive_statistics(hidden @ weight.T, labels)[0])


@pytest.mark.parametrize("label_logit", [10.0, 14.0, 18.0])
def test_logit_grad_norm_of_a_confident_token_keeps_its_bounds(label_logit):
    """G = ||e_y - pi|| of a token with p near 1, in float32: within 2% of the float64 value and
    inside its exact bounds [1 - p, sqrt(2) (1 - p)] (the form 1 - 2p + sum p_j^2 cancelled to
    G = 0 at p = 0.99993 on a real model's answer)."""
    from gmts.core.logprobs import token_statistics

    vocab = 1000
    logits = torch.zeros(1, 1, vocab)
    logits[0, 0, 7] = label_logit
    logits[0, 0, :5] = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0])
    labels = torch.tensor([[7]])
    stats = token_statistics(logits, labels, logit_grad_norm=True)
    probs = torch.softmax(logits.double(), -1)[0, 0]
    one_minus_p = 1.0 - probs[7]
    expected = torch.sqrt(one_minus_p**2 + (probs**2).sum() - probs[7] ** 2).item()
    g = stats.logit_grad_norm[0, 0].item()
    p = stats.logprobs[0, 0].exp().item()
    assert g == pytest.approx(expected, rel=0.02)
    assert -math.expm1(stats.logprobs[0, 0].item()) * (1 - 1e-6) <= g
    assert g <= math.sqrt(2) * (1 - p) + 1e-6
