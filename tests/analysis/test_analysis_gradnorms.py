"""The batched per-token gradient norms against a plain loop of one backward pass per token."""

from __future__ import annotations

import pytest
import torch

from gmts.analysis.gradnorms import (
    batched_grad_norms,
    loop_grad_norms,
    token_gradient_norms,
    trainable_parameters,
    unpadded_row,
)

transformers = pytest.importorskip("transformers")


def tiny_lm(seed: int, attn: str = "sdpa", tied: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=23,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def padded_batch(seed: int, prompt_lens, resp_lens, vocab: int = 23):
    """Left-padded prompts then right-padded responses, as a rollout lays them out."""
    g = torch.Generator().manual_seed(seed)
    B, P, T = len(prompt_lens), max(prompt_lens), max(resp_lens)
    ids = torch.zeros(B, P + T, dtype=torch.long)
    attn = torch.zeros(B, P + T, dtype=torch.long)
    resp = torch.zeros(B, T, dtype=torch.bool)
    for b, (p, t) in enumerate(zip(prompt_lens, resp_lens)):
        ids[b, P - p : P + t] = torch.randint(1, vocab, (p + t,), generator=g)
        attn[b, P - p : P + t] = 1
        resp[b, :t] = True
    return ids, attn, resp


def assert_rel_close(fast: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> None:
    assert fast.shape == ref.shape
    err = ((fast.double() - ref.double()).abs() / ref.double().abs().clamp_min(1e-12)).max()
    assert err <= rel, f"max relative error {err:.3e} > {rel}"


@pytest.mark.parametrize(
    ("seed", "attn", "chunk"), [(0, "sdpa", None), (1, "eager", 3), (2, "sdpa", 1)]
)
def test_batched_equals_per_token_backward_loop(seed, attn, chunk):
    model = tiny_lm(seed, attn)
    ids, attn_mask, resp = padded_batch(seed, prompt_lens=[3, 5, 1], resp_lens=[6, 2, 7])
    fast = token_gradient_norms(model, ids, attn_mask, resp, chunk_size=chunk)
    ref = token_gradient_norms(model, ids, attn_mask, resp, method="loop")
    assert torch.all(fast[~resp] == 0)
    assert torch.all(ref[resp] > 0)
    assert_rel_close(fast[resp], ref[resp])


def test_loop_reference_is_a_per_token_backward_of_each_logprob():
    """The reference itself: token t's norm from a fresh forward + backward of log pi(o_t) alone."""
    model = tiny_lm(3, tied=False)
    params = trainable_parameters(model)
    ids = torch.tensor([5, 2, 9, 4, 4, 11])
    n = 3

    def logprob(t: int) -> torch.Tensor:
        logits = model(input_ids=ids[None]).logits[0].float()
        pos = ids.numel() - n + t
        return torch.log_softmax(logits[pos - 1], -1)[ids[pos]]

    expected = []
    for t in range(n):
        model.zero_grad()
        logprob(t).backward()
        expected.append(sum(p.grad.double().pow(2).sum() for p in params if p.grad is not None))
    expected = torch.stack(expected).sqrt().float()
    ids_b, attn_b = ids[None], torch.ones(1, ids.numel(), dtype=torch.long)
    resp = torch.ones(1, n, dtype=torch.bool)
    got = token_gradient_norms(model, ids_b, attn_b, resp, method="loop")[0]
    assert_rel_close(got, expected)
    assert_rel_close(token_gradient_norms(model, ids_b, attn_b, resp)[0], expected)


def test_hand_computed_linear_case():
    """outputs = W x: d outputs[n] / dW = e_n x^T, so every norm is ||x||; bias adds 1."""
    W = torch.randn(4, 3, requires_grad=True)
    bias = torch.randn(4, requires_grad=True)
    x = torch.tensor([3.0, 0.0, 4.0])
    out = W @ x + bias
    norms = batched_grad_norms(out, [W, bias], chunk_size=3)
    assert torch.allclose(norms, torch.full((4,), (25.0 + 1.0) ** 0.5))
    unused = torch.randn(2, requires_grad=True)  # a parameter the outputs ignore adds nothing
    out = W @ x
    assert torch.allclose(loop_grad_norms(out, [W, unused]), torch.full((4,), 5.0))


def test_padding_does_not_change_the_norms():
    model = tiny_lm(4)
    ids, attn_mask, resp = padded_batch(7, prompt_lens=[2, 4], resp_lens=[3, 5])
    both = token_gradient_norms(model, ids, attn_mask, resp)
    # row 0 alone, without any padding
    row_ids, n = unpadded_row(ids[0], attn_mask[0], resp[0])
    alone = token_gradient_norms(
        model,
        row_ids[None],
        torch.ones(1, row_ids.numel(), dtype=torch.long),
        torch.ones(1, n, dtype=torch.bool),
    )
    assert_rel_close(both[0, :n], alone[0])


def test_token_objective_gradient_is_omega_times_logprob_gradient():
    """||grad l_t|| == |omega_t| * ||grad log pi(o_t)||, with clipping AND the k3 KL term.

    l_t depends on theta only through log pi(o_t), so the identity is exact; here it is checked
    against autograd of l_t itself, one backward pass per token.
    """
    model = tiny_lm(5)
    params = trainable_parameters(model)
    ids = torch.tensor([3, 7, 1, 8, 2, 6, 6, 9, 4])
    n, clip_low, clip_high, beta = 6, 0.2, 0.28, 0.3
    logits = model(input_ids=ids[None]).logits[0, -n - 1 : -1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[-n:, None])[:, 0]  # (n,)
    lp = logprobs.detach()
    # old log-probs chosen so that some ratios fall outside the clip range in each direction
    old = lp + torch.tensor([0.0, 0.5, -0.5, 0.1, -0.4, 0.6])
    ref = lp + torch.tensor([0.3, -0.2, 0.0, 0.5, 0.1, -0.3])
    adv = torch.tensor([1.0, 1.0, -1.0, -0.5, 2.0, -1.5])

    ratio = torch.exp(logprobs - old)
    pg = torch.minimum(ratio * adv, ratio.clamp(1 - clip_low, 1 + clip_high) * adv)
    kl = torch.exp(ref - logprobs) - (ref - logprobs) - 1
    token_objective = pg - beta * kl  # (n,)

    r = ratio.detach()
    active = ~(((adv > 0) & (r > 1 + clip_high)) | ((adv < 0) & (r < 1 - clip_low)))
    omega = r * adv * active + beta * torch.exp(ref - lp) - beta
    assert (~active).sum() >= 2, "the case should include clipped tokens"

    objective_norms = loop_grad_norms(token_objective, params, retain_graph=True)
    logprob_norms = batched_grad_norms(logprobs, params)
    assert_rel_close(objective_norms, omega.abs() * logprob_norms)


def test_core_gradient_coefficient_matches_the_token_objective():
    core = pytest.importorskip("gmts.core")
    if not hasattr(core, "gradient_coefficient"):
        pytest.skip("gmts.core.gradient_coefficient has not landed yet")
    lp = torch.tensor([[-0.1, -2.0, -0.7, -1.2]])
    old = lp + torch.tensor([[0.0, 0.5, -0.5, 0.1]])
    ref = lp + torch.tensor([[0.3, -0.2, 0.0, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -2.0]])
    x = lp.clone().requires_grad_(True)
    ratio = torch.exp(x - old)
    pg = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    kl = torch.exp(ref - x) - (ref - x) - 1
    (pg - 0.1 * kl).sum().backward()
    objective = core.ObjectiveConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.1)
    omega = core.gradient_coefficient(objective, lp, old, adv, ref_logprobs=ref)
    assert torch.allclose(omega, x.grad, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
    p = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="outputs"):
        batched_grad_norms(p[None] * 2, [p])
    with pytest.raises(ValueError, match="chunk_size"):
        batched_grad_norms(p * 2, [p], chunk_size=0)
    with pytest.raises(ValueError, match="outputs"):
        batched_grad_norms(p.detach() * 2, [p])
    assert batched_grad_norms((p * 2)[:0], [p]).shape == (0,)
    with pytest.raises(ValueError, match="response_mask"):
        unpadded_row(torch.arange(5), torch.ones(5), torch.tensor([True, False, True]))
    model = tiny_lm(0)
    ids, attn_mask, resp = padded_batch(0, [2], [2])
    with pytest.raises(ValueError, match="method"):
        token_gradient_norms(model, ids, attn_mask, resp, method="vmap")


def test_auto_falls_back_to_the_loop_when_backward_cannot_be_vmapped(unvmappable):
    model = unvmappable(tiny_lm(6))
    ids, attn_mask, resp = padded_batch(1, prompt_lens=[2, 3], resp_lens=[3, 2])
    with pytest.raises(RuntimeError):
        token_gradient_norms(model, ids, attn_mask, resp, method="batched")
    with pytest.warns(RuntimeWarning, match="falling back"):
        auto = token_gradient_norms(model, ids, attn_mask, resp, method="auto")
    ref = token_gradient_norms(model.inner, ids, attn_mask, resp, method="loop")
    assert_rel_close(auto[resp], ref[resp])
