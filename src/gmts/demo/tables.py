"""The demo's printed result: one seed's exact table, or the seeds' mean±std table with the
paired differences in words; then each seed's warm start, the time and the plot."""

from __future__ import annotations

from gmts.demo.comparisons import compare
from gmts.demo.records import DemoResult
from gmts.demo.stats import PairedDifference, mean_std


def format_table(result: DemoResult) -> str:
    """The demo's printed result: one seed's exact table, or the seeds' mean±std table with the
    paired differences; then the warm start, the time and the plot."""
    c = result.config
    r = c.rollout
    seeds = result.seeds or sorted({row.seed for row in result.rows})
    start = "from its warm start" if c.model.path == "embedded" else f"from {c.model.path}"
    seed_text = (
        f"seed {seeds[0]}"
        if len(seeds) == 1
        else f"seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), each {start}"
    )
    lines = [
        f"{c.algorithm.upper()} on '{c.data.task}': {c.optim.steps} steps x "
        f"{r.questions_per_batch} questions x {r.group_size} samples, lr {c.optim.lr:g}, "
        + seed_text
    ]
    lines += _one_seed_table(result) if len(seeds) == 1 else _seeds_table(result, len(seeds))
    lines += _warm_start_lines(result)
    lines.append(f"total {result.total_s:.0f} s")
    if result.plot:
        lines.append(f"curves: {result.plot}  (view: xdg-open {result.plot})")
    return "\n".join(lines)


def _one_seed_table(result: DemoResult) -> list[str]:
    """One seed's runs, held-out average@k in %, exactly as measured."""
    c = result.config
    k = c.data.eval_samples
    steps = sorted({s for row in result.rows for s in row.curve})
    cols = (
        f"{'method':<14}"
        + "".join(f"{s:>7d}" for s in steps)
        + f" {'gain':>7} {'mean':>6} {'pass@' + str(k):>8} {'s/step':>7} {'selected':>9}"
    )
    lines = [
        f"held-out average@{k} (%) on {c.data.eval_questions} questions by RL step (0: the warm "
        f"start); mean: area under that curve / steps; pass@{k} (%) at the end",
        cols,
        "-" * len(cols),
    ]
    for row in result.rows:
        curve = dict(row.average(k))
        first, last = curve[steps[0]], curve[steps[-1]]
        lines.append(
            f"{row.method:<14}"
            + "".join(f"{100 * curve[s]:>7.1f}" if s in curve else f"{'-':>7}" for s in steps)
            + f" {100 * (last - first):>+6.1f}p {100 * row.area_mean(k):>6.1f}"
            + f" {100 * row.curve[steps[-1]][f'pass@{k}']:>8.1f}"
            + f" {row.step_time_s:>7.3f} {row.selected_fraction:>9.3f}"
        )
    lines.append(
        "one seed: this order of the methods is not a measurement (the seed and the CPU's "
        "floating-point path move every curve); --seeds 3 measures the spread"
    )
    return lines


def _pm(values: list[float], signed: bool = False) -> str:
    """'mean±std' of values already in points (the mean alone for one value)."""
    mean, std = mean_std(values)
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}"
    return text if std is None else f"{text}±{std:.1f}"


def _seeds_table(result: DemoResult, n_seeds: int) -> list[str]:
    """Mean±std over seeds of each method's curve, then the paired differences."""
    c = result.config
    k = c.data.eval_samples
    steps = sorted({s for row in result.rows for s in row.curve})
    w = 11
    cols = (
        f"{'method':<14}"
        + "".join(f"{s:>{w}d}" for s in steps)
        + f"{'gain':>{w}}{'mean':>{w}}{'pass@' + str(k):>{w}}{'s/step':>8}{'selected':>9}"
    )
    lines = [
        f"held-out average@{k} (%) on {c.data.eval_questions} questions by RL step (0: the warm "
        f"start), mean±std over {n_seeds} seeds; mean: area under the curve / steps; "
        f"pass@{k} (%) at the end",
        cols,
        "-" * len(cols),
    ]
    for method in result.methods:
        runs = result.runs(method)
        cells = []
        for s in steps:
            values = [100 * dict(run.average(k))[s] for run in runs if s in run.curve]
            cells.append(_pm(values) if values else "-")
        lines.append(
            f"{method:<14}"
            + "".join(f"{cell:>{w}}" for cell in cells)
            + f"{_pm([100 * run.gain(k) for run in runs], signed=True):>{w}}"
            + f"{_pm([100 * run.area_mean(k) for run in runs]):>{w}}"
            + f"{_pm([100 * run.curve[max(run.curve)][f'pass@{k}'] for run in runs]):>{w}}"
            + f"{mean_std([run.step_time_s for run in runs])[0]:>8.3f}"
            + f"{mean_std([run.selected_fraction for run in runs])[0]:>9.3f}"
        )
    comparisons = compare(result)
    if comparisons:
        lines.append(
            "paired by seed, A - B in points (mean: over training; final: last evaluation): "
            "mean±std over seeds [95% t interval]"
        )
        for cmp in comparisons:
            name = f"{cmp.a} - {cmp.b}"
            for what, d in (("mean", cmp.mean), ("final", cmp.final)):
                lines.append(f"  {name:<28} {what:<5} {describe_difference(d, cmp.a, cmp.b)}")
                name = ""
    return lines


def describe_difference(d: PairedDifference, a: str, b: str) -> str:
    """One paired difference in words: its size, its interval, the seeds each way, the verdict
    (clear only when the 95% interval excludes 0)."""
    if d.std is None or d.low is None or d.high is None:
        return f"{d.mean:+.1f} (one seed: no spread)"
    short_a, short_b = a.split()[0], b.split()[0]
    if d.clear:
        leader = short_a if d.mean > 0 else short_b
        verdict = f"{leader} ahead by more than the seed spread"
    else:
        verdict = "within the seed spread (no clear order)"
    return (
        f"{d.mean:+5.1f}±{d.std:.1f} [{d.low:+.1f}, {d.high:+.1f}]; {short_a} ahead on {d.ahead} "
        f"of {d.n} seeds; {verdict}"
    )


def _warm_start_lines(result: DemoResult) -> list[str]:
    """How each seed's warm start ended (its early stop, or that it missed it) and the time."""
    lines = []
    several = len(result.warm_starts) > 1
    for seed, w in sorted(result.warm_starts.items()):
        config = w.get("settings", {}).get("config", {})
        target = config.get("stop_at_greedy")
        check = w.get("check_accuracy")
        window = config.get("stop_window", 1)
        over = f", mean of the last {window} checks" if window > 1 else ""
        if target is None or check is None:
            stop = ""
        elif check >= target:
            stop = f" (stopped at {100 * check:.1f}% greedy on the check questions{over})"
        else:
            stop = (
                f" (did NOT reach its {100 * target:.0f}% check target: {100 * check:.1f}%{over})"
            )
        name = f"warm start of seed {seed}" if several else "warm start"
        lines.append(
            f"{name}: {w['steps_done']} supervised steps{stop}, held-out greedy accuracy "
            f"{100 * w['greedy_accuracy']:.1f}%"
        )
    if lines:
        summed = " summed over the seeds" if several else ""
        lines.append(
            f"warm start time: {result.warm_start_s:.0f} s{summed} (cached after the first run)"
        )
    return lines
