"""Training at scale: process groups (``distributed``), the replicate / FSDP2 strategies
(``strategy``, ``fsdp``), bf16 mixed precision over float32 master weights (``precision``),
decoder-layer discovery (``layers``) and the memory plan checked before loading
(``memory_plan``, ``model_cost``, ``known_models``)."""
