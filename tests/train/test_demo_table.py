"""gmts demo's statistics and table, on hand-made curves (no training): the paired
differences against scipy, the pairing by seed, the verdict and both table layouts."""

from __future__ import annotations

import math

import pytest

from gmts.demo.comparisons import compare
from gmts.demo.records import DemoResult, DemoRow
from gmts.demo.settings import demo_recipe
from gmts.demo.stats import paired_difference, t_quantile_975
from gmts.demo.tables import format_table


def test_t_quantile_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (*range(1, 41), 60, 100, 1000):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1.5e-3), df
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile_975(0)


def test_paired_difference_is_the_t_interval_of_the_differences() -> None:
    stats = pytest.importorskip("scipy.stats")
    a, b = [40.0, 42.5, 39.0, 45.0], [37.0, 41.0, 38.5, 40.0]
    d = paired_difference(a, b)
    diffs = [x - y for x, y in zip(a, b)]
    assert d.values == tuple(diffs) and d.n == 4 and (d.ahead, d.behind) == (4, 0)
    low, high = stats.t.interval(0.95, 3, loc=sum(diffs) / 4, scale=stats.sem(diffs))
    assert (d.low, d.high) == (pytest.approx(low, abs=1e-3), pytest.approx(high, abs=1e-3))
    assert d.clear is False  # every seed one way, yet the spread is too large for 4 seeds
    assert paired_difference([x + 3 for x in a], b).clear  # 3 points more: clear
    mixed = paired_difference([1.0, -1.0, 2.0], [0.0, 0.0, 0.0])
    assert mixed.clear is False and (mixed.ahead, mixed.behind) == (2, 1)
    one = paired_difference([3.0], [1.0])
    assert (one.mean, one.std, one.low, one.clear) == (2.0, None, None, None)
    with pytest.raises(ValueError, match="same number"):
        paired_difference([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        paired_difference([math.nan], [1.0])


def _row(method: str, seed: int, curve: list[float]) -> DemoRow:
    """A run evaluated at steps 0, 50, 100 with these average@16 values (pass@16 = 2x)."""
    return DemoRow(
        method=method,
        seed=seed,
        curve={
            s: {"average@16": a, "pass@16": min(1.0, 2 * a)} for s, a in zip((0, 50, 100), curve)
        },
        step_time_s=0.25,
        selected_fraction=1.0 if method == "all tokens" else 0.2,
        train_time_s=30.0,
        run_dir=f"runs/demo/seed{seed}/{method}",
    )


def _result(rows: list[DemoRow], seeds: list[int]) -> DemoResult:
    return DemoResult(
        config=demo_recipe(["optim.steps=100"]),
        warm_starts={},
        warm_start_s=0.0,
        seeds=seeds,
        rows=rows,
    )


def test_one_seed_table_is_exact_and_says_it_is_one_seed() -> None:
    result = _result(
        [_row("all tokens", 0, [0.1, 0.4, 0.5]), _row("GMTS top 20%", 0, [0.1, 0.35, 0.55])], [0]
    )
    table = format_table(result).splitlines()
    assert table[0].endswith("lr 0.0002, seed 0")
    assert table[2].split() == ["method", "0", "50", "100", "gain", "mean", "pass@16", "s/step"] + [
        "selected"
    ]
    assert table[4].split() == ["all", "tokens"] + [
        "10.0",
        "40.0",
        "50.0",
        "+40.0p",
        "35.0",
        "100.0",
        "0.250",
        "1.000",
    ]
    assert table[5].split()[3:6] == ["10.0", "35.0", "55.0"]
    assert "one seed" in table[6] and "--seeds 3" in table[6]


def test_seeds_table_pairs_by_seed_and_gives_a_verdict() -> None:
    ets = [[0.1, 0.30, 0.45], [0.1, 0.28, 0.40], [0.1, 0.33, 0.50]]
    gmts = [[0.1, 0.34, 0.50], [0.1, 0.32, 0.45], [0.1, 0.37, 0.49]]
    rows = [_row("ETS top 20%", s, c) for s, c in enumerate(ets)]
    rows += [_row("GMTS top 20%", s, c) for s, c in enumerate(gmts)]
    result = _result(rows, [0, 1, 2])
    (cmp,) = compare(result)
    assert (cmp.a, cmp.b) == ("GMTS top 20%", "ETS top 20%")
    # mean over training (trapezoid over 0-50-100) per seed, in points
    expected = [
        100 * ((g[0] + 2 * g[1] + g[2]) - (e[0] + 2 * e[1] + e[2])) / 4 for g, e in zip(gmts, ets)
    ]
    assert cmp.mean.values == pytest.approx(tuple(expected))
    assert cmp.final.values == pytest.approx((5.0, 5.0, -1.0))
    assert cmp.mean.clear and not cmp.final.clear
    text = format_table(result)
    assert "seeds 0-2 (3), each from its warm start" in text and "mean±std over 3 seeds" in text
    ets_line = next(line for line in text.splitlines() if line.startswith("ETS top 20%"))
    assert ets_line.split()[3:6] == ["10.0±0.0", "30.3±2.5", "45.0±5.0"]
    mean_line, final_line = (
        line for line in text.splitlines() if line.strip().startswith(("GMTS top 20% -", "final"))
    )
    assert "GMTS ahead on 3 of 3 seeds; GMTS ahead by more than the seed spread" in mean_line
    assert "GMTS ahead on 2 of 3 seeds; within the seed spread (no clear order)" in final_line


def test_compare_leaves_out_a_seed_missing_one_run() -> None:
    rows = [
        _row("all tokens", 0, [0.1, 0.4, 0.5]),
        _row("all tokens", 1, [0.1, 0.4, 0.6]),
        _row("GMTS top 20%", 1, [0.1, 0.3, 0.5]),
    ]
    (cmp,) = compare(_result(rows, [0, 1]))
    assert cmp.mean.n == 1 and cmp.final.values == pytest.approx((-10.0,))


def test_curves_png_draws_each_methods_mean_and_min_max_over_seeds(tmp_path) -> None:
    """curves.png: per method and step, the mean and the min-max band of the seeds' values (the
    held-out curve as logged; a training metric after its moving average), at the steps every
    seed logged; a one-seed result draws the same curve without a band."""
    import json

    from gmts.demo.plot import SMOOTH, method_curve, plot_demo

    rows = []
    for seed, offset in ((0, 0.0), (1, 0.2), (2, 0.1)):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        steps = [1, 2, 3] if seed else [1, 2, 3, 4]  # seed 0 logged one step more
        lines = [{"step": s, "reward/accuracy": offset + s} for s in steps]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        rows.append(_row("GMTS top 20%", seed, [0.1 + offset, 0.3, 0.5 - offset]))
        rows[-1].run_dir = str(run)
        evals = [{"step": s, **m} for s, m in rows[-1].curve.items()]
        (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    held_out = method_curve(rows, "average@16")
    assert held_out.held_out and held_out.steps == [0, 50, 100] and held_out.seeds == 3
    assert held_out.mean == pytest.approx([0.2, 0.3, 0.4])
    assert held_out.low == pytest.approx([0.1, 0.3, 0.3])
    assert held_out.high == pytest.approx([0.3, 0.3, 0.5])
    training = method_curve(rows, "reward/accuracy")
    assert not training.held_out and training.steps == [1, 2, 3]
    # the trailing moving average of 1, 2, 3 (+ offset) is 1, 1.5, 2 (+ offset) for SMOOTH >= 3
    assert SMOOTH >= 3 and training.mean == pytest.approx([1.1, 1.6, 2.1])
    assert training.low == pytest.approx([1.0, 1.5, 2.0])
    assert training.high == pytest.approx([1.2, 1.7, 2.2])
    for seeds in ([0, 1, 2], [0]):
        result = _result([r for r in rows if r.seed in seeds], seeds)
        out = plot_demo(result, tmp_path / f"curves{len(seeds)}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
