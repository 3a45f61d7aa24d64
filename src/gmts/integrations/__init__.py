"""GMTS inside existing RL engines, without forking them.

- :mod:`gmts.integrations.trl`: ``GMTSGRPOConfig`` / ``GMTSGRPOTrainer`` for TRL's GRPOTrainer
  (``pip install gmts[trl]``).
- :mod:`gmts.integrations.verl`: a ``verl.plugins`` entry point, a loss function for verl's engine
  workers and the launcher ``python -m gmts.integrations.verl`` (``pip install gmts[verl]``).

This package imports nothing itself: importing it must never pull in trl, verl or ray.
"""
