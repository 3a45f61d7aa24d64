"""omega against autograd, losses against hand-written formulas, micro-batching, token sums."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gmts
from gmts.core.objectives import ObjectiveInputs

HORIZON = 7  # seq-mean-token-sum-norm's H in these tests


def _omega(lp, old, adv, ref_logprobs=None, mask=None, **objective):
    """omega of ObjectiveConfig(**objective) (the clipped objective by default)."""
    config = gmts.ObjectiveConfig(**objective)
    return gmts.gradient_coefficient(config, lp, old, adv, mask, ref_logprobs=ref_logprobs)


def token_objective(lp, old, adv, ref_logprobs=None, **objective):
    """The per-token terms of ObjectiveConfig(**objective) on unmasked inputs."""
    inputs = ObjectiveInputs.of(lp, old, adv, ref_logprobs=ref_logprobs)
    return gmts.objective_terms(gmts.ObjectiveConfig(**objective), inputs)


def _batch(seed: int, b: int, t: int, spread: float, per_token_adv: bool, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=dtype) * 3  # log pi_old in (-3, 0]
    lp = old + torch.randn(b, t, generator=g, dtype=dtype) * spread  # ratios around 1
    ref = old + torch.randn(b, t, generator=g, dtype=dtype) * 2 * spread
    shape = (b, t) if per_token_adv else (b,)
    adv = torch.randn(shape, generator=g, dtype=dtype)
    adv = torch.where(torch.rand(shape, generator=g, dtype=dtype) < 0.1, 0.0, adv)  # A = 0 too
    return lp, old, ref, adv


def _reference_objective(lp, old, ref, adv, clip_low, clip_high, dual_clip, kl_coef, corr, clamp):
    """Written like verl/TRL with min/max (gradients agree away from exact ties)."""
    a = adv if adv.dim() == 2 else adv[:, None].expand_as(lp)
    r = torch.exp(lp - old)
    s = torch.min(r * a, torch.clamp(r, 1 - clip_low, 1 + clip_high) * a)
    if dual_clip is not None:
        s = torch.where(a < 0, torch.max(s, dual_clip * a), s)
    d = torch.exp(ref - lp) - (ref - lp) - 1
    if clamp is not None:
        d = torch.clamp(d, min=-clamp, max=clamp)
    if corr:
        d = d * r
    return s - kl_coef * d


options = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**31 - 1),
        "b": st.integers(1, 4),
        "t": st.integers(1, 7),
        "spread": st.sampled_from([0.01, 0.2, 0.6, 1.5]),
        "per_token_adv": st.booleans(),
        "clip_low": st.sampled_from([0.0, 0.1, 0.2, 0.5]),
        "clip_high": st.sampled_from([0.0, 0.2, 0.28, 1.0]),
        "dual_clip": st.sampled_from([None, 1.5, 3.0]),
        "kl_coef": st.sampled_from([0.0, 0.001, 0.1, 1.0]),
        "kl_ratio_correction": st.booleans(),
        "kl_clamp": st.sampled_from([None, 0.5, 10.0]),
    }
)


def _check_close(omega: torch.Tensor, grad: torch.Tensor) -> None:
    err = (omega - grad).abs()
    tol = 1e-6 * grad.abs().clamp_min(1e-6)
    assert bool((err <= tol).all()), f"max abs err {err.max().item()}"


@settings(max_examples=150, deadline=None)
@given(options)
def test_omega_equals_autograd_of_the_reference_objective(o):
    lp, old, ref, adv = _batch(o["seed"], o["b"], o["t"], o["spread"], o["per_token_adv"])
    kw = dict(
        clip_low=o["clip_low"],
        clip_high=o["clip_high"],
        dual_clip=o["dual_clip"],
        kl_coef=o["kl_coef"],
        kl_ratio_correction=o["kl_ratio_correction"],
        kl_clamp=o["kl_clamp"],
    )
    use_ref = ref if o["kl_coef"] > 0 else None
    omega = _omega(lp, old, adv, ref_logprobs=use_ref, **kw)
    assert omega.shape == lp.shape and not omega.requires_grad

    lp_var = lp.clone().requires_grad_(True)
    l_ref = _reference_objective(
        lp_var,
        old,
        ref,
        adv,
        o["clip_low"],
        o["clip_high"],
        o["dual_clip"],
        o["kl_coef"],
        o["kl_ratio_correction"],
        o["kl_clamp"],
    )
    (grad_ref,) = torch.autograd.grad(l_ref.sum(), lp_var)
    _check_close(omega, grad_ref)

    # ... and of our own token objective (torch.where form), which policy_loss differentiates.
    lp_var = lp.clone().requires_grad_(True)
    parts = token_objective(lp_var, old, adv, ref_logprobs=use_ref, **kw)
    s, d = parts.surrogate, parts.kl
    (grad_own,) = torch.autograd.grad((s - o["kl_coef"] * d).sum(), lp_var)
    _check_close(omega, grad_own)
    # the two objectives agree in value
    torch.testing.assert_close(
        (s - o["kl_coef"] * d).detach(), l_ref.detach(), rtol=1e-12, atol=1e-12
    )


def _exact_log(x: float) -> float:
    """A float64 y with torch.exp(y) == x exactly (searching the neighbours of log(x))."""
    y = math.log(x)
    for _ in range(64):
        e = torch.exp(torch.tensor(y, dtype=torch.float64)).item()
        if e == x:
            return y
        y = math.nextafter(y, math.inf if e < x else -math.inf)
    return math.log(x)  # not exactly representable: only used away from the boundaries


@pytest.mark.parametrize(
    "ratio, adv, dual, expected_active",
    [
        (1.28, 1.0, None, True),  # on the upper bound: clamp passes the gradient
        (1.2800001, 1.0, None, False),  # above it with A > 0: clipped
        (0.8, -1.0, None, True),  # on the lower bound
        (0.7999999, -1.0, None, False),
        (5.0, -1.0, None, True),  # A < 0, r large: unclipped without dual clip
        (5.0, -1.0, 2.0, False),  # ... bounded by the dual clip
        (2.0, -1.0, 2.0, True),  # on the dual-clip boundary (strict inequality)
        (0.1, 1.0, None, True),  # A > 0, r small: unclipped
    ],
)
def test_omega_on_the_clip_boundaries(ratio, adv, dual, expected_active):
    old = torch.zeros(1, 1, dtype=torch.float64)
    lp = torch.full((1, 1), _exact_log(ratio), dtype=torch.float64)
    a = torch.tensor([adv], dtype=torch.float64)
    omega = _omega(lp, old, a, clip_low=0.2, clip_high=0.28, dual_clip=dual)
    r = math.exp(lp.item())
    if ratio in (1.28, 0.8, 2.0):
        assert torch.exp(lp).item() == ratio  # really on the boundary
    assert omega.item() == pytest.approx(r * adv if expected_active else 0.0, rel=1e-12)
    lp_var = lp.clone().requires_grad_(True)
    parts = token_objective(lp_var, old, a, clip_low=0.2, clip_high=0.28, dual_clip=dual)
    (grad,) = torch.autograd.grad(parts.surrogate.sum(), lp_var)
    assert bool(parts.clipped.item()) != expected_active
    assert grad.item() == pytest.approx(omega.item(), rel=1e-12, abs=0)


def test_omega_closed_forms():
    """Hand-computed: the digest's omega = r A I + beta rho - beta, and TRL's r log rho form."""
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    old = torch.tensor([[-1.1, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-0.5, -3.0]], dtype=torch.float64)
    adv = torch.tensor([0.5], dtype=torch.float64)
    r = torch.exp(lp - old)
    rho = torch.exp(ref - lp)
    beta = 0.3
    plain = _omega(lp, old, adv, ref_logprobs=ref, kl_coef=beta)
    torch.testing.assert_close(plain, r * 0.5 + beta * rho - beta)
    corrected = _omega(lp, old, adv, ref_logprobs=ref, kl_coef=beta, kl_ratio_correction=True)
    torch.testing.assert_close(corrected, r * 0.5 + beta * r * torch.log(rho))
    # DAPO near on-policy: omega = A
    on = _omega(lp, lp, adv)
    torch.testing.assert_close(on, torch.full_like(lp, 0.5))


# ---------------------------------------------------------------------------------------------
# losses against hand-written reference formulas


def _rows(b=4, t=6, seed=0):
    lp, old, ref, adv = _batch(seed, b, t, 0.3, False)
    g = torch.Generator().manual_seed(seed + 1)
    lengths = [t, 1, t - 2, 3][:b]
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    selected = (torch.rand(b, t, generator=g) < 0.4) & mask
    selected[0, 0] = True
    return lp, old, ref, adv, mask, selected


def _token_l(lp, old, ref, adv, beta, i, t):
    """l_{i,t} of GRPO eq. 1 for one token, from scalars (clip 0.2 / 0.28)."""
    r = math.exp(lp[i, t] - old[i, t])
    a = float(adv[i])
    s = min(r * a, min(max(r, 0.8), 1.28) * a)
    x = float(ref[i, t] - lp[i, t])
    d = math.exp(x) - x - 1
    return s - beta * d, s, d


def _loss(
    lp,
    old,
    adv,
    mask,
    *,
    selected=None,
    ref=None,
    entropy=None,
    denominators=None,
    normalize="selected",
    kl_tokens="selected",
    **objective,
):
    """policy_loss with the objective's fields as keywords (clip 0.2 / 0.28 by default)."""
    config = gmts.LossConfig(
        gmts.ObjectiveConfig(**objective),
        gmts.SelectionConfig(normalize=normalize, kl_tokens=kl_tokens),
        horizon=HORIZON,
    )
    return gmts.policy_loss(
        lp,
        old,
        adv,
        mask,
        config,
        selected=selected,
        ref_logprobs=ref,
        entropy=entropy,
        denominators=denominators,
    )


def test_grpo_eq1_seq_mean_token_mean():
    lp, old, ref, adv, mask, _ = _rows()
    beta = 0.05
    loss, _ = _loss(lp, old, adv, mask, ref=ref, kl_coef=beta, aggregation="seq-mean-token-mean")
    per_seq = []
    for i in range(lp.shape[0]):
        toks = [t for t in range(lp.shape[1]) if mask[i, t]]
        per_seq.append(sum(_token_l(lp, old, ref, adv, beta, i, t)[0] for t in toks) / len(toks))
    expected = -sum(per_seq) / len(per_seq)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_dapo_token_mean():
    lp, old, ref, adv, mask, _ = _rows()
    loss, _ = _loss(lp, old, adv, mask, aggregation="token-mean")
    total, n = 0.0, 0
    for i, t in itertools.product(range(lp.shape[0]), range(lp.shape[1])):
        if mask[i, t]:
            total += _token_l(lp, old, ref, adv, 0.0, i, t)[1]
            n += 1
    assert loss.item() == pytest.approx(-total / n, rel=1e-12)


@pytest.mark.parametrize("aggregation", list(gmts.AGGREGATIONS))
def test_gmts_eq2_selected_mean_with_kl_inside(aggregation):
    """Eq. 2 (1/S sum over the selected tokens of the batch, KL inside l) whatever the
    objective's aggregation: GRPO's seq-mean-token-mean included."""
    lp, old, ref, adv, mask, sel = _rows()
    beta = 0.05
    loss, sums = _loss(
        lp, old, adv, mask, ref=ref, kl_coef=beta, selected=sel, aggregation=aggregation
    )
    terms = [
        _token_l(lp, old, ref, adv, beta, i, t)[0]
        for i, t in itertools.product(range(lp.shape[0]), range(lp.shape[1]))
        if sel[i, t] and mask[i, t]
    ]
    assert loss.item() == pytest.approx(-sum(terms) / len(terms), rel=1e-12)
    assert sums.metrics()["selected_fraction"] == pytest.approx(len(terms) / int(mask.sum()))


def test_grpo_eq2_weighs_every_selected_token_equally():
    """The issue's example: one selected token in one row, nine in another. Under eq. 2 each
    of the ten tokens gets gradient -omega / 10; a per-row mean would give the lone token 9x
    the weight of each of the nine."""
    t = 10
    lp = torch.full((2, t), -1.0, dtype=torch.float64)
    mask = torch.ones(2, t, dtype=torch.bool)
    sel = torch.zeros(2, t, dtype=torch.bool)
    sel[0, 0] = True
    sel[1, :9] = True
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    grpo = gmts.ObjectiveConfig.preset("grpo", kl_coef=0.0)
    paper = gmts.SelectionConfig.preset("paper")
    lp_var = lp.clone().requires_grad_(True)
    loss, _ = gmts.policy_loss(lp_var, lp, adv, mask, gmts.LossConfig.of(grpo, paper), selected=sel)
    (grad,) = torch.autograd.grad(loss, lp_var)
    expected = torch.where(sel, torch.full_like(lp, -0.1), 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=0)


def test_trl_and_reference_code_normalisation():
    """normalize='all', kl_tokens='all': (1/N) sum over valid of (-s * sel + beta * D)."""
    lp, old, ref, adv, mask, sel = _rows()
    beta = 0.05
    loss, _ = _loss(
        lp,
        old,
        adv,
        mask,
        ref=ref,
        kl_coef=beta,
        selected=sel,
        normalize="all",
        kl_tokens="all",
    )
    total, n = 0.0, 0
    for i, t in itertools.product(range(lp.shape[0]), range(lp.shape[1])):
        if mask[i, t]:
            _, s, d = _token_l(lp, old, ref, adv, beta, i, t)
            total += (-s if sel[i, t] else 0.0) + beta * d
            n += 1
    assert loss.item() == pytest.approx(total / n, rel=1e-12)


def test_ets_code_normalisation():
    """normalize='selected', kl_tokens='all': selected-mean policy term + all-token-mean KL."""
    lp, old, ref, adv, mask, sel = _rows()
    beta = 0.05
    loss, _ = _loss(
        lp,
        old,
        adv,
        mask,
        ref=ref,
        kl_coef=beta,
        selected=sel,
        normalize="selected",
        kl_tokens="all",
    )
    pol, kl, n_sel, n = 0.0, 0.0, 0, 0
    for i, t in itertools.product(range(lp.shape[0]), range(lp.shape[1])):
        if mask[i, t]:
            _, s, d = _token_l(lp, old, ref, adv, beta, i, t)
            kl += d
            n += 1
            if sel[i, t]:
                pol -= s
                n_sel += 1
    assert loss.item() == pytest.approx(pol / n_sel + beta * kl / n, rel=1e-12)


def test_reference_code_grpo_mode_seq_mean_normalize_all():
    """Authors' GRPO mode: unselected tokens get A = 0, per-sequence 1/(G |o_i|)."""
    lp, old, ref, adv, mask, sel = _rows()
    loss, _ = _loss(
        lp,
        old,
        adv,
        mask,
        selected=sel,
        aggregation="seq-mean-token-mean",
        normalize="all",
        kl_tokens="all",
    )
    b = lp.shape[0]
    expected = 0.0
    for i in range(b):
        toks = [t for t in range(lp.shape[1]) if mask[i, t]]
        expected -= sum(_token_l(lp, old, ref, adv, 0, i, t)[1] for t in toks if sel[i, t]) / (
            b * len(toks)
        )
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_gradient_is_minus_omega_over_count():
    lp, old, ref, adv, mask, sel = _rows()
    beta = 0.1
    lp_var = lp.clone().requires_grad_(True)
    loss, _ = _loss(
        lp_var,
        old,
        adv,
        mask,
        ref=ref,
        kl_coef=beta,
        selected=sel,
        kl_ratio_correction=True,
        dual_clip=2.0,
    )
    (grad,) = torch.autograd.grad(loss, lp_var)
    omega = _omega(
        lp, old, adv, ref_logprobs=ref, kl_coef=beta, kl_ratio_correction=True, dual_clip=2.0
    )
    expected = torch.where(sel & mask, -omega / int((sel & mask).sum()), 0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("aggregation", list(gmts.AGGREGATIONS))
@pytest.mark.parametrize("normalize", ["selected", "all"])
@pytest.mark.parametrize("kl_tokens", ["selected", "all"])
@pytest.mark.parametrize("with_selection", [True, False])
def test_micro_batches_add_up_to_the_full_loss(aggregation, normalize, kl_tokens, with_selection):
    lp, old, ref, adv, mask, sel = _rows(b=4, t=6, seed=3)
    sel = sel if with_selection else None
    kw = dict(kl_coef=0.1, aggregation=aggregation, normalize=normalize, kl_tokens=kl_tokens)
    lp_full = lp.clone().requires_grad_(True)
    full, full_sums = _loss(lp_full, old, adv, mask, selected=sel, ref=ref, **kw)
    (g_full,) = torch.autograd.grad(full, lp_full)

    config = gmts.LossConfig(
        gmts.ObjectiveConfig(kl_coef=0.1, aggregation=aggregation),
        gmts.SelectionConfig(normalize=normalize, kl_tokens=kl_tokens),
        horizon=HORIZON,
    )
    denominators = config.denominators(gmts.TokenSums.count(mask, sel))
    lp_micro = lp.clone().requires_grad_(True)
    total = 0.0
    sums = None
    for rows in ([0], [1, 2], [3]):
        loss, part = _loss(
            lp_micro[rows],
            old[rows],
            adv[rows],
            mask[rows],
            selected=sel[rows] if sel is not None else None,
            ref=ref[rows],
            denominators=denominators,
            **kw,
        )
        total = total + loss
        sums = part if sums is None else sums + part
    (g_micro,) = torch.autograd.grad(total, lp_micro)
    assert total.item() == pytest.approx(full.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(g_micro, g_full, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(sums.values, full_sums.values)  # sums add over micro-batches


@pytest.mark.parametrize(
    "aggregation, normalize, kl_tokens, with_selection, policy, kl",
    [
        # eq. 2: S for the policy; the KL on every token is a token-mean over N
        ("seq-mean-token-mean", "selected", "selected", True, "S", "S"),
        ("seq-mean-token-mean", "selected", "all", True, "S", "N"),
        ("token-mean", "selected", "all", True, "S", "N"),
        # normalize='all': the objective's own divisor for both terms
        ("token-mean", "all", "all", True, "N", "N"),
        ("seq-mean-token-mean", "all", "selected", True, "R", "R"),
        ("seq-mean-token-sum", "all", "all", True, "R", "R"),
        ("sum", "all", "all", True, 1, 1),
        ("seq-mean-token-sum-norm", "all", "all", True, "RH", "RH"),
        # no selection: normalize and kl_tokens do not matter
        ("seq-mean-token-mean", "selected", "all", False, "R", "R"),
        ("token-mean", "selected", "all", False, "N", "N"),
    ],
)
def test_the_divisor_rule(aggregation, normalize, kl_tokens, with_selection, policy, kl):
    _, _, _, _, mask, sel = _rows()
    rows = int(mask.any(-1).sum())
    counts = {"S": int(sel.sum()), "N": int(mask.sum()), "R": rows, "RH": rows * HORIZON, 1: 1}
    config = gmts.LossConfig(
        gmts.ObjectiveConfig(aggregation=aggregation),
        gmts.SelectionConfig(normalize=normalize, kl_tokens=kl_tokens),
        horizon=HORIZON,
    )
    den = config.denominators(gmts.TokenSums.count(mask, sel if with_selection else None))
    assert (den.policy, den.kl) == (counts[policy], counts[kl])


def test_token_sums_reduce_like_a_concatenated_batch():
    lp, old, ref, adv, mask, sel = _rows()
    halves = (slice(0, 2), slice(2, 4))
    parts = [gmts.TokenSums.count(mask[h], sel[h]) for h in halves]
    whole = gmts.TokenSums.count(mask, sel)
    torch.testing.assert_close((parts[0] + parts[1]).values, whole.values)
    doubled = whole.reduced(lambda v: v * 2)  # a stand-in collective over two equal ranks
    assert doubled["selected_tokens"] == 2 * int(sel.sum())
    assert whole.all_reduce(None)["valid_tokens"] == int(mask.sum())
    with pytest.raises(ValueError, match="with and without a selection"):
        _ = whole + gmts.TokenSums.count(mask)


def test_token_sums_metrics():
    lp, old, ref, adv, mask, sel = _rows()
    entropy = torch.rand(lp.shape, dtype=torch.float64)
    _, sums = _loss(lp, old, adv, mask, ref=ref, kl_coef=0.1, selected=sel, entropy=entropy)
    m = sums.metrics()
    sel = sel & mask
    assert m["entropy_mean"] == pytest.approx(entropy[mask].mean().item())
    assert m["entropy_selected_mean"] == pytest.approx(entropy[sel].mean().item())
    a = adv[:, None].expand_as(lp)
    assert m["positive_advantage_fraction_selected"] == pytest.approx(
        (a[sel] > 0).double().mean().item()
    )
    r = torch.exp(lp - old)
    low, high = (a < 0) & (r < 0.8), (a > 0) & (r > 1.28)
    clipped = low | high
    assert m["clip_fraction"] == pytest.approx(clipped[mask].double().mean().item())
    assert m["clip_low_fraction"] == pytest.approx(low[mask].double().mean().item())
    assert m["clip_high_fraction"] == pytest.approx(high[mask].double().mean().item())
    assert m["clip_fraction_selected"] == pytest.approx(clipped[sel].double().mean().item())
    d = torch.exp(ref - lp) - (ref - lp) - 1
    assert m["kl_mean"] == pytest.approx(d[mask].mean().item())
    assert all(isinstance(v, float) for v in m.values())
    counts_only = gmts.TokenSums.count(mask, sel).metrics()
    assert set(counts_only) == {"selected_fraction"}  # nothing unmeasured is reported


def test_all_masked_batch_gives_zero_loss_and_nan_means():
    lp, old, ref, adv, mask, _ = _rows()
    lp_var = lp.clone().requires_grad_(True)
    none = torch.zeros_like(mask)
    loss, sums = _loss(lp_var, old, adv, none)
    loss.backward()
    assert loss.item() == 0.0 and bool((lp_var.grad == 0).all())
    m = sums.metrics()
    assert math.isnan(m["selected_fraction"]) and math.isnan(m["clip_fraction"])


def test_objective_config_presets_and_validation():
    grpo = gmts.ObjectiveConfig.preset("grpo")
    assert grpo.aggregation == "seq-mean-token-mean" and grpo.kl_coef > 0
    dapo = gmts.ObjectiveConfig.preset("dapo", clip_high=0.3)
    assert dapo.aggregation == "token-mean" and dapo.kl_coef == 0 and dapo.clip_high == 0.3
    for f in gmts.ObjectiveConfig.__dataclass_fields__.values():
        assert f.metadata.get("help"), f.name
    for f in gmts.LossConfig.__dataclass_fields__.values():
        assert f.metadata.get("help"), f.name
    with pytest.raises(ValueError, match="preset"):
        gmts.ObjectiveConfig.preset("ppo")
    with pytest.raises(ValueError, match="aggregation"):
        gmts.ObjectiveConfig(aggregation="mean")
    with pytest.raises(ValueError, match="dual_clip"):
        gmts.ObjectiveConfig(dual_clip=0.9)
    with pytest.raises(ValueError, match="clip_low"):
        gmts.ObjectiveConfig(clip_low=-0.1)
    with pytest.raises(ValueError, match="unknown ObjectiveConfig fields"):
        gmts.ObjectiveConfig.preset("grpo", beta=1.0)
    with pytest.raises(ValueError, match="normalize"):
        gmts.LossConfig(selection=gmts.SelectionConfig(normalize="none"))
    with pytest.raises(ValueError, match="kl_tokens"):
        gmts.LossConfig(selection=gmts.SelectionConfig(kl_tokens="none"))
    with pytest.raises(ValueError, match="objective"):
        gmts.LossConfig(objective={"kl_coef": 0.1})
    with pytest.raises(ValueError, match="selection must be a SelectionConfig"):
        gmts.LossConfig(gmts.ObjectiveConfig(), "all")  # normalize's old place


def test_old_loss_keywords_still_work_and_name_the_new_place():
    """normalize and kl_tokens belong to SelectionConfig; LossConfig(normalize=...) of older
    versions still builds the same loss, with a DeprecationWarning naming the new spelling."""
    objective = gmts.ObjectiveConfig(kl_coef=0.1)
    with pytest.warns(DeprecationWarning, match=r"SelectionConfig\(normalize='all'"):
        old = gmts.LossConfig(objective, normalize="all")
    assert old == gmts.LossConfig(objective, gmts.SelectionConfig(normalize="all"))
    assert (old.normalize, old.kl_tokens) == ("all", "selected")  # read from the selection
    with pytest.warns(DeprecationWarning, match="kl_tokens belongs to SelectionConfig"):
        old = gmts.LossConfig(objective, kl_tokens="all", horizon=3)
    assert old.selection.kl_tokens == "all" and old.horizon == 3


def test_aggregation_registry():
    assert gmts.AGGREGATIONS == (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "sum",
    )
    assert gmts.get_aggregation("seq-mean-token-mean").divisor == "rows"
    mask = torch.tensor([[True, True, False], [True, False, False]])
    weights = gmts.get_aggregation("seq-mean-token-mean").token_weights(mask)
    torch.testing.assert_close(weights, torch.tensor([[0.5, 0.5, 0], [1, 0, 0]]).double())
    with pytest.raises(ValueError, match="valid aggregations: seq-mean-token-mean"):
        gmts.get_aggregation("mean")
    with pytest.raises(ValueError, match="already registered"):
        gmts.register_aggregation(gmts.get_aggregation("sum"))


def test_bad_inputs_name_the_argument():
    lp, old, ref, adv, mask, sel = _rows()
    with pytest.raises(ValueError, match="old_logprobs"):
        _omega(lp, old[:, :-1], adv)
    with pytest.raises(ValueError, match="advantages"):
        _omega(lp, old, adv[:-1])
    with pytest.raises(ValueError, match="ref_logprobs"):
        _omega(lp, old, adv, kl_coef=0.1)
    with pytest.raises(ValueError, match="mask"):
        gmts.policy_loss(lp, old, adv, mask[:, :-1])
    with pytest.raises(ValueError, match="selected"):
        gmts.policy_loss(lp, old, adv, mask, selected=sel[:-1])
    with pytest.raises(ValueError, match="old_logprobs"):
        gmts.policy_loss(lp, old[:, :-1], adv, mask)
    with pytest.raises(ValueError, match="ref_logprobs"):
        _loss(lp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="config must be a LossConfig"):
        gmts.policy_loss(lp, old, adv, mask, gmts.ObjectiveConfig())
    with pytest.raises(ValueError, match="denominators.policy"):
        gmts.LossDenominators(policy=0.0, kl=1.0)
    with pytest.raises(ValueError, match="denominators must be LossDenominators"):
        gmts.policy_loss(lp, old, adv, mask, denominators=3.0)


def _loop_loss(lp, old, ref, adv, mask, sel, beta, aggregation, normalize, kl_tokens):
    """docs/semantics.md section 5, written as plain loops over rows and tokens."""
    b, t = lp.shape
    s = [[_token_l(lp, old, ref, adv, beta, i, j)[1] for j in range(t)] for i in range(b)]
    d = [[_token_l(lp, old, ref, adv, beta, i, j)[2] for j in range(t)] for i in range(b)]
    valid = [[bool(mask[i, j]) for j in range(t)] for i in range(b)]
    carries = [
        [valid[i][j] and (sel is None or bool(sel[i, j])) for j in range(t)] for i in range(b)
    ]
    lengths = [sum(row) for row in valid]
    n_valid = sum(lengths)
    n_sel = sum(sum(row) for row in carries)
    rows = sum(1 for n in lengths if n > 0)

    def term(x, where):
        """Aggregate x over the tokens in ``where``."""
        if sel is not None and normalize == "selected":  # eq. 2: token-mean
            total = sum(x[i][j] for i in range(b) for j in range(t) if where[i][j])
            return total / max(n_sel if where is carries else n_valid, 1)
        sums = [sum(x[i][j] for j in range(t) if where[i][j]) for i in range(b)]
        if aggregation == "token-mean":
            return sum(sums) / max(n_valid, 1)
        if aggregation == "seq-mean-token-mean":
            return sum(r / max(n, 1) for r, n in zip(sums, lengths)) / max(rows, 1)
        if aggregation == "seq-mean-token-sum":
            return sum(sums) / max(rows, 1)
        if aggregation == "seq-mean-token-sum-norm":
            return sum(sums) / (max(rows, 1) * HORIZON)
        return sum(sums)

    loss = term([[-v for v in row] for row in s], carries)
    return loss + beta * term(d, carries if kl_tokens == "selected" else valid)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    aggregation=st.sampled_from(list(gmts.AGGREGATIONS)),
    normalize=st.sampled_from(["selected", "all"]),
    kl_tokens=st.sampled_from(["selected", "all"]),
    with_selection=st.booleans(),
    beta=st.sampled_from([0.0, 0.05]),
)
def test_policy_loss_equals_the_loop_reference(
    seed, aggregation, normalize, kl_tokens, with_selection, beta
):
    lp, old, ref, adv, mask, sel = _rows(seed=seed)
    sel = sel if with_selection else None
    loss, _ = _loss(
        lp,
        old,
        adv,
        mask,
        ref=ref,
        kl_coef=beta,
        selected=sel,
        aggregation=aggregation,
        normalize=normalize,
        kl_tokens=kl_tokens,
    )
    expected = _loop_loss(lp, old, ref, adv, mask, sel, beta, aggregation, normalize, kl_tokens)
    assert loss.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -float("inf"), 500.0])
def test_garbage_at_padding_never_reaches_loss_or_gradients(garbage):
    lp, old, ref, adv, mask, sel = _rows()
    kw = dict(kl_coef=0.1, kl_ratio_correction=True, selected=sel, kl_tokens="all")
    clean_lp = lp.clone().requires_grad_(True)
    clean, clean_sums = _loss(clean_lp, old, adv, mask, ref=ref, **kw)
    clean.backward()
    pad = ~mask
    dirty_lp = torch.where(pad, garbage, lp).requires_grad_(True)
    dirty_old = torch.where(pad, -garbage, old)
    dirty_ref = torch.where(pad, garbage, ref)
    dirty, sums = _loss(dirty_lp, dirty_old, adv, mask, ref=dirty_ref, **kw)
    dirty.backward()
    assert dirty.item() == clean.item()
    assert torch.equal(dirty_lp.grad, clean_lp.grad)
    assert bool((dirty_lp.grad[pad] == 0).all())
    assert torch.equal(sums.values, clean_sums.values)
