"""Model plumbing for every command: resolving a model path (Hugging Face folder, gmts
checkpoint, training run, ``embedded``, hub id), choosing the device, loading model and
tokenizer (``loading``), and the context guards (``context``)."""
