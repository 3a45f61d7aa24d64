"""The report sections on synthetic measurements whose answers are known by construction."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gmts.analysis.report import build_report, selections


def _case(make, power: float = 1.0):
    """2 groups of 3 answers, 6 tokens each (the last answer shorter); group 1 all rewarded."""
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(6, 6, generator=g) * 0.5 + 0.01
    grad = 3.0 * entropy**power  # log ||grad log pi|| = log 3 + power * log E exactly
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[2, 4:] = False
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    return make(entropy, grad, mask, rewards, 3)


def test_within_answer_correlation_and_slope(synthetic_analysis):
    report = build_report(_case(synthetic_analysis, power=2.0))
    wa = report["within_answer"]
    assert wa["pearson"]["count"] == 6
    assert wa["pearson"]["min"] == pytest.approx(1.0)
    assert wa["slope"]["median"] == pytest.approx(2.0, rel=1e-5)
    assert wa["answers"][2]["tokens"] == 4
    assert wa["answers"][0]["intercept"] == pytest.approx(math.log(3.0), rel=1e-5)


def test_per_group_spearman_and_zero_advantage_groups(synthetic_analysis):
    a = _case(synthetic_analysis)
    report = build_report(a)
    pg = report["per_group"]
    assert pg["skipped_groups"] == 1
    assert pg["groups"][1]["skipped"] == "zero advantage"
    assert pg["groups"][1]["spearman"]["gmts"] is None
    # group 0: ||grad l|| = |A| * 3E and GMTS = |A| * E rank tokens identically
    assert pg["groups"][0]["spearman"]["gmts"] == pytest.approx(1.0)
    # the two wrong answers share |A| = 0.577 != 1.155 of the right one: entropy ranks differ
    assert pg["groups"][0]["spearman"]["entropy"] < 0.99
    assert pg["groups"][0]["gap_gmts_minus_entropy"] > 0
    assert pg["pooled"]["tokens"] == 16


def test_eps_histogram_and_prop31_bins(synthetic_analysis):
    prob = torch.full((6, 6), 0.5)
    prob[0, :3] = 0.99999
    a = synthetic_analysis(
        torch.full((6, 6), 0.3),
        torch.ones(6, 6),
        torch.ones(6, 6, dtype=torch.bool),
        torch.tensor([1.0, 0, 0, 1, 0, 0]),
        3,
        prob=prob,
        logit_grad_norm=torch.full((6, 6), 0.3),
    )
    ep = build_report(a)["eps"]
    assert ep["tokens"] == 36
    assert sum(ep["histogram"]["counts"]) == 36
    assert ep["fraction_below"]["0.001"] == pytest.approx(3 / 36)
    first = ep["prop31"]["bins"][0]  # eps in [0, 1e-4)
    assert first["tokens"] == 3 and first["median_ratio"] == pytest.approx(1.0)


def test_overlaps(synthetic_analysis):
    a = _case(synthetic_analysis)
    report = build_report(a, ratio=0.25)
    ov = report["overlap"]["batch_nonzero_advantage"]
    # on the answers with A != 0, GMTS and the oracle rank identically here
    assert ov["jaccard"]["gmts|oracle"] == pytest.approx(1.0)
    assert ov["oracle_mass_captured"]["gmts"] == pytest.approx(1.0)
    assert ov["candidates"] == 16 and ov["selected"]["gmts"] == 4
    batch = report["overlap"]["batch"]
    assert batch["selected"]["entropy"] == math.ceil(0.25 * 34)
    assert 0 <= batch["oracle_mass_captured"]["entropy"] <= 1
    sel = selections(a, 0.25)
    # ETS picks tokens of the zero-advantage group too; GMTS gives them score 0
    zero_group = a.group_ids == 1
    assert not sel["gmts"][zero_group].any()


def test_report_is_strict_json_and_validates(synthetic_analysis):
    a = _case(synthetic_analysis)
    text = json.dumps(build_report(a), allow_nan=False)
    assert "within_answer" in json.loads(text)
    with pytest.raises(ValueError, match="ratio"):
        build_report(a, ratio=0.0)
    with pytest.raises(ValueError, match="min_tokens"):
        build_report(a, min_tokens=1)
