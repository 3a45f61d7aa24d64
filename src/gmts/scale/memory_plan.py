"""A per-rank memory plan, made before any weight is loaded.

From the model's ``config.json`` alone (``AutoConfig``; no weights), the world size, the
distributed strategy, the precision and the batch shapes, :func:`plan_memory` estimates the
bytes each rank needs in the four phases of a training step and takes the largest:

- **rollout**: master weights + AdamW state (+ a LoRA run's frozen base) (+ the reference
  model) + the copy of the weights
  that sampling runs on (+ the prepacked linear weights with ``rollout.prepack_weights``: every
  decoder layer's parameters and the output projection, float32) + the KV cache of
  ``generation_batch_size`` rows of prompt + response + the prefill's working set; with
  ``rollout.engine=vllm`` the engine instead (below);
- **scoring** (old / reference log-probs, no grad): weights + one micro-batch's logits;
- **update** (forward + backward of one micro-batch): weights + gradients + AdamW state + the
  compute copy + saved activations + the logits and their gradient + the float32 blocks of
  :mod:`gmts.core.logprobs`;
- **optimizer step**: weights + gradients + AdamW state + the step's float32 temporaries.

With ``rollout.engine=vllm`` the colocated engine holds its own copy of the weights (in the
engine's dtype) and its KV cache: ``rollout.vllm.kv_cache_gib`` when set; else on a GPU of known
size what vLLM takes, ``gpu_memory_utilization`` x the GPU's memory (weights, activations and KV
cache together); on a CPU what the trainer gives the engine
(:func:`gmts.sampling.kv_sizing.vllm_kv_cache_bytes`: one generation batch in the CPU engine's
128-token blocks, at least one sequence of its whole context, plus a margin); else (a GPU of
unknown size: ``gmts plan`` without ``--gpu-gib``) the KV cache of one generation batch of
``min(max_num_seqs, rows)`` full-length rows, rounded up to vLLM's 16-token blocks. The policy
then needs no sampling copy. Outside the rollout the engine is counted in every phase, unless
it sleeps (sleep mode on a GPU: levels 1 and 2 both leave nothing on the GPU).

Each phase is the larger of the moments it passes through (e.g. the prefill vs the last
decoding step), not the sum of everything it ever allocates. Where the numbers come from:

- Parameter counts, activation and KV-cache bytes per token: :mod:`gmts.scale.model_cost`
  (exact counts on the meta device; activations measured on a narrow copy of the model).
- The strategy's layout (what is sharded, what is gathered) comes from the strategy class
  (:meth:`gmts.scale.strategy_base.Strategy.layout`).
- LoRA (``model.lora``): only the adapters are float32 masters with gradients and AdamW state;
  the base is frozen in the compute dtype ("frozen weights"), and the KL reference is the same
  model with its adapters off (no reference copy).

The plan is an estimate: allocator fragmentation, CUDA context and NCCL buffers are not in it
(:data:`DEVICE_HEADROOM` leaves room for them when checking against a GPU). Its agreement with
measured peaks is stated in docs/training.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gmts.scale.layout import GIB, PlanSettings
from gmts.scale.model_cost import ModelShape, activation_cost
from gmts.scale.precision import Precision
from gmts.scale.strategy import STRATEGIES

DEVICE_HEADROOM = 0.92
"""Fraction of a GPU's memory the plan may fill (the rest: CUDA context, NCCL, fragmentation)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per rank, by phase and by part (every number in bytes).

    ``phases`` maps a phase name to its parts (name -> bytes); ``peak`` is the largest phase
    total and ``peak_phase`` its name.
    """

    shape: ModelShape
    settings: PlanSettings
    phases: dict[str, dict[str, float]] = field(default_factory=dict)

    def total(self, phase: str) -> float:
        return sum(self.phases[phase].values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> float:
        return self.total(self.peak_phase)

    def summary(self) -> str:
        """One line: the peak and its phase."""
        s = self.settings
        return (
            f"memory plan: peak {self.peak / 2**20:.1f} MiB per rank in the {self.peak_phase} "
            f"phase ({s.world_size} x {s.strategy}, {s.dtype}); `gmts plan` shows its parts"
        )

    def table(self) -> str:
        """A text table: one column per phase, one row per part (GiB, or MiB under 1 GiB)."""
        names = list(self.phases)
        parts = list(dict.fromkeys(p for ph in self.phases.values() for p in ph))
        s = self.settings
        unit, scale = ("GiB", GIB) if self.peak >= GIB else ("MiB", 2**20)
        engine = f", vllm engine in {s.engine_dtype}" if s.engine == "vllm" else ""
        lora = ""
        if s.lora is not None:
            lora = (
                f" (LoRA rank {s.lora.rank}: {self.shape.adapter_params / 1e6:.2f}M trainable, "
                f"{self.shape.adapter_params / self.shape.params:.2%})"
            )
        head = (
            f"memory plan per rank ({s.world_size} x {s.strategy}, {s.dtype}{engine}, "
            f"{self.shape.params / 1e9:.2f}B parameters{lora}, micro-batch {s.micro_batch_size} x "
            f"{s.prompt_length}+{s.response_length} tokens, {s.generation_rows} rows generated "
            f"at once), {unit}:"
        )
        width = max(len(p) for p in [*parts, "total"]) + 2
        lines = [head, "".ljust(width) + "".join(f"{n:>12}" for n in names)]
        for part in parts:
            cells = "".join(
                f"{self.phases[n][part] / scale:>12.2f}" if part in self.phases[n] else f"{'':>12}"
                for n in names
            )
            lines.append(part.ljust(width) + cells)
        lines.append(
            "total".ljust(width) + "".join(f"{self.total(n) / scale:>12.2f}" for n in names)
        )
        lines.append(f"peak: {self.peak / scale:.2f} {unit} ({self.peak_phase})")
        return "\n".join(lines)


def _mode(settings: PlanSettings) -> str:
    """The probe's precision mode (:func:`gmts.scale.model_cost.activation_cost`)."""
    if settings.dtype == "float32":
        return "float32"
    if settings.strategy == "fsdp":
        return "bf16-params"
    return "autocast" if settings.lora is None else "bf16-base"


def plan_memory(config: Any, settings: PlanSettings) -> MemoryPlan:
    """The per-rank memory plan of training ``config``'s model with ``settings``."""
    shape = ModelShape.from_config(config, settings.lora)
    precision = Precision.from_name(settings.dtype)
    cb = precision.compute_bytes
    layout = STRATEGIES.get(settings.strategy).layout(shape, precision, settings)
    act = activation_cost(config, _mode(settings), settings.lora)

    s = settings
    seq = s.prompt_length + s.response_length
    tokens = s.micro_batch_size * seq
    logits = s.micro_batch_size * (s.response_length + 1) * shape.vocab * cb  # (mb, T+1, V)
    blocks = _logit_blocks(s, shape.vocab)
    if s.gradient_checkpointing:  # one residual vector per layer kept, a layer recomputed
        kept = tokens * (shape.layers * act.stream + act.outside)
        recompute = tokens * act.per_layer
    else:
        kept = tokens * (shape.layers * act.per_layer + act.outside)
        recompute = 0.0
    # a forward (no grad) or a layer's backward has about half of what a layer saves for
    # backward alive at once (the MLP's gate, up and product tensors)
    layer_work = tokens * act.per_layer / 2
    kv_per_token = shape.layers * act.kv_per_layer
    growth = 1 + 1 / shape.layers  # DynamicCache grows by torch.cat: one layer copied at a time
    kv_full = s.generation_rows * seq * kv_per_token * growth
    kv_prompt = s.generation_rows * s.prompt_length * kv_per_token
    prefill = s.generation_rows * s.prompt_length * act.per_layer / 2
    sample_logits = 3 * s.generation_rows * shape.vocab * 4  # (rows, V) float32 softmax

    resident = {"weights": layout.weights, "optimizer": layout.optimizer}
    if layout.frozen:
        resident["frozen weights"] = layout.frozen
    if layout.reference:
        resident["reference"] = layout.reference
    engine = _engine_parts(shape, s)
    if engine and not s.engine_sleeps:  # the engine holds its memory through the update too
        resident["vllm engine"] = sum(engine.values())
    training = {
        **resident,
        "gradients": layout.gradients,
        "compute copy": layout.compute_copy,
        "activations": kept,
    }
    if engine:  # the engine samples; the policy needs no sampling copy
        base = {k: v for k, v in resident.items() if k != "vllm engine"}
        rollout = {**base, **engine, "working set": sample_logits}
    else:
        sampling = {**resident, "sampling copy": layout.sampling_copy}
        if s.prepacked_weights:  # every decoder layer and the output projection, float32
            packed = (shape.layers * shape.layer_params + shape.vocab * shape.hidden) * 4
            sampling["prepacked weights"] = float(packed)
        rollout = _peak(
            {**sampling, "KV cache": kv_full, "working set": sample_logits},  # last decoding step
            {**sampling, "KV cache": kv_prompt, "working set": prefill},  # the prompts' prefill
        )
    phases = {  # each phase: the larger of the moments it passes through
        "rollout": rollout,
        "scoring": _peak(
            {
                **resident,
                "compute copy": layout.compute_copy,
                "logits": logits,
                "working set": layer_work,
            },  # end of the forward
            {**resident, "compute copy": layout.resident_copy, "logits": logits + blocks},
        ),
        "update": _peak(
            {**training, "logits": 2 * logits + blocks},  # logits, their gradient, blocks
            {**training, "working set": recompute + layer_work},  # a layer's backward
        ),
        "step": {**resident, "gradients": layout.gradients, "working set": layout.step_temporaries},
    }
    return MemoryPlan(shape=shape, settings=settings, phases=phases)


def _dtype_bytes(name: str) -> int:
    """Bytes per element of the dtype called ``name`` (float32, bfloat16, float16)."""
    return {"float32": 4, "bfloat16": 2, "float16": 2}[name]


def engine_kv_cache_bytes(shape: ModelShape, settings: PlanSettings) -> float:
    """The vLLM engine's KV cache for one generation batch: ``generation_rows`` rows of
    ``prompt_length + response_length`` tokens, each rounded up to vLLM's 16-token blocks,
    keys and values of every layer in the engine's dtype
    (:func:`gmts.sampling.kv_sizing.kv_cache_bytes`)."""
    from gmts.sampling.kv_sizing import kv_cache_bytes

    return float(
        kv_cache_bytes(
            shape.kv,
            dtype=settings.engine_dtype,
            rows=settings.generation_rows,
            tokens=settings.prompt_length + settings.response_length,
        )
    )


def cpu_engine_kv_cache_bytes(shape: ModelShape, settings: PlanSettings) -> int:
    """The KV cache the trainer gives a vLLM engine on a CPU
    (:func:`gmts.sampling.kv_sizing.vllm_kv_cache_bytes`): one generation batch of
    ``prompt_length + response_length`` tokens in whole blocks of the CPU engine's size, at
    least one sequence of its whole context, plus
    :data:`gmts.sampling.kv_sizing.CPU_KV_MARGIN_BYTES`."""
    from gmts.sampling.kv_sizing import CPU_KV_MARGIN_BYTES, vllm_kv_cache_bytes
    from gmts.sampling.vllm_engine import VLLMConfig

    engine = VLLMConfig(
        max_model_len=settings.engine_max_model_len,
        engine_kwargs={"block_size": settings.engine_block_tokens}
        if settings.engine_block_tokens
        else {},
    )
    size = vllm_kv_cache_bytes(
        engine,
        shape.kv,
        dtype=settings.engine_dtype,
        on_gpu=False,
        rows=settings.generation_rows,
        tokens=settings.prompt_length + settings.response_length,
        context=shape.max_positions,
        margin_bytes=CPU_KV_MARGIN_BYTES,
    )
    assert size is not None  # on a CPU without kv_cache_gib it is always sized
    return size


def _engine_parts(shape: ModelShape, s: PlanSettings) -> dict[str, float]:
    """The vLLM engine's bytes by part ({} for the hf engine): see the module docstring."""
    if s.engine != "vllm":
        return {}
    weights = shape.params * _dtype_bytes(s.engine_dtype)
    if s.engine_kv_bytes is not None:
        rest = s.engine_kv_bytes
    elif s.device_bytes is not None:  # vLLM takes its fraction, whatever the batch needs
        rest = max(s.engine_memory_fraction * s.device_bytes - weights, 0.0)
    elif not s.engine_on_gpu:  # a CPU: the cache the trainer sizes for the engine
        rest = float(cpu_engine_kv_cache_bytes(shape, s))
    else:
        rest = engine_kv_cache_bytes(shape, s)
    return {"engine weights": float(weights), "engine KV cache": rest}


def _peak(*moments: dict[str, float]) -> dict[str, float]:
    """The moment with the most bytes alive."""
    return max(moments, key=lambda m: sum(m.values()))


def _logit_blocks(s: PlanSettings, vocab: int) -> float:
    """Float32 (n, V) blocks alive at once in :mod:`gmts.core.logprobs`: n tokens per block as
    its ``_blocks`` cuts a (micro-batch, T) grid; 2 blocks whatever the logits' dtype (its
    reused scratch: the tempered float32 copy and its exponential; the backward's one)."""
    from gmts.core.logprobs import default_chunk_size

    chunk = s.logits_chunk_size or default_chunk_size(vocab)
    T = s.response_length
    n = T * max(1, chunk // T) if chunk >= T else chunk
    n = min(n, s.micro_batch_size * T)
    return 2 * n * vocab * 4


class MemoryPlanError(ValueError):
    """The plan does not fit on the device (message names the knobs)."""


KNOBS = (
    "distributed.strategy=fsdp (with more GPUs), optim.micro_batch_size, "
    "rollout.generation_batch_size, model.gradient_checkpointing=true, "
    "model.logits_chunk_size, rollout.max_response_length / max_prompt_length "
    "(or distributed.check_memory=false to start anyway)"
)


def check_fits_device(plan: MemoryPlan, device_bytes: int, device_name: str) -> None:
    """Raise :class:`MemoryPlanError` when ``plan.peak`` exceeds
    ``DEVICE_HEADROOM * device_bytes``."""
    budget = DEVICE_HEADROOM * device_bytes
    if plan.peak > budget:
        raise MemoryPlanError(
            f"the memory plan needs {plan.peak / GIB:.1f} GiB per rank in its {plan.peak_phase} "
            f"phase but {device_name} has {device_bytes / GIB:.1f} GiB "
            f"({DEVICE_HEADROOM:.0%} usable); lower it with {KNOBS}"
        )
