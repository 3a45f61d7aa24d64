"""What a distributed strategy and the memory plan share: the run's memory settings
(:class:`PlanSettings`, the plan's input) and the bytes per rank a strategy lays the weights out
in (:class:`Layout`, :meth:`gmts.scale.strategy_base.Strategy.layout`'s answer).

Below both :mod:`gmts.scale.strategy_base` and :mod:`gmts.scale.memory_plan`, so the memory
plan can look strategies up by name without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gmts.models.lora import LoraConfig
from gmts.scale.auto_dtype import planned_dtype

GIB = 2**30


@dataclass(frozen=True)
class Layout:
    """Bytes per rank that a strategy needs for the weights (see ``Strategy.layout``).

    Attributes:
        weights, gradients, optimizer: master weights (of the trainable parameters), their
            gradients, AdamW's two moments.
        frozen: parameters that never train, in the compute dtype (a LoRA run's base; 0 for
            full fine-tuning).
        compute_copy: weights in the compute dtype alive during a forward + backward.
        resident_copy: the part of ``compute_copy`` still alive after a no-grad forward.
        checkpointed_copy: the part of ``compute_copy`` alive from the end of a forward with
            gradient checkpointing to its backward, the layer being recomputed included (the
            checkpointed layers keep only their inputs, not the casts their matmuls saved).
        sampling_copy: the weights sampling runs on (besides the master weights).
        reference: the frozen reference model (0 when there is none).
        step_temporaries: float32 temporaries of one AdamW step (torch's foreach AdamW).
    """

    weights: float
    gradients: float
    optimizer: float
    compute_copy: float
    resident_copy: float
    sampling_copy: float
    reference: float
    step_temporaries: float
    frozen: float = 0.0
    checkpointed_copy: float | None = None  # None: the whole compute copy

    @property
    def kept_copy_checkpointed(self) -> float:
        """``checkpointed_copy``, or ``compute_copy`` when the strategy gives none."""
        return self.compute_copy if self.checkpointed_copy is None else self.checkpointed_copy


@dataclass(frozen=True)
class PlanSettings:
    """The run settings that decide memory (one rank's view).

    Attributes:
        world_size: processes.
        strategy: ``distributed.strategy``.
        dtype: the compute dtype (float32 / bfloat16): ``model.dtype``, ``auto`` counted as
            what it resolves to (:func:`gmts.scale.auto_dtype.planned_dtype`).
        micro_batch_size: rows per forward/backward.
        mini_batch_rows: rows per optimizer step on this rank (None: unknown, counted as more
            than one micro-batch, so gradients accumulate across the update's forwards).
        group_size: answers per question (consecutive rows sharing one prompt).
        forward_layout: ``model.forward_layout`` (grouped: each distinct prompt once per
            forward, responses in length buckets; padded: every row whole).
        prompt_length, response_length: the longest prompt and response, in tokens.
        generation_rows: rows this rank generates at once.
        logits_chunk_size: ``model.logits_chunk_size`` (None: the core's default).
        gradient_checkpointing: recompute activations in backward.
        reference: a separate frozen reference model is kept (KL > 0 without LoRA).
        lora: the LoRA adapters trained (None: full fine-tuning).
        engine: ``rollout.engine`` (hf or vllm).
        prepacked_weights: hf: ``rollout.prepack_weights`` (a packed copy of the linear
            weights while sampling).
        engine_dtype: vllm: the engine's dtype, resolved (float32 / bfloat16 / float16).
        engine_memory_fraction: vllm: ``gpu_memory_utilization``.
        engine_kv_bytes: vllm: ``kv_cache_gib`` in bytes, or None.
        engine_sleeps: vllm: the engine releases its memory outside rollouts.
        engine_on_gpu: vllm: the engine runs on a GPU (on a CPU the trainer sizes its KV cache
            for the batch, and the plan counts what it is given).
        engine_block_tokens: vllm: ``engine_kwargs["block_size"]`` when set, else None (the
            engine's default block).
        engine_max_model_len: vllm: ``max_model_len`` when set, else None (the model's context).
        device_bytes: the device's memory when known (a GPU's), else None.
    """

    world_size: int
    strategy: str
    dtype: str
    micro_batch_size: int
    prompt_length: int
    response_length: int
    generation_rows: int
    mini_batch_rows: int | None = None
    group_size: int = 1
    forward_layout: str = "padded"
    logits_chunk_size: int | None = None
    gradient_checkpointing: bool = False
    reference: bool = False
    lora: LoraConfig | None = None
    engine: str = "hf"
    prepacked_weights: bool = False
    engine_dtype: str = "float32"
    engine_memory_fraction: float = 0.5
    engine_kv_bytes: float | None = None
    engine_sleeps: bool = False
    engine_on_gpu: bool = True
    engine_block_tokens: int | None = None
    engine_max_model_len: int | None = None
    device_bytes: float | None = None

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        *,
        world_size: int,
        prompt_length: int,
        response_length: int,
        gpu: bool = True,
        device_bytes: float | None = None,
    ) -> PlanSettings:
        """The settings of a :class:`gmts.train.config.TrainConfig` on ``world_size`` ranks;
        ``gpu``: planned for GPUs (decides vLLM's sleep mode and what ``model.dtype: auto``
        counts as), ``device_bytes``: their memory."""
        r = cfg.rollout
        dtype = planned_dtype(cfg.model.dtype, gpu=gpu)  # auto: what it resolves to
        rows = r.questions_per_batch // world_size * r.group_size
        engine: dict[str, Any] = {
            "engine": r.engine,
            "device_bytes": device_bytes,
            "prepacked_weights": r.prepack_weights,
        }
        if r.engine == "vllm":
            v = r.vllm
            rows_at_once = v.max_num_seqs or rows
            engine.update(
                engine_dtype=dtype if v.dtype == "auto" else v.dtype,
                engine_memory_fraction=v.gpu_memory_utilization,
                engine_kv_bytes=None if v.kv_cache_gib is None else v.kv_cache_gib * GIB,
                engine_sleeps=v.sleeps(gpu),
                engine_on_gpu=gpu,
                engine_block_tokens=v.engine_kwargs.get("block_size"),
                engine_max_model_len=v.max_model_len,
            )
        else:
            rows_at_once = r.generation_batch_size or rows
        return cls(
            world_size=world_size,
            strategy=cfg.distributed.strategy,
            dtype=dtype,
            micro_batch_size=min(cfg.optim.micro_batch_size, rows),
            mini_batch_rows=cfg.mini_batch_questions // world_size * r.group_size,
            group_size=r.group_size,
            forward_layout=cfg.model.forward_layout,
            prompt_length=prompt_length,
            response_length=response_length,
            generation_rows=min(rows_at_once, rows),
            logits_chunk_size=cfg.model.logits_chunk_size,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            # with LoRA the reference is the policy with its adapters off: no copy
            reference=cfg.objective.kl_coef > 0 and cfg.model.lora is None,
            lora=cfg.model.lora,
            **engine,
        )
