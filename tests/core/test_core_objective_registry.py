"""Every registered objective: omega against autograd of an independent reference written from
the engines' own formulas (verl 0.9.1 core_algos, TRL 1.16 GRPOTrainer._compute_loss), the
analytic closed forms against the generic autograd omega, the loss gradient under a selection,
and the plug-in path for an objective we have never seen.

The references below are written like the engines write them (min/max, clamp, detach), not
like the core (torch.where on clip masks): agreement is evidence, not a tautology.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

import gmts
from gmts.core.objectives import ObjectiveConfig, ObjectiveInputs, gradient_coefficient

from file_modules import load_module

F64 = torch.float64


def _batch(seed: int, spread: float = 0.4, b: int = 6, t: int = 8):
    """Unequal rows (one empty), ratios around 1 (some clipped), A of both signs and 0."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i, n in enumerate([t, 5, 1, 3, t - 1, 0][:b]):
        mask[i, :n] = True
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2.5 - 0.05
    lp = (old + torch.randn(b, t, generator=g, dtype=F64) * spread).clamp(max=-1e-3)
    ref = (old + torch.randn(b, t, generator=g, dtype=F64) * spread).clamp(max=-1e-3)
    adv = torch.randn(b, generator=g, dtype=F64)
    adv[1] = 0.0
    weights = torch.rand(b, t, generator=g, dtype=F64) * 1.5 + 0.1
    return lp, old, ref, adv, mask, weights


_refs = load_module(  # a helper module of tests/conformance (tests are not a package)
    Path(__file__).resolve().parents[1] / "conformance" / "_references.py",
    "_references",
    register=True,
    reuse=True,
)
ref_ppo_token, ref_ppo_trl, ref_gspo_token_verl = (
    _refs.ref_ppo_token,
    _refs.ref_ppo_trl,
    _refs.ref_gspo_token_verl,
)
ref_sapo, ref_cispo, ref_cispo_trl, ref_gmpo = (
    _refs.ref_sapo,
    _refs.ref_cispo,
    _refs.ref_cispo_trl,
    _refs.ref_gmpo,
)
ref_gpg, ref_dppo, ref_dro, ref_vespo, ref_kl = (
    _refs.ref_gpg,
    _refs.ref_dppo,
    _refs.ref_dro,
    _refs.ref_vespo,
    _refs.ref_kl,
)
ref_clip_cov, ref_kl_cov = _refs.ref_clip_cov, _refs.ref_kl_cov
# the covariance picks of these batches: a band and ratios that pick some tokens, not all
CLIP_COV = dict(clip_low=0.2, clip_high=0.28, clip_cov_ratio=0.3, clip_cov_lb=-0.2, clip_cov_ub=0.6)
KL_COV = dict(kl_cov_ratio=0.25, kl_cov_coef=0.7)


# (objective config kwargs, reference fn(lp, old, a, mask, w) -> l, uses weights as multiplier)
CASES = {
    "ppo-token-verl": (
        dict(name="ppo", dual_clip=3.0, log_ratio_min=-20.0, log_ratio_max=20.0),
        lambda lp, old, a, m, w: ref_ppo_token(
            lp,
            old,
            a,
            m,
            w,
            dict(
                clip_low=0.2, clip_high=0.28, dual_clip=3.0, log_ratio_min=-20.0, log_ratio_max=20.0
            ),
        ),
    ),
    "ppo-token-trl-delta": (
        dict(name="ppo", dual_clip=1.5, dual_clip_all_signs=True),
        lambda lp, old, a, m, w: ref_ppo_trl(
            lp, old, a, m, w, dict(clip_low=0.2, clip_high=0.28, delta=1.5), "token"
        ),
    ),
    "ppo-token-trl-delta-below-clip": (
        dict(name="ppo", dual_clip=1.1, dual_clip_all_signs=True),
        lambda lp, old, a, m, w: ref_ppo_trl(
            lp, old, a, m, w, dict(clip_low=0.2, clip_high=0.28, delta=1.1), "token"
        ),
    ),
    "gspo-sequence-trl": (
        dict(name="ppo", ratio_level="sequence", clip_low=0.05, clip_high=0.07),
        lambda lp, old, a, m, w: ref_ppo_trl(
            lp, old, a, m, w, dict(clip_low=0.05, clip_high=0.07, delta=None), "sequence"
        ),
    ),
    "gspo-token-verl": (
        dict(
            name="ppo",
            ratio_level="sequence-token",
            clip_low=0.05,
            clip_high=0.07,
            log_ratio_max=10.0,
        ),
        lambda lp, old, a, m, w: ref_gspo_token_verl(
            lp, old, a, m, w, dict(clip_low=0.05, clip_high=0.07)
        ),
    ),
    "sapo-token": (
        dict(name="sapo"),
        lambda lp, old, a, m, w: ref_sapo(
            lp, old, a, m, w, dict(tau_pos=1.0, tau_neg=1.05), "token"
        ),
    ),
    "sapo-sequence": (
        dict(name="sapo", ratio_level="sequence", sapo_tau_pos=2.0, sapo_tau_neg=3.0),
        lambda lp, old, a, m, w: ref_sapo(
            lp, old, a, m, w, dict(tau_pos=2.0, tau_neg=3.0), "sequence"
        ),
    ),
    "cispo-verl": (
        dict(name="cispo", log_ratio_min=-20.0, log_ratio_max=20.0),
        lambda lp, old, a, m, w: ref_cispo(
            lp, old, a, m, w, dict(clip_low=0.2, clip_high=0.28), "token"
        ),
    ),
    "cispo-sequence": (
        dict(name="cispo", ratio_level="sequence", log_ratio_min=-20.0, log_ratio_max=20.0),
        lambda lp, old, a, m, w: ref_cispo(
            lp, old, a, m, w, dict(clip_low=0.2, clip_high=0.28), "sequence"
        ),
    ),
    "cispo-trl": (
        dict(name="cispo", clip_low=1.0, clip_high=0.3),
        lambda lp, old, a, m, w: ref_cispo_trl(lp, old, a, m, w, dict(epsilon_high=1.3)),
    ),
    "gmpo": (
        dict(name="gmpo", clip_low=0.3, clip_high=0.25),
        lambda lp, old, a, m, w: ref_gmpo(lp, old, a, m, w, dict(clip_low=0.3, clip_high=0.25)),
    ),
    "gpg": (dict(name="gpg"), lambda lp, old, a, m, w: ref_gpg(lp, old, a, m, w, {})),
    "dppo-tv": (
        dict(
            name="dppo-tv",
            clip_low=0.05,
            clip_high=0.04,
            ratio_cap=1.5,
            log_ratio_min=-20.0,
            log_ratio_max=20.0,
        ),
        lambda lp, old, a, m, w: ref_dppo(
            lp, old, a, m, w, dict(clip_low=0.05, clip_high=0.04, ratio_cap=1.5), "tv"
        ),
    ),
    "dppo-kl": (
        dict(
            name="dppo-kl",
            clip_low=0.02,
            clip_high=0.03,
            ratio_cap=1.5,
            log_ratio_min=-20.0,
            log_ratio_max=20.0,
        ),
        lambda lp, old, a, m, w: ref_dppo(
            lp, old, a, m, w, dict(clip_low=0.02, clip_high=0.03, ratio_cap=1.5), "kl"
        ),
    ),
    "dro": (
        dict(name="dro", dro_beta=0.7),
        lambda lp, old, a, m, w: ref_dro(lp, old, a, m, w, dict(dro_beta=0.7)),
    ),
    "vespo": (
        dict(name="vespo"),
        lambda lp, old, a, m, w: ref_vespo(
            lp, old, a, m, w, dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0)
        ),
    ),
    "clip-cov": (
        dict(name="clip-cov", **{k: v for k, v in CLIP_COV.items() if k.startswith("clip_cov")}),
        lambda lp, old, a, m, w: ref_clip_cov(lp, old, a, m, w, CLIP_COV),
    ),
    "kl-cov": (
        dict(name="kl-cov", **KL_COV),
        lambda lp, old, a, m, w: ref_kl_cov(lp, old, a, m, w, KL_COV),
    ),
    # TRL's sum over the padding: its truncated ratio 1.3 / its masked ratio 0 (log 1e-8)
    **{
        f"vespo-padding-{padding}": (
            dict(name="vespo", vespo_padding_weight=padding),
            lambda lp, old, a, m, w, padding=padding: ref_vespo(
                lp,
                old,
                a,
                m,
                w,
                dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0, padding=padding),
            ),
        )
        for padding in (1.3, 0.0)
    },
}


# KL off, then every registered KL estimator (the straight-through "+" ones included), each
# unclamped and clamped at 0.5 (which the spread-0.5 batches exceed: test_the_kl_clamp_acts)
KL_CLAMP = 0.5
KL_OPTIONS = [None] + [
    (estimator, clamp) for estimator in gmts.available_kl_estimators() for clamp in (None, KL_CLAMP)
]


def test_every_registered_objective_has_a_reference_case():
    covered = {kw["name"] for kw, _ in CASES.values()}
    assert covered == set(gmts.available_objectives())


def test_the_kl_clamp_acts():
    """The clamped KL cases discriminate: in the batches of spread 0.5, every estimator's value
    is beyond the clamp at some valid token and within it at others."""
    for estimator in gmts.available_kl_estimators():
        for seed in (0, 1):
            lp, _, ref, _, mask, _ = _batch(seed, 0.5)
            beyond = gmts.get_kl_estimator(estimator).value(lp - ref).abs()[mask] > KL_CLAMP
            assert bool(beyond.any()) and not bool(beyond.all()), (estimator, seed)


def _reference_grad(ref_fn, lp, old, a, mask, w, kl):
    lp_var = lp.clone().requires_grad_(True)
    a2 = a[:, None].expand_as(lp)
    l_ref = ref_fn(lp_var, old, a2, mask.to(F64), w)
    if kl is not None:
        ref_lp, beta, estimator, clamp = kl
        l_ref = l_ref - beta * ref_kl(lp_var, ref_lp, estimator, clamp)
    total = (l_ref * mask).sum()
    (grad,) = torch.autograd.grad(total, lp_var)
    return torch.where(mask, grad, 0.0), l_ref.detach()


def _assert_close(a, b, scale=1.0):
    err = (a - b).abs().max().item()
    assert err <= 1e-12 * max(scale, 1.0), f"max abs err {err}"


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("spread", [0.02, 0.5])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "kl", KL_OPTIONS, ids=lambda kl: "no-kl" if kl is None else f"{kl[0]}-{kl[1]}"
)
def test_omega_equals_autograd_of_the_engine_formula(case, seed, spread, weighted, kl):
    kwargs, ref_fn = CASES[case]
    lp, old, ref, adv, mask, weights = _batch(seed, spread)
    w = weights if weighted else torch.ones_like(lp)
    extra = {}
    kl_ref = None
    if kl is not None:
        estimator, clamp = kl
        extra = dict(kl_coef=0.3, kl_estimator=estimator, kl_clamp=clamp)
        kl_ref = (ref, 0.3, estimator, clamp)
    config = ObjectiveConfig(**kwargs, **extra)
    expected, l_ref = _reference_grad(ref_fn, lp, old, adv, mask, w, kl_ref)
    for method in ("analytic", "autograd"):
        omega = gradient_coefficient(
            config,
            lp,
            old,
            adv,
            mask,
            ref_logprobs=ref if kl is not None else None,
            importance_weights=weights if weighted else None,
            method=method,
        )
        assert not omega.requires_grad
        _assert_close(omega, expected, expected.abs().max().item())
    # the core's own per-token objective has the reference's values at every valid token
    inputs = ObjectiveInputs.of(
        lp,
        old,
        adv,
        mask,
        ref_logprobs=ref if kl is not None else None,
        importance_weights=weights if weighted else None,
    )
    parts = gmts.objective_terms(config, inputs)
    value = parts.surrogate - config.kl_coef * parts.kl
    _assert_close(
        torch.where(mask, value, 0.0), torch.where(mask, l_ref, 0.0), l_ref.abs().max().item()
    )


def test_ratio_correction_of_the_kl_at_every_level():
    """TRL's use_bias_correction_kl: per_token_kl * coef_1, coef_1 the token or the sequence
    ratio with its gradient (the sequence form makes the KL term depend on the whole row)."""
    lp, old, ref, adv, mask, _ = _batch(3, 0.3)
    for level in ("token", "sequence"):
        config = ObjectiveConfig(ratio_level=level, kl_coef=0.2, kl_ratio_correction=True)
        lp_var = lp.clone().requires_grad_(True)
        log_ratio = lp_var - old
        if level == "sequence":
            coef = torch.exp((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]
        else:
            coef = torch.exp(log_ratio)
        a = adv[:, None]
        coef_2 = torch.clamp(coef, 0.8, 1.28)
        kl = (torch.exp(ref - lp_var) - (ref - lp_var) - 1) * coef
        objective = torch.min(coef * a, coef_2 * a) - 0.2 * kl
        (expected,) = torch.autograd.grad((objective * mask).sum(), lp_var)
        omega = gradient_coefficient(config, lp, old, adv, mask, ref_logprobs=ref)
        _assert_close(omega, torch.where(mask, expected, 0.0), 10.0)


def test_on_policy_omega_of_the_clipped_family_is_the_advantage():
    lp, _, _, adv, mask, _ = _batch(4)
    a = torch.where(mask, adv[:, None].expand_as(lp), 0.0)
    for kw in (
        dict(),
        dict(ratio_level="sequence"),
        dict(ratio_level="sequence-token"),
        dict(name="sapo"),
        dict(name="cispo"),
        dict(name="gpg"),
    ):
        omega = gradient_coefficient(ObjectiveConfig(**kw), lp, lp, adv, mask)
        _assert_close(omega, a)


def test_sequence_level_objectives_share_one_coefficient_per_row():
    lp, old, _, adv, mask, _ = _batch(5, 0.3)
    for kw in (
        dict(ratio_level="sequence"),
        dict(ratio_level="sequence-token"),
        dict(name="sapo", ratio_level="sequence"),
        dict(name="vespo"),
    ):
        omega = gradient_coefficient(ObjectiveConfig(**kw), lp, old, adv, mask)
        for i in range(lp.shape[0]):
            row = omega[i][mask[i]]
            if row.numel():
                assert bool((row == row[0]).all()), kw


# --------------------------------------------------------------------------------------------
# the loss's gradient under a selection


def _selection(mask, seed):
    g = torch.Generator().manual_seed(seed)
    sel = (torch.rand(mask.shape, generator=g) < 0.4) & mask
    sel[0, 0] = True
    return sel


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_gradient_under_a_selection(case):
    """Token-level objectives: d loss / d log pi_t = -omega_t / S on the selected tokens and 0
    elsewhere (eq. 2). Sequence-level ones (the row's term depends on every token): every
    valid token of row i gets -share_i omega_t / S, share_i = sum_{P_i} w / sum_{M_i} w (the
    selected fraction of the row's weight; |P_i| / |o_i| for GMPO, whose weight is per row)."""
    kwargs, _ = CASES[case]
    config = ObjectiveConfig(**kwargs)
    lp, old, ref, adv, mask, weights = _batch(7, 0.3)
    sel = _selection(mask, 7)
    lp_var = lp.clone().requires_grad_(True)
    loss, _ = gmts.policy_loss(
        lp_var, old, adv, mask, gmts.LossConfig(config), selected=sel, importance_weights=weights
    )
    (grad,) = torch.autograd.grad(loss, lp_var)
    omega = gradient_coefficient(config, lp, old, adv, mask, importance_weights=weights)
    s = int(sel.sum())
    row_terms = config.name in ("ppo", "sapo") and config.ratio_level == "sequence"
    if config.name == "gmpo" or row_terms:
        w = torch.ones_like(weights) if config.name == "gmpo" else weights
        share = (w * sel).sum(-1, keepdim=True) / (w * mask).sum(-1, keepdim=True).clamp(min=1e-30)
        expected = torch.where(mask, -share * omega / s, 0.0)
    else:
        expected = torch.where(sel, -omega / s, 0.0)
    _assert_close(grad, expected, 1.0)


def test_loss_omega_ranks_like_omega_for_every_objective():
    """The generic derivative of the engine's own loss (here: the core's policy_loss with a
    token-mean and no selection) is omega / N: the same ranking for every objective."""
    lp, old, _, adv, mask, _ = _batch(8, 0.3)
    n = int(mask.sum())
    for kwargs, _ in CASES.values():
        config = ObjectiveConfig(**kwargs)
        loss_config = gmts.LossConfig(config)

        def loss_fn(x, config=loss_config):
            return gmts.policy_loss(x, old, adv, mask, config)[0]

        from_loss = gmts.loss_omega(loss_fn, lp, mask)
        omega = gradient_coefficient(config, lp, old, adv, mask)
        _assert_close(from_loss * n, omega, omega.abs().max().item())
        valid = mask.reshape(-1)
        order_a = torch.argsort(from_loss.reshape(-1)[valid], stable=True)
        order_b = torch.argsort(omega.reshape(-1)[valid], stable=True)
        assert torch.equal(order_a, order_b), kwargs


# --------------------------------------------------------------------------------------------
# a user's own objective: registered without a closed form, omega by autograd


def test_a_plugged_in_objective_gets_omega_by_autograd_and_drives_gmts():
    from gmts.core.objectives.inputs import Surrogate
    from gmts.core.objectives.registry import _OBJECTIVES

    def tanh_surrogate(inputs, config, ratio):  # s = A tanh(r - 1): an objective nobody ships
        return Surrogate.unclipped(inputs.advantages * torch.tanh(ratio.value - 1))

    gmts.register_objective(gmts.Objective("tanh-test", tanh_surrogate, None, frozenset()))
    try:
        lp, old, _, adv, mask, _ = _batch(9, 0.3)
        config = ObjectiveConfig(name="tanh-test")
        omega = gradient_coefficient(config, lp, old, adv, mask)
        r = torch.exp(lp - old)
        expected = adv[:, None] * (1 - torch.tanh(r - 1) ** 2) * r
        _assert_close(omega, torch.where(mask, expected, 0.0), 1.0)
        entropy = torch.rand(lp.shape, dtype=F64, generator=torch.Generator().manual_seed(0))
        selection = gmts.SelectionConfig(omega="autograd")
        result = gmts.select_for_update(
            selection,
            config,
            logprobs=lp,
            old_logprobs=old,
            advantages=adv,
            response_mask=mask,
            entropy=entropy,
        )
        torch.testing.assert_close(result.scores, (entropy * omega).abs())
    finally:
        _OBJECTIVES.remove("tanh-test")


def test_select_for_update_autograd_and_analytic_omega_agree():
    lp, old, ref, adv, mask, weights = _batch(10, 0.3)
    entropy = torch.rand(lp.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    for kwargs, _ in CASES.values():
        config = ObjectiveConfig(**kwargs, kl_coef=0.05)
        results = [
            gmts.select_for_update(
                gmts.SelectionConfig(omega=method),
                config,
                logprobs=lp,
                old_logprobs=old,
                advantages=adv,
                response_mask=mask,
                entropy=entropy,
                ref_logprobs=ref,
                importance_weights=weights,
            )
            for method in ("analytic", "autograd")
        ]
        torch.testing.assert_close(results[0].scores, results[1].scores, rtol=1e-12, atol=1e-14)
        assert torch.equal(results[0].selected, results[1].selected)


def test_importance_weights_fold_into_the_gmts_score():
    """Rollout correction: the score is |E * omega| with omega of the weighted loss."""
    lp, old, _, adv, mask, weights = _batch(11, 0.3)
    entropy = torch.rand(lp.shape, dtype=F64, generator=torch.Generator().manual_seed(2))
    row_weights = weights[:, :1]  # a sequence-level correction: one weight per row (B, 1)
    for w in (weights, row_weights):
        result = gmts.select_for_update(
            gmts.SelectionConfig(),
            ObjectiveConfig(),
            logprobs=lp,
            old_logprobs=old,
            advantages=adv,
            response_mask=mask,
            entropy=entropy,
            importance_weights=w,
        )
        unweighted = gradient_coefficient(ObjectiveConfig(), lp, old, adv, mask)
        torch.testing.assert_close(result.scores, (entropy * unweighted * w).abs())


# --------------------------------------------------------------------------------------------
# configuration


def test_objective_config_names_every_mistake():
    with pytest.raises(ValueError, match="unknown objective 'gspo'.*valid objectives"):
        ObjectiveConfig(name="gspo")
    with pytest.raises(ValueError, match=r"'cispo' does not read \['dual_clip'\]"):
        ObjectiveConfig(name="cispo", dual_clip=3.0)
    with pytest.raises(ValueError, match="'gpg' does not read"):
        ObjectiveConfig(name="gpg", sapo_tau_pos=2.0)
    with pytest.raises(ValueError, match="ratio_level='sequence'.*'gmpo' supports"):
        ObjectiveConfig(name="gmpo", ratio_level="sequence")
    with pytest.raises(ValueError, match="dro_beta"):
        ObjectiveConfig(name="dro")
    with pytest.raises(ValueError, match="vespo_padding_weight must be a finite number >= 0"):
        ObjectiveConfig(name="vespo", vespo_padding_weight=-0.5)
    with pytest.raises(ValueError, match=r"'ppo' does not read \['vespo_padding_weight'\]"):
        ObjectiveConfig(vespo_padding_weight=0.0)
    with pytest.raises(ValueError, match="kl_estimator"):
        ObjectiveConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="dual_clip_all_signs needs dual_clip"):
        ObjectiveConfig(dual_clip_all_signs=True)
    with pytest.raises(ValueError, match="log_ratio_min must be <= log_ratio_max"):
        ObjectiveConfig(log_ratio_min=1.0, log_ratio_max=0.0)
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm.*horizon"):
        gmts.LossConfig(ObjectiveConfig(aggregation="seq-mean-token-sum-norm"))
    with pytest.raises(ValueError, match="importance_weights"):
        lp, old, _, adv, mask, weights = _batch(0)
        gradient_coefficient(ObjectiveConfig(), lp, old, adv, mask, importance_weights=-weights)
    for f in ObjectiveConfig.__dataclass_fields__.values():
        assert f.metadata.get("help"), f.name


def test_presets_of_the_new_objectives():
    gspo = ObjectiveConfig.preset("gspo")
    assert (gspo.name, gspo.ratio_level, gspo.aggregation) == (
        "ppo",
        "sequence",
        "seq-mean-token-mean",
    )
    cispo = ObjectiveConfig.preset("cispo")
    assert cispo.name == "cispo" and 1 + cispo.clip_high == 5.0 and cispo.clip_low == 1.0


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"])
def test_kl_estimators_against_their_formulas(estimator):
    lp, _, ref, _, _, _ = _batch(12, 0.5)
    est = gmts.get_kl_estimator(estimator)
    d = lp - ref
    torch.testing.assert_close(est.value(d), ref_kl(lp, ref, estimator, None))
    lp_var = lp.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(ref_kl(lp_var, ref, estimator, None).sum(), lp_var)
    torch.testing.assert_close(est.grad(d), grad)
    assert set(gmts.available_kl_estimators()) == {"k1", "k2", "k3", "abs", "k1+", "k3+", "abs+"}


def test_registry_refuses_duplicates_and_bad_levels():
    with pytest.raises(ValueError, match="already registered"):
        gmts.register_objective(gmts.get_objective("ppo"))
    with pytest.raises(ValueError, match="ratio_levels"):
        gmts.Objective("x", gmts.get_objective("gpg").surrogate, None, frozenset(), ("word",))
    assert list(itertools.islice(gmts.available_objectives(), 1))  # non-empty, sorted
