"""The torch-only core of gmts: token statistics, omega, scores, selection, losses, configs."""

from gmts.core.advantages import dynamic_sampling_keep, group_advantages
from gmts.core.config import SELECTION_PRESETS, SelectionConfig
from gmts.core.logprobs import (
    TokenStatistics,
    token_logprobs_and_entropy,
    token_logprobs_and_entropy_from_hidden,
    token_statistics,
    token_statistics_from_hidden,
)
from gmts.core.objectives import (
    AGGREGATIONS,
    OBJECTIVE_PRESETS,
    ObjectiveConfig,
    gradient_coefficient,
    loss_denominator,
    policy_loss,
    token_objective,
)
from gmts.core.scores import (
    SCORE_REQUIREMENTS,
    ScoreInputs,
    available_scores,
    compute_scores,
    get_score,
    register_score,
)
from gmts.core.selection import SCOPES, select_tokens, selection_count, selection_threshold
from gmts.core.step import SelectionResult, select_for_update

__all__ = [
    "AGGREGATIONS",
    "OBJECTIVE_PRESETS",
    "SCOPES",
    "SCORE_REQUIREMENTS",
    "SELECTION_PRESETS",
    "ObjectiveConfig",
    "ScoreInputs",
    "SelectionConfig",
    "SelectionResult",
    "TokenStatistics",
    "available_scores",
    "compute_scores",
    "dynamic_sampling_keep",
    "get_score",
    "gradient_coefficient",
    "group_advantages",
    "loss_denominator",
    "policy_loss",
    "register_score",
    "select_for_update",
    "select_tokens",
    "selection_count",
    "selection_threshold",
    "token_logprobs_and_entropy",
    "token_logprobs_and_entropy_from_hidden",
    "token_objective",
    "token_statistics",
    "token_statistics_from_hidden",
]
