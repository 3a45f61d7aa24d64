"""Evaluation: the benchmark harness (``harness``), the samplers loaded for it (``backends``), the
benchmark registry (``benchmarks``), the resumable results store and the paper-layout report.
average@k / pass@k live in the core (``gmts.average_at_k``, ``gmts.pass_at_k``)."""
