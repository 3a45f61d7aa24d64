"""Per-token objectives written the way the engines write them (verl 0.9.1 core_algos, TRL
1.16 GRPOTrainer._compute_loss): min/max, clamp, detach, and the engines' own constants.

They are the independent references of tests/core/test_core_objective_registry.py (omega
against their autograd) and of the objective rows of the conformance matrix
(tests/conformance/_objectives.py). Not a test module; every function returns the (B, T)
per-token objective l (to maximise) of float64 inputs, ``a`` the (B, T) advantages, ``mask``
(B, T) float, ``w`` (B, T) importance weights (ones: none).
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def _masked_mean(x, mask):
    return (x * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


def ref_ppo_token(lp, old, a, mask, w, c):
    """verl compute_policy_loss_vanilla (dual clip, log-ratio clamp) times w."""
    x = lp - old
    if c["log_ratio_min"] is not None or c["log_ratio_max"] is not None:
        x = torch.clamp(x, min=c["log_ratio_min"], max=c["log_ratio_max"])
    ratio = torch.exp(x)
    pg1 = -a * ratio
    pg2 = -a * torch.clamp(ratio, 1 - c["clip_low"], 1 + c["clip_high"])
    clip1 = torch.maximum(pg1, pg2)
    pg = clip1
    if c["dual_clip"] is not None:
        clip2 = torch.min(-a * c["dual_clip"], clip1)
        pg = torch.where(a < 0, clip2, clip1)
    return -pg * w


def ref_ppo_trl(lp, old, a, mask, w, c, level):
    """TRL's grpo/dapo branch: token or sequence importance weights, two-sided clip delta."""
    log_ratio = lp - old
    if level == "sequence":
        log_iw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_iw = log_ratio
    coef_1 = torch.exp(log_iw)
    coef_2 = torch.clamp(coef_1, 1 - c["clip_low"], 1 + c["clip_high"])
    if c["delta"] is not None:
        coef_1 = torch.clamp(coef_1, max=c["delta"])
    return torch.min(coef_1 * a, coef_2 * a) * w


def ref_gspo_token_verl(lp, old, a, mask, w, c):
    """verl compute_policy_loss_gspo (the sequence-token ratio, clamp max 10)."""
    neg_kl = lp - old
    seq = torch.sum(neg_kl * mask, dim=-1) / torch.sum(mask, dim=-1).clamp(min=1)
    log_r = lp - lp.detach() + seq.detach().unsqueeze(-1)
    log_r = torch.clamp(log_r, max=10.0)
    r = torch.exp(log_r)
    pg = torch.maximum(-a * r, -a * torch.clamp(r, 1 - c["clip_low"], 1 + c["clip_high"]))
    return -pg * w


def ref_sapo(lp, old, a, mask, w, c, level):
    log_ratio = lp - old
    if level == "sequence":
        log_ratio = _masked_mean(log_ratio, mask)
    r = torch.exp(log_ratio)
    taus = torch.where(
        a > 0, torch.tensor(c["tau_pos"], dtype=F64), torch.tensor(c["tau_neg"], dtype=F64)
    )
    return torch.sigmoid(taus * (r - 1.0)) * (4.0 / taus) * a * w


def ref_cispo(lp, old, a, mask, w, c, level):
    """verl compute_policy_loss_cispo (two-sided clamp of the detached ratio)."""
    x = torch.clamp(lp - old, min=-20.0, max=20.0)
    if level == "sequence":
        x = _masked_mean(x, mask)
    ratio = torch.exp(x)
    clipped = torch.clamp(ratio, 1 - c["clip_low"], 1 + c["clip_high"]).detach()
    return clipped * a * lp * w


def ref_cispo_trl(lp, old, a, mask, w, c):
    coef_1 = torch.exp(lp - old)
    return torch.clamp(coef_1, max=c["epsilon_high"]).detach() * a * lp * w


def ref_gmpo(lp, old, a, mask, w, c):
    """verl compute_policy_loss_geo_mean; every valid token carries the row's value."""
    neg_kl = lp - old
    sgn = torch.sign(a)
    clamp = torch.clamp(neg_kl, -c["clip_low"], c["clip_high"])
    neg_kl_min = sgn * torch.min(sgn * neg_kl, sgn * clamp)
    msum = mask.sum(-1)
    ratio = torch.exp((neg_kl_min * mask).sum(-1) / (msum + 1e-8))
    adv = (a * mask).sum(-1) / (msum + 1e-8)
    value = adv * ratio
    if not bool((w == 1).all()):  # verl applies rollout_is_weights only when it has them
        value = value * torch.exp((torch.log(w + 1e-10) * mask).sum(-1) / (msum + 1e-8))
    return value.unsqueeze(-1).expand_as(lp)


def ref_gpg(lp, old, a, mask, w, c):
    return lp * a * w


def ref_dppo(lp, old, a, mask, w, c, kind):
    """verl compute_policy_loss_dppo_tv / dppo_kl."""
    ratio = torch.exp(torch.clamp(lp - old, min=-20.0, max=20.0))
    truncated = torch.clamp(ratio, max=c["ratio_cap"]).detach()
    prob, old_prob = torch.exp(lp), torch.exp(old)
    if kind == "tv":
        pos = (prob - old_prob) <= c["clip_high"]
        neg = (prob - old_prob) >= -c["clip_low"]
    else:
        bkl = old_prob * (old - lp) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        pos = (bkl <= c["clip_high"]) | (prob <= old_prob)
        neg = (bkl <= c["clip_low"]) | (prob >= old_prob)
    valid = torch.where(a > 0, pos, neg).detach().to(F64)
    return a * truncated * lp * valid * w


def ref_dro(lp, old, a, mask, w, c):
    log_ratio = lp - old
    return (lp * a - 0.5 * c["dro_beta"] * log_ratio.square()) * w


def ref_vespo(lp, old, a, mask, w, c):
    """TRL get_gamma_weights (w: its importance_sampling_ratio) then -phi A log pi. TRL sums
    the ratio's log over every position; c["padding"] is its ratio outside the mask (1 unless
    the IS range excludes 1)."""
    with torch.no_grad():
        lower = math.log(1e-8)
        seq = torch.sum(torch.clamp(lp - old, -20.0, 20.0) * mask, dim=-1, keepdim=True)
        ratio = torch.where(mask.bool(), w, torch.full_like(w, c.get("padding", 1.0)))
        seq = seq + torch.sum(torch.clamp(torch.log(ratio), lower, 20.0), dim=-1, keepdim=True)
        log_w = torch.clamp(seq, lower, 20.0)
        nonneg = a >= 0
        k = torch.where(nonneg, c["k_pos"], c["k_neg"])
        lam = torch.where(nonneg, c["lambda_pos"], c["lambda_neg"]).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(
            nan=0.0, posinf=0.0, neginf=0.0
        )
    return phi * a * lp


def ref_kl(lp, ref, estimator, clamp):
    """verl kl_penalty (with its '+' straight-through) with an optional symmetric clamp."""
    base = estimator.rstrip("+")
    d = lp - ref
    if base == "k1":
        value = d
    elif base == "abs":
        value = d.abs()
    elif base == "k2":
        value = 0.5 * d.square()
    elif base == "k3":
        x = ref - lp
        value = torch.exp(x) - x - 1
    else:  # a new estimator needs its own reference here
        raise ValueError(f"no reference for the KL estimator {estimator!r}")
    if clamp is not None:
        value = torch.clamp(value, min=-clamp, max=clamp)
    if estimator.endswith("+"):
        back = 0.5 * d.square()
        value = back - back.detach() + value.detach()
    return value


def ref_clip_cov(lp, old, a, mask, w, c, seed=0):
    """verl compute_policy_loss_clip_cov, its global-RNG draw from a generator seeded ``seed``
    (what ``torch.manual_seed(seed)`` gives verl's ``torch.randperm``)."""
    ratio = torch.exp(lp - old)
    pg1 = -a * ratio
    pg2 = -a * torch.clamp(ratio, 1 - c["clip_low"], 1 + c["clip_high"])
    clip_by_origin = (pg2 > pg1) & (mask > 0)
    n = mask.sum()
    mean_a = (a * mask).sum() / (n.to(torch.float32) + 1e-8)
    mean_lp = (lp.detach() * mask).sum() / (n.to(torch.float32) + 1e-8)
    cov = (a - mean_a) * (lp - mean_lp)
    cov[mask == 0] = -torch.inf
    cov[clip_by_origin] = -torch.inf
    clip_num = max(int(c["clip_cov_ratio"] * int(n)), 1)
    idx = torch.nonzero((cov < c["clip_cov_ub"]) & (cov > c["clip_cov_lb"]) & (mask > 0))
    corr = torch.ones_like(a)
    if len(idx) > 0:
        perm = torch.randperm(len(idx), generator=torch.Generator().manual_seed(seed))
        idx = idx[perm[: min(clip_num, len(idx))]]
        corr[idx[:, 0], idx[:, 1]] = 0
    return -torch.maximum(pg1, pg2) * corr * w


def ref_kl_cov(lp, old, a, mask, w, c):
    """verl compute_policy_loss_kl_cov: ``r A`` everywhere, ``r A - coef |x|`` at the top
    ``kl_cov_ratio`` of the valid tokens by centred covariance (torch.topk)."""
    x = lp - old
    pg = -a * torch.exp(x)
    pg_kl = pg + c["kl_cov_coef"] * x.abs()
    valid = mask > 0
    flat_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    adv, logp = a[valid].detach().reshape(-1), lp[valid].detach().reshape(-1)
    out = pg.clone()
    if len(adv):
        cov = (adv - adv.mean()) * (logp - logp.mean())
        k = max(1, int(len(cov) * c["kl_cov_ratio"]))
        top = flat_idx[torch.topk(cov, k, largest=True).indices]
        rows, cols = top // a.shape[1], top % a.shape[1]
        out[rows, cols] = pg_kl[rows, cols]
    return -out * w
