"""The single-process batch-scope fast path (sampled bracket + kthvalue) equals the radix path.

Both paths share the tie rule, so the masks must be identical; scope 'group' with one group
forces the radix path on the same tokens.
"""

from __future__ import annotations

import pytest
import torch

import gmts
from gmts.core.selection import _kth_best


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("kind", ["continuous", "fine-ties", "coarse-ties", "mostly-zero"])
def test_batch_fast_path_equals_radix_path_above_bracket_size(kind: str, largest: bool) -> None:
    g = torch.Generator().manual_seed(7)
    rows, cols = 640, 2048  # 1.3M positions: above the 2^20 bracket threshold
    scores = torch.rand(rows, cols, generator=g)
    if kind == "fine-ties":
        scores = (scores * 4096).floor()  # ~250 equal scores per value: ties inside the bracket
    elif kind == "coarse-ties":
        scores = (scores * 50).floor()  # 50 distinct values: big tie blocks at the threshold
    elif kind == "mostly-zero":
        scores = torch.where(torch.rand(rows, cols, generator=g) < 0.9, 0.0, scores)
    mask = torch.rand(rows, cols, generator=g) < 0.8
    one_group = torch.zeros(rows, dtype=torch.long)
    for ratio in (0.2, 0.05):
        fast = gmts.select_tokens(scores, mask, ratio, largest=largest)
        radix = gmts.select_tokens(
            scores, mask, ratio, largest=largest, scope="group", group_ids=one_group
        )
        assert torch.equal(fast, radix)
        n = int(mask.sum())
        assert int(fast.sum()) == gmts.selection_count(n, ratio)
        assert not bool((fast & ~mask).any())


@pytest.mark.parametrize("largest", [True, False])
def test_kth_best_is_the_order_statistic(largest: bool) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1 << 21, generator=g)
    x[:1000] = float("-inf") if largest else float("inf")  # padding-like worst values
    x[1000:3000] = 0.25  # a block of ties
    ordered = x.sort(descending=largest).values
    for k in (1, 17, 1 << 18, 1 << 20, (1 << 21) - 1000):
        kth, n_better, n_equal = _kth_best(x, k, largest)
        assert float(kth) == float(ordered[k - 1])
        if n_better is not None:  # the bracket was used: its counts are exact
            better = x > kth if largest else x < kth
            assert n_better == int(better.sum())
            assert n_equal == int((x == kth).sum())
