"""The numbers behind the paper's Figures 2-3 and Proposition 3.1, as one JSON-ready dict.

Sections (keys of :func:`build_report`'s result):

1. ``within_answer``: per answer, Pearson correlation of log E_t vs log ||grad log pi(o_t)||
   and the least-squares slope (Fig. 2 left, Fig. 3 left); their distribution over answers.
2. ``per_group``: per question group, Spearman correlation with ||grad l_t|| of the GMTS score,
   of entropy and of the logit-grad score (Fig. 3 middle); the GMTS - entropy gap is the claim.
   Also pooled over the whole batch ("across answers", Fig. 2 middle/right).
3. ``eps``: the distribution of eps = 1 - p (Fig. 3 right) and Proposition 3.1's check,
   log G_t / log E_t binned by eps (it should approach 1 as eps -> 0).
4. / 5. ``overlap``: Jaccard overlaps of the top-rho selections by entropy (ETS), GMTS,
   logit-grad and the oracle (true ||grad l||), and the share of the oracle's gradient mass
   that each selection captures; over the batch (eq. 2), per group (the authors' code) and over
   the answers with a nonzero advantage only (what DAPO's dynamic sampling leaves).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from gmts.analysis.collect import PROXY_SCORES, TokenAnalysis
from gmts.analysis.stats import jaccard, linear_fit, pearson, spearman, summary
from gmts.core import select_tokens

__all__ = ["SELECTION_NAMES", "EPS_BINS", "selections", "build_report"]

SELECTION_NAMES = (*PROXY_SCORES, "oracle")
EPS_BINS = (0.0, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.5, 1.0)
"""Bin edges of eps = 1 - p for the Proposition 3.1 table."""


def _nan_to_none(x: Any) -> Any:
    """JSON has no NaN: recursively turn nan / inf floats into None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x


def selections(
    analysis: TokenAnalysis,
    ratio: float,
    scope: str = "batch",
    mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Top-``ratio`` selection of each score in :data:`SELECTION_NAMES`: name -> ``(B, T)`` bool.

    Args:
        scope: "batch" (the paper's eq. 2) or "group" (per question, the authors' code).
        mask: ``(B, T)`` bool tokens to select from (default: the response mask).
    """
    group_ids = analysis.group_ids if scope == "group" else None
    mask = analysis.response_mask if mask is None else mask
    return {
        name: select_tokens(analysis.scores[name], mask, ratio, scope=scope, group_ids=group_ids)
        for name in SELECTION_NAMES
    }


def _within_answer(a: TokenAnalysis, min_tokens: int) -> dict[str, Any]:
    rows = []
    for b in range(a.num_rows):
        m = a.response_mask[b]
        e, g, lg = a.entropy[b][m], a.grad_logprob_norm[b][m], a.logit_grad_norm[b][m]
        ok = (e > 0) & (g > 0) & (lg > 0)  # logs need positive values
        log_e, log_g, log_lg = e[ok].double().log(), g[ok].double().log(), lg[ok].double().log()
        enough = int(ok.sum()) >= min_tokens
        slope, intercept = linear_fit(log_e, log_g) if enough else (math.nan, math.nan)
        rows.append(
            {
                "row": b,
                "group": int(a.group_ids[b]),
                "tokens": int(m.sum()),
                "used_tokens": int(ok.sum()),
                "pearson_logE_loggrad": pearson(log_e, log_g) if enough else math.nan,
                "slope": slope,
                "intercept": intercept,
                "pearson_logE_logG": pearson(log_e, log_lg) if enough else math.nan,
            }
        )
    m = a.response_mask
    ok = m & (a.entropy > 0) & (a.grad_logprob_norm > 0)
    log_e, log_g = a.entropy[ok].double().log(), a.grad_logprob_norm[ok].double().log()
    slope, intercept = linear_fit(log_e, log_g)
    return {
        "min_tokens": min_tokens,
        "pearson": summary([r["pearson_logE_loggrad"] for r in rows]),
        "slope": summary([r["slope"] for r in rows]),
        "pearson_logE_logG": summary([r["pearson_logE_logG"] for r in rows]),
        "pooled": {
            "tokens": int(ok.sum()),
            "pearson_logE_loggrad": pearson(log_e, log_g),
            "slope": slope,
            "intercept": intercept,
        },
        "answers": rows,
    }


def _rank_correlations(a: TokenAnalysis, keep: torch.Tensor) -> dict[str, float]:
    target = a.grad_objective_norm[keep]
    return {name: spearman(a.scores[name][keep], target) for name in PROXY_SCORES}


def _per_group(a: TokenAnalysis) -> dict[str, Any]:
    groups = []
    for q in range(a.num_groups):
        rows = a.group_ids == q
        keep = a.response_mask & rows[:, None]
        rewards = a.rewards[rows]
        record: dict[str, Any] = {
            "group": q,
            "prompt": a.prompts[int(rows.nonzero()[0])],
            "mean_reward": float(rewards.mean()),
            "tokens": int(keep.sum()),
        }
        if bool((a.grad_objective_norm[keep] == 0).all()):
            # all answers equally rewarded: A = 0, every ||grad l|| = 0, no ranking to compare
            record.update(skipped="zero advantage", spearman={n: math.nan for n in PROXY_SCORES})
        else:
            record["spearman"] = _rank_correlations(a, keep)
        record["gap_gmts_minus_entropy"] = (
            record["spearman"]["gmts"] - record["spearman"]["entropy"]
        )
        groups.append(record)
    informative = a.response_mask & (a.advantages != 0)[:, None]
    return {
        "summary": {name: summary([g["spearman"][name] for g in groups]) for name in PROXY_SCORES}
        | {"gap_gmts_minus_entropy": summary([g["gap_gmts_minus_entropy"] for g in groups])},
        "skipped_groups": sum(1 for g in groups if "skipped" in g),
        # across answers and groups at once (tokens of zero-advantage answers left out)
        "pooled": _rank_correlations(a, informative) | {"tokens": int(informative.sum())},
        "groups": groups,
    }


def _eps(a: TokenAnalysis) -> dict[str, Any]:
    m = a.response_mask
    eps, e, g = a.eps[m].double(), a.entropy[m].double(), a.logit_grad_norm[m].double()
    counts, edges = np.histogram(eps.numpy(), bins=np.linspace(0.0, 1.0, 21))
    # Prop. 3.1: log G / log E -> 1 as eps -> 0 (both logs negative for peaked distributions)
    ok = (e > 0) & (e < 1) & (g > 0) & (g < 1)
    ratio = torch.full_like(eps, math.nan)
    ratio[ok] = g[ok].log() / e[ok].log()
    bins = []
    for lo, hi in zip(EPS_BINS[:-1], EPS_BINS[1:]):
        inside = ok & (eps >= lo) & ((eps < hi) if hi < 1.0 else (eps <= hi))
        r = ratio[inside]
        bins.append(
            {
                "eps_low": lo,
                "eps_high": hi,
                "tokens": int(inside.sum()),
                "median_ratio": float(r.median()) if r.numel() else math.nan,
                "q10_ratio": float(r.quantile(0.1)) if r.numel() else math.nan,
                "q90_ratio": float(r.quantile(0.9)) if r.numel() else math.nan,
            }
        )
    n = max(int(m.sum()), 1)
    return {
        "tokens": int(m.sum()),
        "fraction_below": {
            str(t): float((eps < t).sum()) / n for t in (1e-3, 1e-2, 0.05, 0.1, 0.5)
        },
        "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
        "prop31": {
            "tokens_used": int(ok.sum()),
            "tokens_excluded": int((~ok).sum()),
            "excluded_reason": "log G / log E needs 0 < E < 1 and 0 < G < 1",
            "bins": bins,
            "pearson_logE_logG": pearson(e[ok].log(), g[ok].log()),
        },
    }


def _overlap(
    a: TokenAnalysis, ratio: float, scope: str, mask: torch.Tensor | None = None
) -> dict[str, Any]:
    picked = selections(a, ratio, scope, mask)
    candidates = a.response_mask if mask is None else mask
    nonzero = int((a.grad_objective_norm[candidates] > 0).sum())
    pairs = {}
    for i, x in enumerate(SELECTION_NAMES):
        for y in SELECTION_NAMES[i + 1 :]:
            pairs[f"{x}|{y}"] = jaccard(picked[x], picked[y])
    total = float(a.grad_objective_norm[picked["oracle"]].sum())
    captured = {
        name: (float(a.grad_objective_norm[sel].sum()) / total if total > 0 else math.nan)
        for name, sel in picked.items()
    }
    chosen = int(picked["oracle"].sum())
    return {
        "scope": scope,
        "candidates": int(candidates.sum()),
        "selected": {name: int(sel.sum()) for name, sel in picked.items()},
        # when fewer tokens have ||grad l|| > 0 than are selected, the rest of every selection
        # is decided by ties (zeros, earliest token first): overlaps then say little
        "oracle_ties": max(0, chosen - nonzero),
        "jaccard": pairs,
        "oracle_mass_captured": captured,
    }


def build_report(
    analysis: TokenAnalysis, *, ratio: float = 0.2, min_tokens: int = 3
) -> dict[str, Any]:
    """All five sections for ``analysis``; nan becomes None so the dict dumps as strict JSON.

    Args:
        ratio: rho, the selected fraction for the overlaps.
        min_tokens: answers with fewer usable tokens get no within-answer correlation.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio: must be in (0, 1], got {ratio}")
    if min_tokens < 2:
        raise ValueError(f"min_tokens: must be >= 2, got {min_tokens}")
    a = analysis
    nonzero_oracle = int((a.grad_objective_norm[a.response_mask] > 0).sum())
    report = {
        "meta": dict(a.meta)
        | {
            "answers": a.num_rows,
            "groups": a.num_groups,
            "tokens": int(a.response_mask.sum()),
            "tokens_with_nonzero_grad_l": nonzero_oracle,
            "mean_reward": float(a.rewards.mean()) if a.num_rows else math.nan,
            "ratio": ratio,
            "timings": dict(a.timings),
        },
        "within_answer": _within_answer(a, min_tokens),
        "per_group": _per_group(a),
        "eps": _eps(a),
        "overlap": {
            "batch": _overlap(a, ratio, "batch"),
            "group": _overlap(a, ratio, "group"),
            # as after DAPO's dynamic sampling: answers with A = 0 removed before selecting
            "batch_nonzero_advantage": _overlap(
                a, ratio, "batch", a.response_mask & (a.advantages != 0)[:, None]
            ),
        },
    }
    return _nan_to_none(report)
