"""Training: rollout, warm start, the RLVR trainer. Import submodules directly
(``gmts.train.rollout``, ``gmts.train.warmstart``); this package imports nothing heavy."""
