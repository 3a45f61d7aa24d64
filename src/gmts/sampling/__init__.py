"""Sampling answers from a policy: prompt + response rows (``sequences``), the ``Rollout``
record and the batched KV-cached sampler ``generate_rollouts`` (``rollout``). Used by training,
evaluation and analysis alike; imports transformers only inside the sampler."""
