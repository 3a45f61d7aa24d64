"""GMTS inside verl (>= 0.9) without a fork.

- :mod:`~gmts.integrations.verl.plugin`: the ``verl.plugins`` entry point; it wraps verl's
  engine-worker ``set_loss_fn`` and ``BaseEngine.train_batch`` so that, when
  ``GMTS_VERL_SELECTION`` is set, the actor trains on the selected tokens.
- :mod:`~gmts.integrations.verl.loss`: ``GMTSPolicyLoss`` (a verl loss function), the
  mini-batch selection step and the loss itself.
- :mod:`~gmts.integrations.verl.settings`: ``GMTSVerlSettings`` and its environment encoding.
- ``python -m gmts.integrations.verl``: launcher around ``verl.trainer.main_ppo``.

This package module imports nothing: verl imports the plugin while verl itself is importing.
"""
