"""Item 1: top-rho token selection at scale.

Compares, on the same (B, T) scores and response mask:
- ``gmts.select_tokens`` (the library's exact top-k selection),
- the ``torch.quantile`` threshold TRL uses (``scores >= quantile(valid scores, 1 - rho)``),
  which raises above 2**24 elements: the failure is recorded as the result,
- a full sort of the valid scores (threshold = the k-th largest value),
- for reference, ``torch.kthvalue`` of the valid scores (linear-time selection; keeps ties, so
  it is not an exact-count selection), to show what a threshold-only method costs.

Scores are i.i.d. uniform floats (``torch.rand``: multiples of 2**-24, so ties do occur at 16M+); about 3/4 of each row is valid (right padding with
random lengths). Each figure is the median over repeats, after one untimed warm-up round; the three methods
run round-robin so load changes on the shared machine hit all of them alike.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from bench_common import BenchOptions, core_api, goal, interleaved_times, ratio, synchronizer

RATIO = 0.2
ROW_LENGTH = 4096  # T: response positions per row


def make_inputs(n_tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (B, T) float32 and a right-padded response mask (B, T) with B*T = n_tokens."""
    rows = max(1, n_tokens // ROW_LENGTH)
    cols = n_tokens // rows
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(rows, cols, generator=gen)  # (B, T)
    lengths = torch.randint(cols // 2, cols + 1, (rows,), generator=gen)  # (B,)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)  # (B, T)
    return scores, mask


def quantile_select(scores: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """TRL's rule: keep valid tokens with score >= the (1 - rho) quantile of valid scores."""
    threshold = torch.quantile(scores[mask], 1.0 - rho)
    return (scores >= threshold) & mask  # (B, T)


def sort_select(scores: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """Full descending sort of the valid scores; keep those >= the k-th largest (k = ceil)."""
    valid = scores[mask]  # (n_valid,)
    k = max(1, math.ceil(rho * valid.numel()))
    threshold = torch.sort(valid, descending=True).values[k - 1]
    return (scores >= threshold) & mask  # (B, T)


def kthvalue_threshold(scores: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """Reference only: the k-th largest valid score by ``torch.kthvalue`` (linear-time
    selection), keeping ``>=`` it (ties may exceed k; not an exact-count selection)."""
    valid = scores[mask]  # (n_valid,)
    k = max(1, math.ceil(rho * valid.numel()))
    threshold = torch.kthvalue(valid, valid.numel() - k + 1).values
    return (scores >= threshold) & mask  # (B, T)


def run(options: BenchOptions) -> dict[str, Any]:
    select_tokens = core_api("select_tokens")

    torch.set_num_threads(options.threads)
    if options.quick:
        plan = [(2**14, 2), (2**16, 2)]
    else:
        plan = [(2**20, 7), (2**24, 5), (2**26, 3)]
    rows = []
    for n_tokens, repeats in plan:
        scores, mask = (x.to(options.device) for x in make_inputs(n_tokens))
        selected = select_tokens(scores, mask, RATIO)
        n_valid = int(mask.sum())
        count = int(selected.sum())
        row: dict[str, Any] = {
            "n_tokens": n_tokens,
            "n_valid": n_valid,
            "repeats": repeats,
            "selected_count": count,
            "selected_fraction": count / n_valid,
            # rho * n_valid rounded either way counts as exact; ties may not inflate the count.
            "exact_count": math.floor(RATIO * n_valid) <= count <= math.ceil(RATIO * n_valid),
            # Correct top-k: no unselected valid token outscores a selected one.
            "is_top_k": bool(scores[selected].min() >= scores[mask & ~selected].max()),
        }
        del selected
        timed = interleaved_times(
            {
                "select_tokens": lambda s=scores, m=mask: select_tokens(s, m, RATIO),
                "quantile": lambda s=scores, m=mask: quantile_select(s, m, RATIO),
                "sort": lambda s=scores, m=mask: sort_select(s, m, RATIO),
                "kthvalue": lambda s=scores, m=mask: kthvalue_threshold(s, m, RATIO),
            },
            repeats=repeats,
            sync=synchronizer(options.device),
        )
        row.update(timed)
        ours = row["select_tokens"].get("median_s")
        row["speedup_vs_quantile"] = ratio(row["quantile"].get("median_s"), ours)
        row["speedup_vs_sort"] = ratio(row["sort"].get("median_s"), ours)
        row["speedup_vs_kthvalue"] = ratio(row["kthvalue"].get("median_s"), ours)
        rows.append(row)
        print(f"  selection N={n_tokens}: {row['speedup_vs_quantile']} x vs quantile", flush=True)
        del scores, mask

    goals = []
    if not options.quick:
        at16 = next(r for r in rows if r["n_tokens"] == 2**24)
        at64 = next(r for r in rows if r["n_tokens"] == 2**26)
        speedup = at16["speedup_vs_quantile"]
        goals.append(
            goal(
                "select_tokens vs torch.quantile at 16M tokens",
                ">= 5x faster",
                f"{speedup:.2f}x" if speedup is not None else "quantile failed",
                speedup is not None and speedup >= 5.0,
            )
        )
        goals.append(
            goal(
                "select_tokens works at 64M tokens (quantile cannot)",
                "runs, exact count",
                f"select_tokens ok={at64['select_tokens']['ok']}, "
                f"quantile ok={at64['quantile']['ok']}",
                bool(at64["select_tokens"]["ok"] and at64["exact_count"]),
            )
        )
    return {
        "settings": {
            "ratio": RATIO,
            "row_length": ROW_LENGTH,
            "dtype": "float32",
            "device": options.device,
        },
        "rows": rows,
        "goals": goals,
    }
