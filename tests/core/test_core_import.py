"""`import gmts` stays torch-only and exports the whole core API."""

from __future__ import annotations

import subprocess
import sys

import gmts

CORE_API = [
    "token_logprobs_and_entropy",
    "token_logprobs_and_entropy_from_hidden",
    "token_statistics",
    "token_statistics_from_hidden",
    "TokenStatistics",
    "ObjectiveConfig",
    "gradient_coefficient",
    "policy_loss",
    "LossConfig",
    "LossDenominators",
    "TokenSums",
    "TokenObjective",
    "get_aggregation",
    "group_advantages",
    "dynamic_sampling_keep",
    "register_score",
    "get_score",
    "available_scores",
    "compute_scores",
    "ScoreInputs",
    "score_requirements",
    "select_tokens",
    "selection_threshold",
    "SelectionConfig",
    "select_for_update",
    "SelectionResult",
]


def test_public_api_is_exported():
    missing = [name for name in CORE_API if not hasattr(gmts, name)]
    assert missing == []
    assert set(CORE_API) <= set(gmts.__all__)


def test_import_gmts_does_not_import_heavy_frameworks():
    code = (
        "import sys, gmts; "
        "heavy = [m for m in ('transformers', 'trl', 'verl', 'ray', 'matplotlib', 'accelerate') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
