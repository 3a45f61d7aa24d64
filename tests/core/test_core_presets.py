"""The named presets against their peers' own rules, reimplemented here from their code:

- ``reference-code``: the authors' standalone trainer (outongyiLv/GMTS, GMTS-Framework1
  grpo_tools/grpo.py), GRPO and DAPO, GMTS and ETS: np.std advantages, the GMTS removal count
  per question group (stable ascending sort, the first ties removed), the ETS threshold
  ``sorted[int(0.8 N) - 1]``, A / (G |o_i|) (GRPO) or A / sum_{group} |o_i| (DAPO) summed over
  the mini-batch, the k3 KL / (G |o_i|) on every token;
- ``trl``: TRL 1.16's ``get_high_entropy_mask`` rule, ``H >= torch.quantile(H_valid, 1 - rho)``;
- the paper preset's zero-score rule.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

import gmts

F64 = torch.float64
G = 4  # answers per question in these tests


def _group_batch(seed: int, lengths: list[int], t: int = 9):
    """Questions of G answers each with unequal lengths; old log-probs != current (some
    clipping), a reference policy, 0/1 rewards with mixed groups."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    old = -0.2 - 2.0 * torch.rand(b, t, generator=g, dtype=F64)
    lp = old + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    ref = old + 0.2 * torch.randn(b, t, generator=g, dtype=F64)
    entropy = 0.05 + 2.0 * torch.rand(b, t, generator=g, dtype=F64)
    rewards = (torch.rand(b, generator=g) < 0.5).to(F64)
    rewards[0], rewards[1] = 1.0, 0.0  # group 0 mixed
    group_ids = torch.arange(b) // G
    return lp, old, ref, entropy, rewards, mask, group_ids


# --------------------------------------------------------------------------------------------
# the authors' code, reimplemented from its formulas (loops over answers and tokens)


def _authors_advantages(rewards: torch.Tensor, lengths: list[int], method: str) -> list[float]:
    """normalize_rewards_per_group: (R - mean) / (np.std + 1e-6), then / (G |o_i|) (GRPO) or
    / sum_{group} |o_i| (DAPO)."""
    out = []
    for q in range(len(rewards) // G):
        rows = range(q * G, (q + 1) * G)
        r = [float(rewards[i]) for i in rows]
        mean = sum(r) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / G)  # np.std: the population std
        group_tokens = sum(lengths[i] for i in rows)
        for i, x in zip(rows, r):
            a = (x - mean) / (std + 1e-6)
            out.append(a / (G * lengths[i]) if method == "grpo" else a / group_tokens)
    return out


def _authors_gmts_order(lp, old, ref, entropy, adv, lengths, method, beta):
    """GMTS()'s scores per question group, entropy * |omega with the normalised A|, each group
    sorted ascending as their stable sort leaves it (equal scores in (answer, position) order):
    a list of [(score, i, j), ...] per group."""
    groups = []
    for q in range(lp.shape[0] // G):
        entries = []
        for i in range(q * G, (q + 1) * G):
            for j in range(lengths[i]):
                ratio_ij = math.exp(float(lp[i, j] - old[i, j]))
                a = adv[i]
                trusted = not ((ratio_ij > 1.28 and a > 0) or (ratio_ij < 0.8 and a < 0))
                omega = ratio_ij * trusted * a
                if method == "grpo":  # (beta pi_ref / pi - beta) / (|o_i| G)
                    kl = beta * math.exp(float(ref[i, j] - lp[i, j])) - beta
                    omega += kl / (lengths[i] * G)
                entries.append((float(entropy[i, j]) * abs(omega), i, j))
        entries.sort(key=lambda e: e[0])  # stable: equal scores keep (answer, position) order
        groups.append(entries)
    return groups


def _removed_count(n: int, ratio: float) -> int:
    """ceil((1 - ratio) N), exact on the decimal ratio."""
    removed = 1 - Fraction(str(ratio))
    return -(-removed.numerator * n // removed.denominator)


def _authors_selection(lp, old, ref, entropy, adv, lengths, method, score, ratio, beta):
    """GMTS(): per question group, the scores sorted ascending (stable: answer then position),
    the first ceil((1 - ratio) N) removed. ETS: one threshold over the mini-batch,
    sorted[int((1 - ratio) N) - 1], keep >= it.

    Counts are evaluated exactly on the decimal ratio: their float products (0.8 * 15 =
    12.000000000000002, so ceil gives 13) are an artifact the presets do not copy."""
    b, t = lp.shape
    selected = torch.zeros(b, t, dtype=torch.bool)
    if score == "entropy":
        removed = 1 - Fraction(str(ratio))
        values = sorted(float(entropy[i, j]) for i in range(b) for j in range(lengths[i]))
        m = removed.numerator * len(values) // removed.denominator  # int(0.8 N)
        threshold = values[m - 1] if m > 0 else values[0]
        for i in range(b):
            for j in range(lengths[i]):
                selected[i, j] = float(entropy[i, j]) >= threshold
        return selected
    for entries in _authors_gmts_order(lp, old, ref, entropy, adv, lengths, method, beta):
        for _, i, j in entries[_removed_count(len(entries), ratio) :]:
            selected[i, j] = True
    return selected


def _authors_loss(lp_var, old, ref, adv, selected, lengths, method, beta):
    """The update's loss: sum over the mini-batch of -min(r A_sel, clip(r) A_sel) (+ the k3
    KL / (G |o_i|) on every token for GRPO), A_sel = the normalised A on selected tokens."""
    b, t = lp_var.shape
    total = torch.zeros((), dtype=F64)
    for i in range(b):
        for j in range(lengths[i]):
            r = torch.exp(lp_var[i, j] - old[i, j])
            a = adv[i] if bool(selected[i, j]) else 0.0
            term = -torch.min(r * a, torch.clamp(r, 0.8, 1.28) * a)
            if method == "grpo":
                x = ref[i, j] - lp_var[i, j]
                term = term + beta * (torch.exp(x) - x - 1) / (G * lengths[i])
            total = total + term
    return total


def _assert_reference_code_is_the_authors(batch, lengths, method, score, ratio):
    """The reference-code preset's selection, loss and gradient against the authors' formulas
    on ``batch`` (from :func:`_group_batch`)."""
    lp, old, ref, entropy, rewards, mask, group_ids = batch
    beta = 0.04 if method == "grpo" else 0.0
    adv_theirs = _authors_advantages(rewards, lengths, method)
    # their scores use the normalised advantage; its 1/(G|o_i|) or 1/N_group is the loss's
    # per-token weight, which the preset folds in through omega_weighting / per-group division
    sel_theirs = _authors_selection(
        lp, old, ref, entropy, adv_theirs, lengths, method, score, ratio, beta
    )
    lp_theirs = lp.clone().requires_grad_(True)
    loss_theirs = _authors_loss(lp_theirs, old, ref, adv_theirs, sel_theirs, lengths, method, beta)
    (grad_theirs,) = torch.autograd.grad(loss_theirs, lp_theirs)

    objective = gmts.ObjectiveConfig.preset(method, kl_coef=beta)
    selection = gmts.SelectionConfig.preset("reference-code", score=score, ratio=ratio)
    advantages = gmts.group_advantages(rewards, G, std="population")
    lp_ours = lp.clone().requires_grad_(True)
    result = gmts.select_for_update(
        selection,
        objective,
        logprobs=lp_ours,
        old_logprobs=old,
        advantages=advantages,
        response_mask=mask,
        entropy=entropy,
        ref_logprobs=ref if beta else None,
        group_ids=group_ids,
    )
    assert torch.equal(result.selected, sel_theirs)
    loss, _ = gmts.policy_loss(
        lp_ours,
        old,
        advantages,
        mask,
        gmts.LossConfig.of(objective, selection),
        selected=result.selected,
        ref_logprobs=ref if beta else None,
        group_ids=group_ids,
    )
    (grad,) = torch.autograd.grad(loss, lp_ours)
    assert loss.item() == pytest.approx(loss_theirs.item(), rel=1e-12, abs=1e-15)
    torch.testing.assert_close(grad, grad_theirs, rtol=1e-10, atol=1e-14)


LENGTHS = [9, 3, 5, 1, 7, 2, 8, 4, 6, 6, 1, 5]  # three questions, unequal group lengths


@pytest.mark.parametrize("method", ["grpo", "dapo"])
@pytest.mark.parametrize("score", ["gmts", "entropy"])
@pytest.mark.parametrize("ratio", [0.2, 0.3, 0.5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_code_preset_equals_the_authors_formulas(method, score, ratio, seed):
    _assert_reference_code_is_the_authors(
        _group_batch(seed, LENGTHS), LENGTHS, method, score, ratio
    )


@pytest.mark.parametrize("method", ["grpo", "dapo"])
@pytest.mark.parametrize("ratio", [0.2, 0.3, 0.5])
def test_reference_code_preset_breaks_ties_at_the_cut_as_their_sort(method, ratio):
    """Every even position's log-probs and entropy copied to the next one, so within an answer
    tokens come in pairs of equal GMTS score; the batch is drawn until one such pair straddles
    the cut of some question group (their stable sort removes the first of the two, keeping
    the later token: ties='last'; ties='first' keeps the other)."""
    beta = 0.04 if method == "grpo" else 0.0
    for seed in range(100):
        batch = _group_batch(seed, LENGTHS)
        lp, old, ref, entropy, rewards = batch[:5]
        for x in (lp, old, ref, entropy):
            x[:, 1::2] = x[:, 0:-1:2]
        adv = _authors_advantages(rewards, LENGTHS, method)
        straddling = 0
        for entries in _authors_gmts_order(lp, old, ref, entropy, adv, LENGTHS, method, beta):
            k = _removed_count(len(entries), ratio)
            if 0 < k < len(entries) and entries[k - 1][0] == entries[k][0] > 0:
                straddling += 1
        if straddling:
            break
    assert straddling, "no batch with a tie at the cut"
    _assert_reference_code_is_the_authors(batch, LENGTHS, method, "gmts", ratio)


def test_reference_code_ties_go_to_the_last_token():
    """Their stable ascending sort removes the first of equal scores: the last is kept."""
    scores = torch.tensor([[1.0, 2.0, 2.0, 3.0], [2.0, 0.5, 2.0, 2.0]], dtype=F64)
    mask = torch.ones_like(scores, dtype=torch.bool)
    for ratio, count in ((0.5, "floor"), (0.3, "ceil")):
        k = gmts.selection_count(8, ratio, count)
        got = gmts.select_tokens(scores, mask, ratio, count=count, ties="last")
        flat = [(float(scores[i, j]), i, j) for i in range(2) for j in range(4)]
        keep = sorted(flat, key=lambda e: (-e[0], -e[1], -e[2]))[:k]
        expected = torch.zeros_like(mask)
        for _, i, j in keep:
            expected[i, j] = True
        assert torch.equal(got, expected), (ratio, count)


def test_population_std_is_numpys():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=F64)
    a = gmts.group_advantages(rewards, 4, std="population", eps=0.0)
    for q in range(2):
        r = rewards[q * 4 : (q + 1) * 4]
        std = math.sqrt(float(((r - r.mean()) ** 2).mean()))
        torch.testing.assert_close(a[q * 4 : (q + 1) * 4], (r - r.mean()) / std)
    unbiased = gmts.group_advantages(rewards, 4, eps=0.0)
    torch.testing.assert_close(a / unbiased, torch.full_like(a, math.sqrt(4 / 3)))
    with pytest.raises(ValueError, match="std"):
        gmts.group_advantages(rewards, 4, std="sample")


def test_reference_code_preset_is_refused_where_groups_are_not_whole():
    objective = gmts.ObjectiveConfig.preset("dapo")
    config = gmts.LossConfig.of(objective, gmts.SelectionConfig.preset("reference-code"))
    lp = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="group_ids"):
        gmts.policy_loss(lp, lp, torch.ones(2), torch.ones(2, 3, dtype=torch.bool), config)


# --------------------------------------------------------------------------------------------
# TRL's quantile rule


def _trl_mask(entropies: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """TRL 1.16 get_high_entropy_mask on one process (the gather is the identity)."""
    local = entropies[mask.bool()].float()
    threshold = torch.quantile(local, 1 - rho)
    return ((entropies * mask.float()) >= threshold) & mask.bool()


@pytest.mark.parametrize("rho", [0.1, 0.2, 0.3, 0.5, 0.7, 0.9])
@pytest.mark.parametrize("ties", [False, True])
def test_quantile_count_is_trls_rule_for_every_n(rho, ties):
    g = torch.Generator().manual_seed(int(rho * 100) + ties)
    differs_from_ceil = 0
    for n in range(1, 101):
        rows = 1 + n // 13
        t = -(-n // rows)
        mask = (torch.arange(rows * t) < n).reshape(rows, t)
        h = torch.rand(rows, t, generator=g)
        if ties:
            h = torch.round(h * 5) / 5  # many equal entropies
        got = gmts.select_tokens(h, mask, rho, count="quantile")
        assert torch.equal(got, _trl_mask(h, mask, rho)), n
        if not ties and int(got.sum()) != math.ceil(rho * n):
            differs_from_ceil += 1
            assert int(got.sum()) == n - math.ceil(Fraction(str(1 - rho)) * (n - 1))
    if not ties and rho in (0.7, 0.9):
        assert differs_from_ceil > 0  # where the old exact count disagreed with TRL


def test_quantile_count_compares_float64_scores_as_trl():
    """TRL takes the quantile of the entropies in float32 but compares `entropies *
    mask.float()` with it: float64 entropies stay float64 and the threshold is widened. A
    float64 score just below the threshold whose float32 rounding equals it (the threshold is
    often that very order statistic, rounded) is then not kept; a comparison in float32 would
    keep it."""
    g = torch.Generator().manual_seed(11)
    rounding_decides = 0
    for rho in (0.1, 0.2, 0.3, 0.5, 0.7, 0.9):
        for n in range(1, 101):
            rows = 1 + n // 13
            t = -(-n // rows)
            mask = (torch.arange(rows * t) < n).reshape(rows, t)
            h = 3 * torch.rand(rows, t, generator=g, dtype=F64)
            theirs = _trl_mask(h, mask, rho)
            assert torch.equal(gmts.select_tokens(h, mask, rho, count="quantile"), theirs)
            in_float32 = _trl_mask(h.float(), mask, rho)
            rounding_decides += not torch.equal(in_float32, theirs)
    assert rounding_decides > 0  # cases where a float32 comparison would differ from TRL


def test_quantile_count_matches_torch_quantile_in_float32_interpolation():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(1, 3000, (1,), generator=g))
        x = torch.randn(1, n, generator=g) * float(torch.rand(1, generator=g) * 100)
        if trial % 3 == 0:
            x = torch.round(x * 4) / 4
        rho = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        mask = torch.ones_like(x, dtype=torch.bool)
        expected = x >= torch.quantile(x[0], 1 - rho)
        assert torch.equal(gmts.select_tokens(x, mask, rho, count="quantile"), expected)
        bottom = gmts.select_tokens(x, mask, rho, count="quantile", largest=False)
        assert torch.equal(bottom, x <= torch.quantile(x[0], rho))


@pytest.mark.slow
def test_quantile_count_beyond_torch_quantiles_limit():
    """torch.quantile raises above 2^24 elements; the rule is the same formula from exact
    order statistics (checked against a full sort)."""
    n = (1 << 24) + 3
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, n, generator=g)
    mask = torch.ones_like(x, dtype=torch.bool)
    rho = 0.3
    with pytest.raises(RuntimeError):
        torch.quantile(x[0], 1 - rho)
    s = x[0].sort().values
    rank = torch.tensor(1 - rho, dtype=torch.float32) * (n - 1)
    lo, hi = int(rank.floor()), int(rank.ceil())
    threshold = torch.lerp(s[lo], s[hi], rank - lo)
    got = gmts.select_tokens(x, mask, rho, count="quantile")
    assert int(got.sum()) == int((x >= threshold).sum())


def test_index_count_is_the_authors_ets_rule():
    g = torch.Generator().manual_seed(3)
    for n in range(1, 80):
        x = torch.round(torch.rand(1, n, generator=g) * 8) / 8
        mask = torch.ones_like(x, dtype=torch.bool)
        for rho in (0.2, 0.5):
            m = int(Fraction(str(1 - rho)) * n)
            values = x[0].sort().values
            threshold = values[m - 1] if m > 0 else values[0]
            expected = x >= threshold
            assert torch.equal(gmts.select_tokens(x, mask, rho, count="index"), expected)
            if m > 0:
                distinct = len(set(x[0].tolist())) == n
                if distinct:
                    assert int(expected.sum()) == n - m + 1  # the N - floor(0.8 N) + 1


def test_threshold_rules_need_the_batch_scope():
    x = torch.rand(2, 3)
    with pytest.raises(ValueError, match="scope='batch'"):
        gmts.select_tokens(
            x,
            torch.ones_like(x, dtype=torch.bool),
            0.5,
            count="quantile",
            scope="group",
            group_ids=torch.tensor([0, 1]),
        )
    with pytest.raises(ValueError, match="no fixed k"):
        gmts.selection_count(10, 0.2, "quantile")


# --------------------------------------------------------------------------------------------
# the paper preset's zero-score rule


def _first_grpo_step(cfg, lp, adv, mask, entropy):
    """GRPO's first step (old = reference = the policy): the selection of ``cfg`` and the
    gradient of its loss with respect to the log-probs."""
    objective = gmts.ObjectiveConfig.preset("grpo")
    lp_var = lp.clone().requires_grad_(True)
    res = gmts.select_for_update(
        cfg,
        objective,
        logprobs=lp_var,
        old_logprobs=lp,
        advantages=adv,
        response_mask=mask,
        entropy=entropy,
        ref_logprobs=lp,
    )
    loss, _ = gmts.policy_loss(
        lp_var,
        lp,
        adv,
        mask,
        gmts.LossConfig.of(objective, cfg),
        selected=res.selected,
        ref_logprobs=lp,
    )
    (grad,) = torch.autograd.grad(loss, lp_var)
    return res.selected, grad


def test_paper_preset_never_selects_a_zero_score():
    """GRPO's first step: the reference is the policy and r = 1, so omega = A; a zero-advantage
    group gives zero scores. When they reach the top rho, 'select' (TRL, the authors) fills S
    with them and shrinks every selected token's gradient by |nonzero| / S; the paper preset
    ('skip') selects only tokens that carry gradient, so eq. 2's mean is over them."""
    b, t = 8, 5
    lp = -torch.rand(b, t, dtype=F64, generator=torch.Generator().manual_seed(4)) - 0.1
    mask = torch.ones(b, t, dtype=torch.bool)
    rewards = torch.tensor([1, 0, 1, 1, 1, 1, 0, 0], dtype=F64)  # groups of 2: two all-equal
    rewards[2:6] = 1.0
    adv = gmts.group_advantages(rewards, 2)
    entropy = torch.rand(b, t, dtype=F64, generator=torch.Generator().manual_seed(5)) + 0.1
    nonzero = (adv != 0)[:, None].expand(b, t)
    results = {
        rule: _first_grpo_step(
            gmts.SelectionConfig(ratio=0.9, zero_scores=rule), lp, adv, mask, entropy
        )
        for rule in ("skip", "select")
    }
    skip_sel, skip_grad = results["skip"]
    select_sel, select_grad = results["select"]
    k = math.ceil(0.9 * b * t)
    assert int(select_sel.sum()) == k  # exact count, zeros included
    assert bool((skip_sel <= nonzero).all()) and int(skip_sel.sum()) == int(nonzero.sum())
    # same direction, 'select' shrunk by |nonzero| / k
    torch.testing.assert_close(select_grad, skip_grad * int(nonzero.sum()) / k)
    omega = adv[:, None].expand(b, t)
    torch.testing.assert_close(skip_grad, torch.where(nonzero, -omega / int(nonzero.sum()), 0.0))


def test_bottom_selection_keeps_zero_scores_in_s():
    """A bottom selection asks for the smallest gradients, and zeros are the smallest: under
    the paper preset ('skip') they stay selected and count in S = k, as eq. 2 counts them and as
    ETS's bottom selection counts its zero-gradient tokens; 'skip' and 'select' agree there.
    (Dropping them would divide the same sum by the nonzero selected tokens only: 22, not 32.)"""
    b, t, ratio = 8, 5, 0.8
    lp = -torch.rand(b, t, dtype=F64, generator=torch.Generator().manual_seed(6)) - 0.1
    mask = torch.ones(b, t, dtype=torch.bool)
    rewards = torch.tensor([1, 0, 0, 1, 1, 1, 1, 0], dtype=F64)  # groups of 2: one all-equal
    adv = gmts.group_advantages(rewards, 2)
    entropy = torch.rand(b, t, dtype=F64, generator=torch.Generator().manual_seed(7)) + 0.1
    k = math.ceil(ratio * b * t)  # 32
    omega = adv[:, None].expand(b, t)  # GRPO's first step: r = 1, the reference is the policy
    score = (entropy * omega).abs()
    zero = score == 0
    assert int(zero.sum()) == 10 < k
    # eq. 2 by hand: the k lowest scores (the 10 zeros and the 22 lowest non-zero), S = k
    order = sorted(range(b * t), key=lambda i: (float(score.flatten()[i]), i))
    expected = torch.zeros(b * t, dtype=torch.bool)
    expected[order[:k]] = True
    expected = expected.reshape(b, t)
    for rule in ("skip", "select"):
        cfg = gmts.SelectionConfig.preset("paper", ratio=ratio, largest=False, zero_scores=rule)
        selected, grad = _first_grpo_step(cfg, lp, adv, mask, entropy)
        assert torch.equal(selected, expected), rule
        torch.testing.assert_close(grad, torch.where(expected, -omega / k, 0.0))


def test_engines_build_the_loss_from_the_selection_only():
    """normalize and kl_tokens are set on SelectionConfig (docs/architecture.md): outside the
    core's loss module, src/ builds a LossConfig only with LossConfig.of, never field by field."""
    import ast
    from pathlib import Path

    src = Path(gmts.__file__).resolve().parent
    direct = []
    for path in sorted(src.rglob("*.py")):
        if path == src / "core" / "loss.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name == "LossConfig":
                    direct.append(f"{path.relative_to(src)}:{node.lineno}")
    assert direct == [], f"LossConfig built field by field (use LossConfig.of): {direct}"
    uses = [p for p in src.rglob("*.py") if "LossConfig.of(" in p.read_text()]
    assert len(uses) >= 3, uses  # the trainer, TRL and verl
