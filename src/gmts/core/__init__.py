"""The torch-only core of gmts: token statistics, omega, scores, selection, losses, advantages,
average@k / pass@k, configs."""

from gmts.core.advantages import dynamic_sampling_keep, group_advantages
from gmts.core.aggregation import (
    AGGREGATIONS,
    Aggregation,
    available_aggregations,
    get_aggregation,
    register_aggregation,
)
from gmts.core.config import SELECTION_PRESETS, SELECTION_UNITS, SelectionConfig
from gmts.core.logprobs import (
    TokenStatistics,
    token_logprobs_and_entropy,
    token_logprobs_and_entropy_from_hidden,
    token_statistics,
    token_statistics_from_hidden,
)
from gmts.core.loss import LossConfig, LossDenominators, TokenSums, policy_loss
from gmts.core.metrics import average_at_k, pass_at_k
from gmts.core.objectives import (
    OBJECTIVE_PRESETS,
    ObjectiveConfig,
    TokenObjective,
    gradient_coefficient,
    token_objective,
)
from gmts.core.scores import (
    ScoreInputs,
    available_scores,
    compute_scores,
    get_score,
    register_score,
    score_requirements,
)
from gmts.core.selection import (
    COUNT_RULES,
    SCOPES,
    select_tokens,
    selection_count,
    selection_threshold,
)
from gmts.core.step import SelectionResult, select_for_update

__all__ = [
    "AGGREGATIONS",
    "COUNT_RULES",
    "OBJECTIVE_PRESETS",
    "SCOPES",
    "SELECTION_PRESETS",
    "SELECTION_UNITS",
    "Aggregation",
    "LossConfig",
    "LossDenominators",
    "ObjectiveConfig",
    "ScoreInputs",
    "SelectionConfig",
    "SelectionResult",
    "TokenObjective",
    "TokenStatistics",
    "TokenSums",
    "available_aggregations",
    "available_scores",
    "average_at_k",
    "compute_scores",
    "dynamic_sampling_keep",
    "get_aggregation",
    "get_score",
    "gradient_coefficient",
    "pass_at_k",
    "group_advantages",
    "policy_loss",
    "register_aggregation",
    "register_score",
    "score_requirements",
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
