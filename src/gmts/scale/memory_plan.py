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

import math
from dataclasses import dataclass, field
from typing import Any

from gmts.scale.layout import GIB, Layout, PlanSettings
from gmts.scale.model_cost import ActivationCost, ModelShape, activation_cost
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
            f"{s.prompt_length}+{s.response_length} tokens in {s.forward_layout} forwards, "
            f"{s.generation_rows} rows generated at once), {unit}:"
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


@dataclass(frozen=True)
class ForwardShape:
    """What one forward of a micro-batch computes, at the budget's worst case: every prompt
    ``prompt_length`` (P) and every response ``response_length`` (T) tokens long.

    For ``m`` rows of ``micro_batch_size`` cut from groups of ``G = group_size`` consecutive
    rows sharing one prompt (micro-batches start at multiples of ``m``, groups at multiples of
    G, so a micro-batch starts at an offset ``r`` into a group, a multiple of ``gcd(m, G)``):

    - **padded**: every row runs its prompt and response, ``m x (P + T)`` positions, logits of
      ``m x (T + 1)`` (the last prompt position and every response position);
    - **grouped** (:mod:`gmts.train.grouped_forward`, buckets of
      :func:`gmts.train.forward_plan.length_buckets`): a micro-batch holds at most
      ``u = min(m, ceil((m + G - gcd(m, G)) / G))`` distinct prompts (``ceil((r + m) / G)``
      groups at the largest offset ``r = G - gcd(m, G)``; ``m / G`` when G divides m, 1 when
      m divides G, m when G = 1). With every length at the budget each bucket is unpadded:
      one prompt call of ``u x P`` positions and one response call of ``m x (T - 1)`` (a row
      feeds its tokens ``0..T-2``; token 0 is predicted by its prompt's last position). A
      bucket computes ``rows x its longest <= rows x the budget``, so shorter answers never
      compute more. Positions: ``u x P + m x (T - 1)``, against the padded ``m x (P + T)``:
      for SmolLM2's config (m = 24, G = 8, P = 96, T = 64) 1,800 against 3,840. The response
      call attends over each row's prompt as a cached prefix, ``m x P`` key positions, and
      the distinct prompts' keys and values are stored once, ``u x P``.

    Attributes:
        prompts: distinct prompts per forward (u; m when padded).
        calls: per model call, (query positions, key positions of a cached prefix it attends
            over): padded one call ``(m x (P + T), 0)``; grouped ``(u x P, 0)`` and
            ``(m x (T - 1), m x P)``.
        cached: key positions whose keys and values are held in caches (grouped: the store
            ``u x P`` and the response call's per-row prefix ``m x P``; padded: none).
        logit_rows: positions whose logits exist at once (grouped: the response call's
            ``m x (T - 1)``, the first tokens' ``m`` and the prompts' last ``u``).
        stat_rows, stat_cols: the grid of the largest call of the log-prob kernel.
        sliced: the kernel gets ``logits[:, :-1]`` (padded), so a block of whole rows is a
            copy, not a view.
    """

    prompts: int
    calls: tuple[tuple[int, int], ...]
    cached: int
    logit_rows: int
    stat_rows: int
    stat_cols: int
    sliced: bool

    @property
    def positions(self) -> int:
        """Query positions computed by all calls together."""
        return sum(q for q, _ in self.calls)

    @property
    def prefix(self) -> int:
        """Key positions of cached prefixes attended over (grouped: ``m x P``)."""
        return sum(k for _, k in self.calls)


def forward_shape(s: PlanSettings) -> ForwardShape:
    """The :class:`ForwardShape` of ``s``'s micro-batch in its ``forward_layout``."""
    m, P, T = s.micro_batch_size, s.prompt_length, s.response_length
    if s.forward_layout == "padded":
        return ForwardShape(m, ((m * (P + T), 0),), 0, m * (T + 1), m, T, True)
    G = max(1, s.group_size)
    u = min(m, -(-(m + G - math.gcd(m, G)) // G))
    fed = max(T - 1, 0)
    return ForwardShape(
        prompts=u,
        calls=((u * P, 0), (m * fed, m * P)) if fed else ((u * P, 0),),
        cached=(u + m) * P if fed else u * P,
        logit_rows=m * T + u,
        stat_rows=m,
        stat_cols=max(fed, 1),
        sliced=False,
    )


def _activations(
    shape: ModelShape, act: ActivationCost, s: PlanSettings, f: ForwardShape
) -> tuple[float, float, float]:
    """(kept for backward, one layer recomputed, a layer's working set) of one micro-batch's
    forward with gradients, in bytes.

    Without checkpointing every layer keeps what autograd saves per position (``per_layer``)
    and, per prefix position, the keys and values its attention saved (``prefix_per_layer``).
    With checkpointing a layer keeps only its inputs: one residual vector per position, and
    the cache object it was called with, which holds the call's keys and values (the grouped
    layout's prefix and the prompt call's record: ``cached`` positions of KV cache); the
    backward recomputes one layer of the largest call. A forward (no grad) or a layer's
    backward has about half of what a layer saves alive at once (the MLP's gate, up and
    product tensors)."""
    L = shape.layers
    layer = max(q * act.per_layer + k * act.prefix_per_layer for q, k in f.calls)
    if s.gradient_checkpointing:
        kept = f.positions * (L * act.stream + act.outside) + f.cached * L * act.kv_per_layer
        recompute = layer
    else:
        kept = f.positions * (L * act.per_layer + act.outside) + f.prefix * L * act.prefix_per_layer
        recompute = 0.0
    return kept, recompute, max(q for q, _ in f.calls) * act.per_layer / 2


def _scoring(
    resident: dict[str, float], layout: Layout, f: ForwardShape, parts: dict[str, float]
) -> dict[str, float]:
    """The scoring phase (no grad): the larger of a layer's forward, the logits' making (the
    compute copy still alive under autocast) and the log-prob kernel (only the resident copy:
    autocast's cache is cleared at its exit). The grouped layout's prompt keys and values
    (``parts["kv"]``) are held through all of them."""
    base = {**resident, "KV cache": parts["kv"]} if parts["kv"] else dict(resident)
    return _peak(
        {**base, "compute copy": layout.compute_copy, "working set": parts["work"]},
        {**base, "compute copy": layout.compute_copy, "logits": parts["logits"]},
        {
            **base,
            "compute copy": layout.resident_copy,
            "logits": parts["logits"] + parts["blocks"],
        },
    )


def _update(
    resident: dict[str, float],
    layout: Layout,
    shape: ModelShape,
    s: PlanSettings,
    parts: dict[str, float],
) -> dict[str, float]:
    """The update phase (forward + backward of one micro-batch): the larger of the logits'
    backward (logits, their gradient, the kernel's blocks, every activation kept) and a
    layer's backward.

    The trainer sets the gradients to None before each mini-batch, so in its first
    micro-batch no gradient exists at the logits' backward; later micro-batches accumulate
    into all of them. During a backward each layer's gradients appear as its kept
    activations are freed, so their sum is largest at one end: at the start (every
    activation, the root's gradients: the output projection) or at the end (every
    gradient). With more than one micro-batch per mini-batch (or an unknown mini-batch) the
    gradients are counted whole throughout. With checkpointing only the compute copy that
    survives a checkpointed forward is alive (:attr:`Layout.checkpointed_copy`)."""
    copy = layout.kept_copy_checkpointed if s.gradient_checkpointing else layout.compute_copy
    kept = parts["activations"]
    common = {**resident, "compute copy": copy}
    work = {"working set": parts["recompute"] + parts["work"]}
    accumulating = s.mini_batch_rows is None or s.mini_batch_rows > s.micro_batch_size
    logits = {"logits": 2 * parts["logits"] + parts["blocks"]}
    if accumulating:
        full = {**common, "gradients": layout.gradients, "activations": kept}
        return _peak({**full, **logits}, {**full, **work})
    root = layout.gradients * shape.root_params / (shape.params + shape.adapter_params)
    return _peak(
        {**common, "gradients": 0.0, "activations": kept, **logits},
        {**common, "gradients": root, "activations": kept, **work},
        {**common, "gradients": layout.gradients, "activations": 0.0, **work},
    )


def plan_memory(config: Any, settings: PlanSettings) -> MemoryPlan:
    """The per-rank memory plan of training ``config``'s model with ``settings``."""
    shape = ModelShape.from_config(config, settings.lora)
    precision = Precision.from_name(settings.dtype)
    cb = precision.compute_bytes
    layout = STRATEGIES.get(settings.strategy).layout(shape, precision, settings)
    act = activation_cost(config, _mode(settings), settings.lora)

    s = settings
    f = forward_shape(s)
    kept, recompute, work = _activations(shape, act, s, f)
    parts = {
        "activations": kept,
        "recompute": recompute,
        "work": work,
        "logits": f.logit_rows * shape.vocab * cb,
        "blocks": _logit_blocks(s, f, shape.vocab, cb),
        "kv": f.cached * shape.layers * act.kv_per_layer,  # the grouped layout's prompt K/V
    }
    resident = {"weights": layout.weights, "optimizer": layout.optimizer}
    if layout.frozen:
        resident["frozen weights"] = layout.frozen
    if layout.reference:
        resident["reference"] = layout.reference
    engine = _engine_parts(shape, s)
    if engine and not s.engine_sleeps:  # the engine holds its memory through the update too
        resident["vllm engine"] = sum(engine.values())
    phases = {  # each phase: the larger of the moments it passes through
        "rollout": _rollout(resident, layout, shape, act, s, engine),
        "scoring": _scoring(resident, layout, f, parts),
        "update": _update(resident, layout, shape, s, parts),
        "step": {**resident, "gradients": layout.gradients, "working set": layout.step_temporaries},
    }
    return MemoryPlan(shape=shape, settings=settings, phases=phases)


def _rollout(
    resident: dict[str, float],
    layout: Layout,
    shape: ModelShape,
    act: ActivationCost,
    s: PlanSettings,
    engine: dict[str, float],
) -> dict[str, float]:
    """The rollout phase: the larger of the prompts' prefill and the last decoding step."""
    seq = s.prompt_length + s.response_length
    kv_per_token = shape.layers * act.kv_per_layer
    growth = 1 + 1 / shape.layers  # DynamicCache grows by torch.cat: one layer copied at a time
    kv_full = s.generation_rows * seq * kv_per_token * growth
    kv_prompt = s.generation_rows * s.prompt_length * kv_per_token
    prefill = s.generation_rows * s.prompt_length * act.per_layer / 2
    sample_logits = 3 * s.generation_rows * shape.vocab * 4  # (rows, V) float32 softmax
    if engine:  # the engine samples; the policy needs no sampling copy
        base = {k: v for k, v in resident.items() if k != "vllm engine"}
        return {**base, **engine, "working set": sample_logits}
    sampling = {**resident, "sampling copy": layout.sampling_copy}
    if s.prepacked_weights:  # every decoder layer and the output projection, float32
        packed = (shape.layers * shape.layer_params + shape.vocab * shape.hidden) * 4
        sampling["prepacked weights"] = float(packed)
    return _peak(
        {**sampling, "KV cache": kv_full, "working set": sample_logits},  # last decoding step
        {**sampling, "KV cache": kv_prompt, "working set": prefill},  # the prompts' prefill
    )


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


def _logit_blocks(s: PlanSettings, f: ForwardShape, vocab: int, cb: int) -> float:
    """Bytes of the log-prob kernel (:mod:`gmts.core.logprobs`) alive at once on the largest
    call's ``(rows, cols)`` grid, cut by its ``_blocks`` into blocks of ``n`` tokens: 2 float32
    ``(n, V)`` blocks whatever the logits' dtype (its reused scratch: the tempered float32 copy
    and its exponential; the backward's one); plus, when the grid is the padded layout's
    ``logits[:, :-1]`` and a block groups two or more whole rows, that block's ``(n, V)`` copy
    in the logits' dtype (``reshape`` of a slice whose rows are ``T + 1`` apart cannot be a
    view). The grouped layout hands the kernel contiguous logits: views only."""
    from gmts.core.logprobs import default_chunk_size

    chunk = s.logits_chunk_size or default_chunk_size(vocab)
    rows, cols = f.stat_rows, f.stat_cols
    n = cols * max(1, chunk // cols) if chunk >= cols else chunk
    n = min(n, rows * cols)
    copy = n * vocab * cb if f.sliced and cols <= chunk and n >= 2 * cols else 0
    return 2 * n * vocab * 4 + copy


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
