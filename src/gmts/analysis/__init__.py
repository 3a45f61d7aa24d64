"""Per-token analysis: exact gradient norms, the paper's Figures 2-3 as numbers, plots, HTML.

Torch-only modules are imported here; ``gmts.analysis.plots`` (matplotlib) and
``gmts.analysis.html`` are imported on use. ``gmts.sampling.rollout`` (transformers) is imported
only by :func:`sample_and_analyze` when it runs.
"""

from gmts.analysis.collect import PROXY_SCORES, TokenAnalysis, analyze_rollout, sample_and_analyze
from gmts.analysis.gradnorms import (
    batched_grad_norms,
    loop_grad_norms,
    token_gradient_norms,
    trainable_parameters,
)
from gmts.analysis.report import SELECTION_NAMES, build_report, selections
from gmts.analysis.stats import jaccard, linear_fit, pearson, rankdata, spearman

__all__ = [
    "PROXY_SCORES",
    "SELECTION_NAMES",
    "TokenAnalysis",
    "analyze_rollout",
    "batched_grad_norms",
    "build_report",
    "jaccard",
    "linear_fit",
    "loop_grad_norms",
    "pearson",
    "rankdata",
    "sample_and_analyze",
    "selections",
    "spearman",
    "token_gradient_norms",
    "trainable_parameters",
]
