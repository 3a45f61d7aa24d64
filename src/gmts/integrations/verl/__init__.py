"""GMTS inside verl (>= 0.9) without a fork.

- :mod:`~gmts.integrations.verl.plugin`: the ``verl.plugins`` entry point; it wraps verl's
  engine-worker ``set_loss_fn`` and ``BaseEngine.train_batch`` so that, when
  ``GMTS_VERL_SELECTION`` is set, the actor trains on the selected tokens.
- :mod:`~gmts.integrations.verl.loss`: ``GMTSPolicyLoss`` (a verl loss function), the
  mini-batch selection step and the loss itself.
- :mod:`~gmts.integrations.verl.loss_modes`: verl's ``policy_loss.loss_mode`` values as a
  registry (the core objective of each, its policy term, its importance weights, what is
  refused and why) and ``check_actor_config``; :mod:`~gmts.integrations.verl.terms` and
  :mod:`~gmts.integrations.verl.bypass` compute the policy terms with verl's own functions;
  :mod:`~gmts.integrations.verl.actor_config` reads verl's actor config (and maps
  ``kl_loss_type`` to the core's KL estimators).
- :mod:`~gmts.integrations.verl.settings`: ``GMTSVerlSettings`` and its environment encoding.
- ``python -m gmts.integrations.verl``: launcher around ``verl.trainer.main_ppo``.

This package module imports nothing: verl imports the plugin while verl itself is importing.
"""
