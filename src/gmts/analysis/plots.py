"""PNG figures of an analysis (matplotlib, Agg backend, imported only here).

``within_answer.png``  Fig. 2 left / Fig. 3 left: log E vs log ||grad log pi|| inside answers,
                       and the distribution of the per-answer Pearson r and slope.
``across_answers.png`` Fig. 2 middle/right, Fig. 3 middle: entropy and the GMTS score against
                       the true ||grad l|| over all answers, and per-group Spearman correlations.
``eps.png``            Fig. 3 right: the distribution of eps = 1 - p, and Proposition 3.1's
                       log G / log E against eps.
``overlap.png``        Jaccard overlaps of the top-rho selections and the share of the oracle's
                       gradient mass each captures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gmts.analysis.collect import TokenAnalysis
from gmts.analysis.report import SELECTION_NAMES

__all__ = ["FIGURES", "write_figures"]

FIGURES = ("within_answer.png", "across_answers.png", "eps.png", "overlap.png")
_LABELS = {
    "entropy": "entropy (ETS)",
    "gmts": "GMTS |E*omega|",
    "logit-grad": "logit-grad",
    "oracle": "oracle",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _np(x) -> np.ndarray:
    return x.detach().cpu().double().numpy()


def _within_answer(a: TokenAnalysis, report: dict[str, Any], path: Path, plt) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    m = a.response_mask
    ok = m & (a.entropy > 0) & (a.grad_logprob_norm > 0)
    ax.scatter(
        np.log(_np(a.entropy[ok])),
        np.log(_np(a.grad_logprob_norm[ok])),
        s=4,
        c="0.8",
        label="all tokens",
    )
    longest = sorted(range(a.num_rows), key=lambda b: -int(ok[b].sum()))[:5]
    for b in longest:
        x, y = np.log(_np(a.entropy[b][ok[b]])), np.log(_np(a.grad_logprob_norm[b][ok[b]]))
        (line,) = ax.plot(x, y, "o", ms=4, label=f"answer {b}")
        if x.size >= 2 and np.ptp(x) > 0:
            k, c = np.polyfit(x, y, 1)
            xs = np.linspace(x.min(), x.max(), 2)
            ax.plot(xs, k * xs + c, "-", color=line.get_color(), lw=1)
    ax.set_xlabel("log entropy  log E_t")
    ax.set_ylabel("log ||grad_theta log pi(o_t)||")
    ax.set_title("within answers (Fig. 2 left)")
    ax.legend(fontsize=7)
    rows = report["within_answer"]["answers"]
    r = [x["pearson_logE_loggrad"] for x in rows if x["pearson_logE_loggrad"] is not None]
    s = [x["slope"] for x in rows if x["slope"] is not None]
    axes[1].hist(r, bins=np.linspace(-1, 1, 21), color="tab:blue")
    axes[1].set_xlabel("Pearson r of log E vs log ||grad log pi||, per answer")
    axes[1].set_ylabel("answers")
    axes[1].set_title(f"median r = {np.median(r):.2f}" if r else "no answer long enough")
    axes[2].hist(s, bins=20, color="tab:green")
    axes[2].axvline(1.0, color="k", ls="--", lw=1)
    axes[2].set_xlabel("fitted slope, per answer (paper: about 1)")
    axes[2].set_title(f"median slope = {np.median(s):.2f}" if s else "")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _across_answers(a: TokenAnalysis, report: dict[str, Any], path: Path, plt) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    keep = a.response_mask & (a.grad_objective_norm > 0) & (a.entropy > 0)
    adv = _np(a.advantages[:, None].expand_as(a.entropy)[keep])
    target = _np(a.grad_objective_norm[keep])
    lim = max(np.abs(adv).max(), 1e-6) if adv.size else 1.0
    pooled = report["per_group"]["pooled"]
    sc = None
    for ax, name in zip(axes[:2], ("entropy", "gmts")):
        if not adv.size:
            ax.text(
                0.5,
                0.5,
                "no token with ||grad l|| > 0\n(every group has equal rewards)",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_title(_LABELS[name])
            continue
        sc = ax.scatter(
            _np(a.scores[name][keep]), target, c=adv, cmap="coolwarm", vmin=-lim, vmax=lim, s=6
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        rho = pooled[name]
        ax.set_title(
            f"{_LABELS[name]}: Spearman {rho:.3f}" if rho is not None else _LABELS[name],
            fontsize=9,
        )
        ax.set_xlabel(_LABELS[name])
        ax.set_ylabel("||grad_theta l_t||")
    if sc is not None:
        fig.colorbar(sc, ax=axes[1], label="advantage A")
    groups = [g for g in report["per_group"]["groups"] if "skipped" not in g]
    ax = axes[2]
    if groups:
        x = np.arange(len(groups))
        for k, name in enumerate(("entropy", "gmts", "logit-grad")):
            vals = [
                g["spearman"][name] if g["spearman"][name] is not None else np.nan for g in groups
            ]
            ax.bar(x + (k - 1) * 0.27, vals, width=0.27, label=_LABELS[name])
        ax.set_xticks(x, [str(g["group"]) for g in groups])
        ax.axhline(0, color="k", lw=0.5)
        ax.legend(fontsize=7)
    skipped = report["per_group"]["skipped_groups"]
    ax.set_title(f"Spearman with ||grad l|| per group ({skipped} skipped: A = 0)", fontsize=9)
    ax.set_xlabel("question group")
    lows = [g["spearman"][n] for g in groups for n in ("entropy", "gmts", "logit-grad")]
    low = min([v for v in lows if v is not None] + [1.0])
    ax.set_ylim(min(0.0, low) - 0.05 if low < 0.5 else low - 0.05, 1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _eps(a: TokenAnalysis, report: dict[str, Any], path: Path, plt) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    m = a.response_mask
    eps = _np(a.eps[m])
    hist = report["eps"]["histogram"]
    axes[0].stairs(hist["counts"], hist["edges"], fill=True)
    below = report["eps"]["fraction_below"]["0.1"]
    axes[0].set_title(f"eps = 1 - p  ({below:.0%} of tokens below 0.1)  (Fig. 3 right)", fontsize=9)
    axes[0].set_xlabel("eps")
    axes[0].set_ylabel("tokens")
    e, g = _np(a.entropy[m]), _np(a.logit_grad_norm[m])
    ok = (e > 0) & (e < 1) & (g > 0) & (g < 1)
    ax = axes[1]
    if not ok.any():
        ax.text(
            0.5,
            0.5,
            "no token with 0 < E < 1 and 0 < G < 1",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_title("Prop. 3.1: log G / log E against eps", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return
    ax.scatter(np.clip(eps[ok], 1e-8, None), np.log(g[ok]) / np.log(e[ok]), s=4, alpha=0.5)
    bins = [b for b in report["eps"]["prop31"]["bins"] if b["median_ratio"] is not None]
    if bins:
        centres = [np.sqrt(max(b["eps_low"], 1e-8) * b["eps_high"]) for b in bins]
        ax.plot(centres, [b["median_ratio"] for b in bins], "k-o", ms=4, label="binned median")
    # reference: p on the sampled token and the rest on ONE other token (G = sqrt(2) eps)
    grid = np.logspace(-8, np.log10(0.3), 200)
    e2 = -(1 - grid) * np.log1p(-grid) - grid * np.log(grid)
    g2 = np.sqrt(2.0) * grid
    ax.plot(grid, np.log(g2) / np.log(e2), "g:", lw=1.2, label="two-token distribution")
    ax.legend(fontsize=7)
    ax.axhline(1.0, color="r", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("eps = 1 - p")
    ax.set_ylabel("log G_t / log E_t")
    ax.set_title("Prop. 3.1: log G / log E -> 1 as eps -> 0 (slowly)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _overlap(report: dict[str, Any], path: Path, plt) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ov = report["overlap"]["batch"]
    n = len(SELECTION_NAMES)
    mat = np.eye(n)
    for i, x in enumerate(SELECTION_NAMES):
        for j, y in enumerate(SELECTION_NAMES):
            if i < j:
                v = ov["jaccard"][f"{x}|{y}"]
                mat[i, j] = mat[j, i] = np.nan if v is None else v
    ax = axes[0]
    ax.imshow(mat, vmin=0, vmax=1, cmap="viridis")
    for i in range(n):
        for j in range(n):
            ax.text(
                j,
                i,
                "-" if np.isnan(mat[i, j]) else f"{mat[i, j]:.2f}",
                ha="center",
                va="center",
                color="w" if mat[i, j] < 0.6 else "k",
                fontsize=9,
            )
    labels = [_LABELS[s] for s in SELECTION_NAMES]
    ax.set_xticks(range(n), labels, rotation=20, fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ratio = report["meta"]["ratio"]
    ax.set_title(f"Jaccard of top-{ratio:g} selections (batch scope)", fontsize=9)
    cap = ov["oracle_mass_captured"]
    vals = [cap[s] if cap[s] is not None else np.nan for s in SELECTION_NAMES]
    axes[1].bar(labels, vals, color=["tab:orange", "tab:blue", "tab:purple", "0.5"])
    axes[1].set_ylim(0, 1.05)
    axes[1].set_ylabel("sum ||grad l|| selected / oracle's")
    axes[1].set_title("gradient mass captured by each selection", fontsize=9)
    axes[1].tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_figures(
    analysis: TokenAnalysis, report: dict[str, Any], out_dir: str | Path
) -> list[Path]:
    """Write :data:`FIGURES` into ``out_dir`` (created); returns their paths."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in FIGURES]
    _within_answer(analysis, report, paths[0], plt)
    _across_answers(analysis, report, paths[1], plt)
    _eps(analysis, report, paths[2], plt)
    _overlap(report, paths[3], plt)
    return paths
