"""Advantages, the score registry, SelectionConfig and select_for_update."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import gmts

# --------------------------------------------------------------------------------------------
# advantages


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = gmts.group_advantages(rewards, 3)
    std0 = torch.tensor([1.0, 0.0, 0.0]).std().item()  # unbiased, 0.5774
    expected0 = [(1 - 1 / 3) / (std0 + 1e-6), (-1 / 3) / (std0 + 1e-6), (-1 / 3) / (std0 + 1e-6)]
    assert adv[:3].tolist() == pytest.approx(expected0, rel=1e-6)
    assert adv[3:].tolist() == [0.0, 0.0, 0.0]  # equal rewards: zero advantage
    dr = gmts.group_advantages(rewards, 3, std_normalize=False)
    assert dr.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])
    assert gmts.group_advantages(rewards, 1).tolist() == [0.0] * 6
    ints = gmts.group_advantages(torch.tensor([1, 0]), 2)
    assert ints.dtype == torch.float32


def test_dynamic_sampling_keep():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    assert gmts.dynamic_sampling_keep(rewards, 2).tolist() == [False, True, False, False]
    assert gmts.dynamic_sampling_keep(rewards, 4).tolist() == [True, True]


def test_advantage_errors():
    with pytest.raises(ValueError, match="group_size"):
        gmts.group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size"):
        gmts.dynamic_sampling_keep(torch.zeros(6), 0)
    with pytest.raises(ValueError, match="rewards"):
        gmts.group_advantages(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match="finite"):
        gmts.group_advantages(torch.tensor([1.0, float("nan")]), 2)


# --------------------------------------------------------------------------------------------
# scores


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(3, 4, generator=g, requires_grad=True)
    omega = torch.randn(3, 4, generator=g)
    glogit = torch.rand(3, 4, generator=g)
    mask = torch.ones(3, 4, dtype=torch.bool)
    logprobs = -torch.rand(3, 4, generator=g) * 3
    advantages = torch.randn(3, 1, generator=g).expand(3, 4)
    return gmts.ScoreInputs(
        entropy=entropy,
        omega=omega,
        logit_grad_norm=glogit,
        mask=mask,
        logprobs=logprobs,
        advantages=advantages,
        selection=gmts.SelectionConfig(),  # the condition rules read their parameters here
    )


def test_builtin_scores():
    inp = _inputs()
    assert set(gmts.available_scores()) >= {"entropy", "gmts", "random", "omega", "logit-grad"}
    e, w, g = inp.entropy.detach(), inp.omega, inp.logit_grad_norm
    torch.testing.assert_close(gmts.compute_scores("entropy", inp), e)
    torch.testing.assert_close(gmts.compute_scores("gmts", inp), (e * w).abs())
    torch.testing.assert_close(gmts.compute_scores("omega", inp), w.abs())
    torch.testing.assert_close(gmts.compute_scores("logit-grad", inp), (w * g).abs())
    for name in gmts.available_scores():
        scores = gmts.compute_scores(name, inp)
        assert scores.shape == (3, 4) and not scores.requires_grad


def test_random_score_is_seeded_and_leaves_the_global_rng_alone():
    inp = _inputs()
    state = torch.random.get_rng_state()
    a = gmts.compute_scores("random", gmts.ScoreInputs(mask=inp.mask, seed=5))
    b = gmts.compute_scores("random", gmts.ScoreInputs(mask=inp.mask, seed=5))
    c = gmts.compute_scores("random", gmts.ScoreInputs(mask=inp.mask, seed=6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(state, torch.random.get_rng_state())


def test_registry_errors_and_requirements():
    with pytest.raises(ValueError, match="valid scores"):
        gmts.get_score("nope")
    with pytest.raises(ValueError, match="already registered"):
        gmts.register_score("gmts")(lambda inputs: inputs.entropy)
    with pytest.raises(ValueError, match="needs"):
        gmts.compute_scores("gmts", gmts.ScoreInputs(entropy=torch.ones(2, 2)))
    with pytest.raises(ValueError, match="shape"):
        gmts.compute_scores(
            "gmts", gmts.ScoreInputs(entropy=torch.ones(2, 2), omega=torch.ones(2, 3))
        )
    assert gmts.score_requirements("gmts") == {"entropy", "omega"}
    assert gmts.score_requirements("entropy") == {"entropy"}
    assert gmts.score_requirements("none") == frozenset()


def test_register_a_custom_score():
    name = "test-negative-entropy"

    @gmts.register_score(name, requires={"entropy"})
    def negative_entropy(inputs):
        return -inputs.entropy

    try:
        out = gmts.compute_scores(name, gmts.ScoreInputs(entropy=torch.ones(1, 2)))
        assert out.tolist() == [[-1.0, -1.0]]
        assert name in gmts.available_scores()
    finally:  # keep the registry clean for other tests
        from gmts.core import scores

        scores._SCORES.remove(name)


# --------------------------------------------------------------------------------------------
# SelectionConfig


def test_selection_config_defaults_presets_and_help():
    cfg = gmts.SelectionConfig()
    assert (cfg.score, cfg.ratio, cfg.scope, cfg.normalize, cfg.kl_tokens) == (
        "gmts",
        0.2,
        "batch",
        "selected",
        "selected",
    )
    assert (cfg.unit, cfg.count, cfg.omega_weighting) == ("mini-batch", "ceil", False)
    assert (cfg.ties, cfg.zero_scores, cfg.omega) == ("first", "skip", "analytic")
    assert gmts.SelectionConfig.preset("paper") == cfg
    # the authors' code: GMTS per question group, ETS over the whole mini-batch
    ref = gmts.SelectionConfig.preset("reference-code")
    assert (ref.scope, ref.normalize, ref.kl_tokens) == ("group", "per-group", "all")
    assert (ref.count, ref.omega_weighting, ref.unit) == ("floor", True, "mini-batch")
    assert (ref.ties, ref.zero_scores) == ("last", "select")
    ref_ets = gmts.SelectionConfig.preset("reference-code", score="entropy")
    assert (ref_ets.scope, ref_ets.count) == ("batch", "index")
    trl = gmts.SelectionConfig.preset("trl", score="entropy", ratio=0.5)
    assert (trl.scope, trl.unit, trl.normalize, trl.kl_tokens, trl.score, trl.ratio) == (
        "batch",
        "micro-batch",
        "all",
        "all",
        "entropy",
        0.5,
    )
    assert (trl.count, trl.zero_scores) == ("quantile", "select")
    assert not gmts.SelectionConfig(score="none").enabled
    for f in gmts.SelectionConfig.__dataclass_fields__.values():
        assert f.metadata.get("help"), f.name


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"score": "entropyy"}, "valid scores"),
        ({"ratio": 0.0}, "ratio"),
        ({"ratio": 1.01}, "ratio"),
        ({"ratio": float("nan")}, "ratio"),
        ({"scope": "token"}, "scope"),
        ({"normalize": "none"}, "normalize"),
        ({"kl_tokens": "some"}, "kl_tokens"),
        ({"largest": "yes"}, "largest"),
        ({"unit": "step"}, "unit"),
        ({"count": "round"}, "count"),
        ({"count": "quantile", "scope": "group"}, "needs scope='batch'"),
        ({"ties": "random"}, "ties"),
        ({"zero_scores": "drop"}, "zero_scores"),
        ({"omega": "numeric"}, "omega"),
        ({"omega_weighting": 1}, "omega_weighting"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_selection_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gmts.SelectionConfig(**kwargs)


def test_selection_preset_errors():
    with pytest.raises(ValueError, match="valid presets"):
        gmts.SelectionConfig.preset("verl")
    with pytest.raises(ValueError, match="unknown SelectionConfig fields"):
        gmts.SelectionConfig.preset("paper", rho=0.3)


# --------------------------------------------------------------------------------------------
# select_for_update


def _step_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 8
    old = -torch.rand(b, t, generator=g) * 3
    lp = old + 0.3 * torch.randn(b, t, generator=g)
    ref = old + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    entropy = torch.rand(b, t, generator=g)
    mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (b, 1), generator=g)
    return dict(
        logprobs=lp.requires_grad_(True),
        old_logprobs=old,
        advantages=adv,
        response_mask=mask,
        entropy=entropy,
        ref_logprobs=ref,
        group_ids=torch.arange(b) // 3,
    )


def test_select_for_update_gmts_uses_the_objective_omega():
    batch = _step_batch()
    objective = gmts.ObjectiveConfig(kl_coef=0.1, dual_clip=2.0, kl_ratio_correction=True)
    cfg = gmts.SelectionConfig(ratio=0.3)
    result = gmts.select_for_update(cfg, objective, **batch)
    omega = gmts.gradient_coefficient(
        objective,
        batch["logprobs"].detach(),
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        ref_logprobs=batch["ref_logprobs"],
    )
    torch.testing.assert_close(result.scores, (batch["entropy"] * omega).abs())
    expected = gmts.select_tokens(result.scores, batch["response_mask"], 0.3)
    assert torch.equal(result.selected, expected)
    assert result.threshold == pytest.approx(result.scores[expected].min().item())
    assert not result.scores.requires_grad


def test_select_for_update_variants():
    batch = _step_batch(1)
    objective = gmts.ObjectiveConfig.preset("dapo")
    none = gmts.select_for_update(gmts.SelectionConfig(score="none"), objective, **batch)
    assert none == gmts.SelectionResult(selected=None, scores=None, threshold=None)
    ets = gmts.select_for_update(
        gmts.SelectionConfig(score="entropy", scope="group", largest=False), objective, **batch
    )
    expected = gmts.select_tokens(
        batch["entropy"],
        batch["response_mask"],
        0.2,
        scope="group",
        group_ids=batch["group_ids"],
        largest=False,
    )
    assert torch.equal(ets.selected, expected)
    r1 = gmts.select_for_update(gmts.SelectionConfig(score="random"), objective, step=3, **batch)
    r2 = gmts.select_for_update(gmts.SelectionConfig(score="random"), objective, step=3, **batch)
    r3 = gmts.select_for_update(gmts.SelectionConfig(score="random"), objective, step=4, **batch)
    assert torch.equal(r1.selected, r2.selected) and not torch.equal(r1.scores, r3.scores)
    with pytest.raises(ValueError, match="needs"):
        gmts.select_for_update(gmts.SelectionConfig(score="logit-grad"), objective, **batch)
    no_groups = {**batch, "group_ids": None}
    with pytest.raises(ValueError, match="group_ids"):
        gmts.select_for_update(gmts.SelectionConfig(scope="group"), objective, **no_groups)


def test_selection_then_loss_end_to_end():
    """Eq. 2 by hand from the step's selection: mean of -l over the selected tokens."""
    batch = _step_batch(2)
    objective = gmts.ObjectiveConfig.preset("dapo")
    result = gmts.select_for_update(gmts.SelectionConfig(), objective, **batch)
    loss, sums = gmts.policy_loss(
        batch["logprobs"],
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
        gmts.LossConfig.of(objective, gmts.SelectionConfig()),
        selected=result.selected,
        entropy=batch["entropy"],
    )
    loss.backward()
    omega = gmts.gradient_coefficient(
        objective,
        batch["logprobs"].detach(),
        batch["old_logprobs"],
        batch["advantages"],
        batch["response_mask"],
    )
    n_sel = int(result.selected.sum())
    expected = torch.where(result.selected, -omega / n_sel, 0.0)
    torch.testing.assert_close(batch["logprobs"].grad, expected)
    assert result.threshold == pytest.approx(result.scores[result.selected].min().item())
    n_valid = int(batch["response_mask"].sum())
    metrics = sums.metrics()
    assert metrics["selected_fraction"] == pytest.approx(math.ceil(0.2 * n_valid) / n_valid)


def test_select_for_update_count_floor_and_omega_weighting():
    """The authors' code: k = floor(rho N) and, under GRPO's aggregation with normalize=all,
    omega / |o_i|; under eq. 2 (normalize=selected) the loss is a token-mean: no weight."""
    batch = _step_batch(3)
    objective = gmts.ObjectiveConfig.preset("grpo", kl_coef=0.0)
    mask = batch["response_mask"]
    cfg = gmts.SelectionConfig(ratio=0.3, count="floor", omega_weighting=True, normalize="all")
    result = gmts.select_for_update(cfg, objective, **{**batch, "ref_logprobs": None})
    omega = gmts.gradient_coefficient(
        objective, batch["logprobs"].detach(), batch["old_logprobs"], batch["advantages"], mask
    )
    lengths = mask.sum(-1, keepdim=True).clamp_min(1)
    expected = (batch["entropy"] * omega / lengths).abs()
    torch.testing.assert_close(result.scores[mask], expected[mask])  # padding is never read
    n_valid = int(mask.sum())
    assert int(result.selected.sum()) == math.floor(0.3 * n_valid)
    # under token-mean the weight is 1: the ranking of plain |E * omega|
    dapo = gmts.select_for_update(cfg, gmts.ObjectiveConfig.preset("dapo"), **batch)
    torch.testing.assert_close(dapo.scores, (batch["entropy"] * omega).abs())
    # eq. 2 under GRPO is a token-mean too
    eq2 = dataclasses.replace(cfg, normalize="selected")
    grpo_eq2 = gmts.select_for_update(eq2, objective, **{**batch, "ref_logprobs": None})
    torch.testing.assert_close(grpo_eq2.scores, (batch["entropy"] * omega).abs())
