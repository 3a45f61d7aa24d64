"""The embedded default: a one-character-per-token tokenizer, a tiny causal LM with its own
seeded initialisation, built-in verifiable arithmetic tasks, their held-out evaluation and the
cached supervised warm start that ``model.path: embedded`` resolves to. Import the submodule
you need (``gmts.embedded.tasks``, ``gmts.embedded.warmstart``, ...)."""
