"""select_tokens against an obviously-correct sort-based reference, plus its invariants."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gmts


def reference_select(scores, mask, ratio, largest=True, unit_row=None):
    """Per unit: sort valid tokens by (score, row-major index) and keep the first k."""
    b, t = scores.shape
    unit_row = [0] * b if unit_row is None else [int(u) for u in unit_row]
    values = scores.double().tolist()
    out = torch.zeros(b, t, dtype=torch.bool)
    for unit in sorted(set(unit_row)):
        toks = [(i, j) for i in range(b) if unit_row[i] == unit for j in range(t) if mask[i, j]]
        toks.sort(key=lambda ij: -values[ij[0]][ij[1]] if largest else values[ij[0]][ij[1]])
        k = math.ceil(Decimal(repr(float(ratio))) * len(toks)) if toks else 0
        k = max(k, 1) if toks else 0
        for i, j in toks[:k]:
            out[i, j] = True
    return out


@st.composite
def selection_problems(draw):
    b = draw(st.integers(1, 6))
    t = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["continuous", "few-values", "mostly-zero", "signed-zero"]))
    if kind == "continuous":
        scores = torch.randn(b, t, generator=g)
    elif kind == "few-values":
        scores = torch.randint(-2, 3, (b, t), generator=g).float()
    elif kind == "mostly-zero":
        scores = torch.where(
            torch.rand(b, t, generator=g) < 0.9, 0.0, torch.rand(b, t, generator=g)
        )
    else:
        scores = torch.where(torch.rand(b, t, generator=g) < 0.5, -0.0, 0.0)
    mask = torch.rand(b, t, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))
    scores = torch.where(
        mask, scores, torch.full_like(scores, float("nan"))
    )  # padding is never read
    ratio = draw(st.sampled_from([0.01, 0.1, 0.2, 1 / 3, 0.5, 0.7, 0.9, 1.0]))
    largest = draw(st.booleans())
    scope = draw(st.sampled_from(list(gmts.SCOPES)))
    group_ids = torch.randint(0, 3, (b,), generator=g) * 7  # sparse global ids
    return scores, mask, ratio, largest, scope, group_ids


def _unit_row(scope, b, group_ids):
    if scope == "batch":
        return [0] * b
    if scope == "sequence":
        return list(range(b))
    return group_ids.tolist()


@settings(max_examples=300, deadline=None)
@given(selection_problems())
def test_select_tokens_equals_the_sort_reference(problem):
    scores, mask, ratio, largest, scope, group_ids = problem
    selected = gmts.select_tokens(
        scores, mask, ratio, largest=largest, scope=scope, group_ids=group_ids
    )
    expected = reference_select(
        scores, mask, ratio, largest, _unit_row(scope, scores.shape[0], group_ids)
    )
    assert selected.dtype == torch.bool and selected.shape == scores.shape
    assert torch.equal(selected, expected)
    assert not bool((selected & ~mask).any())


@pytest.mark.parametrize("largest", [True, False])
def test_invariants_with_ninety_percent_zero_scores(largest):
    g = torch.Generator().manual_seed(0)
    b, t = 16, 200
    scores = torch.where(torch.rand(b, t, generator=g) < 0.9, 0.0, torch.rand(b, t, generator=g))
    mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (b, 1), generator=g)
    sel = gmts.select_tokens(scores, mask, 0.2, largest=largest)
    n = int(mask.sum())
    assert int(sel.sum()) == math.ceil(0.2 * n)  # exact count despite the sea of ties
    assert not bool((sel & ~mask).any())
    unselected = mask & ~sel
    if largest:
        assert scores[sel].min() >= scores[unselected].max()
    else:
        assert scores[sel].max() <= scores[unselected].min()
    assert torch.equal(sel, gmts.select_tokens(scores, mask, 0.2, largest=largest))  # determinism
    assert torch.equal(sel, reference_select(scores, mask, 0.2, largest))


def test_tie_rule_prefers_row_major_order():
    scores = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    sel = gmts.select_tokens(scores, mask, 0.5)  # k = 3 of 6 equal scores
    assert sel.tolist() == [[True, True, True], [False, False, False]]
    scores = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    sel = gmts.select_tokens(scores, mask, 0.5)  # 2.0, 1.0, then the first 0.0
    assert sel.tolist() == [[True, True, False], [False, False, True]]
    bottom = gmts.select_tokens(scores, mask, 0.5, largest=False)
    assert bottom.tolist() == [[False, True, True], [True, False, False]]


def test_selection_count_is_exact_on_the_decimal_ratio():
    assert gmts.selection_count(10, 0.2) == 2
    assert gmts.selection_count(10, 0.7) == 7  # 0.7 * 10 == 7.000000000000001 in floats
    assert gmts.selection_count(10, 0.1) == 1
    assert gmts.selection_count(3, 1 / 3) == 1
    assert gmts.selection_count(1, 0.01) == 1
    assert gmts.selection_count(0, 0.5) == 0
    assert gmts.selection_count(7, 1.0) == 7
    for n in range(1, 200):
        for ratio in (0.05, 0.1, 0.2, 0.3, 0.6, 0.7, 0.9):
            assert gmts.selection_count(n, ratio) == math.ceil(Decimal(str(ratio)) * n)


def test_scope_equivalences():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(6, 10, generator=g)
    mask = torch.rand(6, 10, generator=g) < 0.7
    seq = gmts.select_tokens(scores, mask, 0.3, scope="sequence")
    per_row = torch.stack(
        [gmts.select_tokens(scores[i : i + 1], mask[i : i + 1], 0.3)[0] for i in range(6)]
    )
    assert torch.equal(seq, per_row)
    one_group = gmts.select_tokens(scores, mask, 0.3, scope="group", group_ids=torch.full((6,), 5))
    assert torch.equal(one_group, gmts.select_tokens(scores, mask, 0.3))
    own_group = gmts.select_tokens(scores, mask, 0.3, scope="group", group_ids=torch.arange(6))
    assert torch.equal(own_group, seq)
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    by_group = gmts.select_tokens(scores, mask, 0.3, scope="group", group_ids=groups)
    for gid in range(3):
        rows = groups == gid
        assert torch.equal(by_group[rows], gmts.select_tokens(scores[rows], mask[rows], 0.3))


def test_ratio_one_selects_every_valid_token_and_empty_gives_nothing():
    scores = torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(gmts.select_tokens(scores, mask, 1.0), mask)
    none = torch.zeros_like(mask)
    assert not bool(gmts.select_tokens(scores, none, 0.2).any())
    assert not bool(gmts.select_tokens(scores, none, 0.2, scope="sequence").any())
    seq = gmts.select_tokens(scores, mask, 0.2, scope="sequence")
    assert seq.sum(1).tolist() == [1, 0, 1]
    empty = torch.zeros(0, 5)
    assert gmts.select_tokens(empty, empty.bool(), 0.5).shape == (0, 5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_score_dtypes(dtype):
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(5, 7, generator=g).to(dtype)
    mask = torch.rand(5, 7, generator=g) < 0.8
    if dtype == torch.float64:
        scores[0, 0] = 1.0
        scores[0, 1] = 1.0 + 2**-40  # distinct in float64, equal in float32
    sel = gmts.select_tokens(scores, mask, 0.4)
    assert torch.equal(sel, reference_select(scores, mask, 0.4))


def test_extreme_and_negative_scores():
    scores = torch.tensor([[-3.4e38, -1e-45, 0.0, 1e-45, 3.4e38, -0.0, -1.0, 1.0]])
    mask = torch.ones_like(scores, dtype=torch.bool)
    for ratio in (0.125, 0.25, 0.5, 0.75, 1.0):
        for largest in (True, False):
            sel = gmts.select_tokens(scores, mask, ratio, largest=largest)
            assert torch.equal(sel, reference_select(scores, mask, ratio, largest))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_at_the_dtype_limits_with_padding(dtype):
    """Valid scores equal to the dtype's lowest/highest finite value (the value the batch path
    pads masked positions with) still never select a masked position."""
    info = torch.finfo(dtype)
    rows = [[info.min, info.max, info.min, 0.0], [info.max, info.min, 1.0, 2.0]]
    scores = torch.tensor(rows, dtype=dtype)
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])
    for ratio in (0.2, 0.5, 0.8, 1.0):
        for largest in (True, False):
            sel = gmts.select_tokens(scores, mask, ratio, largest=largest)
            assert torch.equal(sel, reference_select(scores, mask, ratio, largest))


def test_selection_threshold():
    scores = torch.tensor([[3.0, 1.0, 2.0], [0.5, 5.0, 4.0]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    sel = gmts.select_tokens(scores, mask, 0.5)
    assert gmts.selection_threshold(scores, sel) == 3.0
    bottom = gmts.select_tokens(scores, mask, 0.5, largest=False)
    assert gmts.selection_threshold(scores, bottom, largest=False) == 2.0
    assert math.isnan(gmts.selection_threshold(scores, torch.zeros_like(mask)))


def test_scores_with_gradients_are_not_a_problem():
    scores = torch.randn(2, 5, requires_grad=True)
    sel = gmts.select_tokens(scores, torch.ones(2, 5, dtype=torch.bool), 0.5)
    assert not sel.requires_grad and int(sel.sum()) == 5


def test_bad_inputs_raise_value_errors():
    scores = torch.randn(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    for bad in (0, 0.0, -0.1, 1.5, float("nan"), float("inf"), True, "0.2", None):
        with pytest.raises(ValueError, match="ratio"):
            gmts.select_tokens(scores, mask, bad)
    with pytest.raises(ValueError, match="scope"):
        gmts.select_tokens(scores, mask, 0.5, scope="token")
    with pytest.raises(ValueError, match="mask"):
        gmts.select_tokens(scores, mask[:, :2], 0.5)
    with pytest.raises(ValueError, match="mask"):
        gmts.select_tokens(scores, mask.long(), 0.5)
    with pytest.raises(ValueError, match="scores"):
        gmts.select_tokens(scores[0], mask[0], 0.5)
    with pytest.raises(ValueError, match="scores"):
        gmts.select_tokens(scores.long(), mask, 0.5)
    for value in (float("nan"), float("inf"), -float("inf")):
        bad = scores.clone()
        bad[1, 2] = value
        with pytest.raises(ValueError, match="finite"):
            gmts.select_tokens(bad, mask, 0.5)
        masked = mask.clone()
        masked[1, 2] = False
        assert int(gmts.select_tokens(bad, masked, 0.5).sum()) == 3  # padding is never read
    with pytest.raises(ValueError, match="group_ids"):
        gmts.select_tokens(scores, mask, 0.5, scope="group")
    with pytest.raises(ValueError, match="group_ids"):
        gmts.select_tokens(scores, mask, 0.5, scope="group", group_ids=torch.tensor([0]))
    with pytest.raises(ValueError, match="group_ids"):
        gmts.select_tokens(scores, mask, 0.5, scope="group", group_ids=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="largest"):
        gmts.select_tokens(scores, mask, 0.5, largest=1)


@pytest.mark.slow
def test_more_than_two_to_the_24_tokens():
    """torch.quantile refuses inputs above 2^24 elements; the radix select does not care."""
    n = 2**24 + 1000
    b = 8
    t = n // b
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(b, t, generator=g)
    scores[:, ::3] = 0.5  # many exact ties at a value near the median
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[-1, -10:] = False
    sel = gmts.select_tokens(scores, mask, 0.2)
    n_valid = int(mask.sum())
    assert n_valid > 2**24
    assert int(sel.sum()) == gmts.selection_count(n_valid, 0.2)
    assert not bool((sel & ~mask).any())
    assert scores[sel].min() >= scores[mask & ~sel].max()
    bottom = gmts.select_tokens(scores, mask, 0.5, largest=False)
    assert int(bottom.sum()) == gmts.selection_count(n_valid, 0.5)
    assert scores[bottom].max() <= scores[mask & ~bottom].min()
    # the ties at 0.5 straddle the bottom-half boundary: earliest ones in row-major order win
    ties = mask & (scores == 0.5)
    taken = bottom & ties
    flat_taken = taken.reshape(-1).nonzero().squeeze(1)
    flat_ties = ties.reshape(-1).nonzero().squeeze(1)
    assert 0 < flat_taken.numel() < flat_ties.numel()
    assert torch.equal(flat_taken, flat_ties[: flat_taken.numel()])


def test_row_permutation_equivariance_for_distinct_scores():
    """With distinct scores the tie rule is never used: permuting rows permutes the mask."""
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(7, 9, generator=g)
    mask = torch.rand(7, 9, generator=g) < 0.7
    groups = torch.tensor([3, 1, 3, 0, 1, 0, 3])
    perm = torch.randperm(7, generator=g)
    for scope in gmts.SCOPES:
        for largest in (True, False):
            kw = dict(largest=largest, scope=scope)
            sel = gmts.select_tokens(scores, mask, 0.35, group_ids=groups, **kw)
            sel_p = gmts.select_tokens(scores[perm], mask[perm], 0.35, group_ids=groups[perm], **kw)
            assert torch.equal(sel_p, sel[perm])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    g = torch.Generator().manual_seed(3)
    scores = torch.where(
        torch.rand(64, 300, generator=g) < 0.5, 0.0, torch.rand(64, 300, generator=g)
    )
    mask = torch.rand(64, 300, generator=g) < 0.8
    groups = torch.arange(64) // 16
    for scope in gmts.SCOPES:
        cpu = gmts.select_tokens(scores, mask, 0.2, scope=scope, group_ids=groups)
        gpu = gmts.select_tokens(
            scores.cuda(), mask.cuda(), 0.2, scope=scope, group_ids=groups.cuda()
        )
        assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)


def test_numpy_ratios_use_their_shortest_decimal():
    np = pytest.importorskip("numpy")
    assert gmts.selection_count(10, np.float32(0.2)) == 2  # float32 0.2 is 0.2000000029...
    assert gmts.selection_count(10, np.float64(0.7)) == 7
    sel = gmts.select_tokens(torch.randn(2, 5), torch.ones(2, 5, dtype=torch.bool), np.float32(0.2))
    assert int(sel.sum()) == 2
