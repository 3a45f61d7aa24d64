"""Evaluation: average@k / pass@k (torch only) and the task harness (``gmts.eval.task_eval``)."""

from gmts.eval.metrics import average_at_k, pass_at_k

__all__ = ["average_at_k", "pass_at_k"]
