"""gmts: token-selective RLVR (GMTS, ETS, GRPO, DAPO) for language models."""

__version__ = "0.1.0"
