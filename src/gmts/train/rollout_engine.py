"""The trainer's rollout engine: one wrapper for training around any
:class:`gmts.sampling.sampler.Sampler` (``rollout.engine`` names it in
:data:`gmts.sampling.sampler.SAMPLERS`: ``hf`` or ``vllm``).

The engine is built once, in ``Trainer.__init__``, from one :class:`EngineInputs`
(:func:`make_engine`), and is itself a ``Sampler`` (the collection, :mod:`gmts.train.collect`,
calls its ``sample`` inside its ``session()``); :meth:`RolloutEngine.metrics` gives its rows of
the step's ``metrics.jsonl`` row. It stops at the tokenizer's eos plus the generation config's
(the sampler's default stop rule).

What the training adds depends on the sampler's optional capabilities, never on its name:

- a sampler that samples from the policy module itself (``hf``): each session is the
  strategy's sampling region (``Strategy.sampling``: one bf16 cast, or FSDP's layers gathered
  once); ``rollout.generation_batch_size`` rows at a time; one generator seeded by ``seed``.
- a sampler that holds its own copy of the weights
  (:class:`gmts.sampling.sampler.HoldsWeights`: ``vllm``, a colocated
  :class:`gmts.sampling.vllm_engine.VLLMEngine` per rank in the trainer's process, tensor
  parallel 1, ``external_launcher`` under torchrun, started from the same weights as the
  policy): when the policy changed since the copy last got it (after every update: a session
  ends with the copy marked stale), the session first sends it the policy's weights:
  ``Strategy.full_parameters`` yields the float32 master weights one whole parameter at a time
  (under FSDP each is cast on its shard and all-gathered, so no rank holds a second whole
  model), cast to the copy's dtype (``time/weight_sync_s``).
- a sampler that sleeps (:class:`gmts.sampling.sampler.Sleeps`: vLLM's sleep mode): it sleeps
  outside the sessions, so the update has its memory; the weights wake first (for the sync),
  the KV cache when the session samples.

Each row of a vllm rollout is seeded from ``(seed, step, round, rank, row)``: the collection's
``sampling_seed(seed, step, round, rank)`` and the row (:func:`request_seeds`), so a resumed
run samples what the uninterrupted one did. The engine's log-probs of the sampled tokens travel
with the batch (``TrainBatch.engine_logprobs``); the loss's pi_old stays the trainer's own
forward, and :func:`logprob_gap_metrics` logs how far the two are apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gmts.core.distributed import all_reduce_max, all_reduce_sum
from gmts.models.lora import adapter_base_path, is_adapter_folder, merged_weights
from gmts.sampling.kv_sizing import KVShape, vllm_kv_cache_bytes
from gmts.sampling.rollout import Rollout
from gmts.sampling.sampler import (
    SAMPLERS,
    HoldsWeights,
    Sampler,
    SamplerInputs,
    Sleeps,
    holds_weights,
    make_sampler,
)
from gmts.scale.distributed import DistInfo
from gmts.scale.layout import PlanSettings
from gmts.scale.strategy import Strategy

if TYPE_CHECKING:
    from gmts.train.batch import ScoredBatch
    from gmts.train.config import TrainConfig

__all__ = [
    "EngineInputs",
    "RolloutEngine",
    "check_engine",
    "logprob_gap_metrics",
    "make_engine",
]

MIN_CPU_KV_BYTES = 16 * 2**20
"""What the vllm engine's KV cache on a CPU is given on top of its batch's (tiny models need a
few MiB more)."""


@dataclass(frozen=True)
class EngineInputs:
    """What the engine is built from.

    Attributes:
        cfg: the run's config.
        model: the policy, laid out by ``strategy``.
        tokenizer: the policy's tokenizer.
        strategy: the distributed strategy (it yields the weights a sampler's copy is sent).
        info: this rank's place in the process group.
        device: this rank's device.
        model_path: the folder the policy was loaded from (a resumed run: the checkpoint's).
        model_config: the model's ``transformers`` config.
        prompt_tokens, max_new_tokens: the longest prompt and the generation budget.
    """

    cfg: TrainConfig
    model: torch.nn.Module
    tokenizer: Any
    strategy: Strategy
    info: DistInfo
    device: torch.device
    model_path: str
    model_config: Any
    prompt_tokens: int
    max_new_tokens: int


class RolloutEngine:
    """A :class:`gmts.sampling.sampler.Sampler` for training: ``sampler`` with the weight sync,
    sleep and sampling region its capabilities call for (see the module docstring), and its
    metrics.

    Args:
        sampler: any sampler; its stop rule is the run's.
        model: the policy it samples for.
        strategy: how ``model`` is laid out (its sampling region, its full weights).
    """

    def __init__(self, sampler: Sampler, *, model: torch.nn.Module, strategy: Strategy) -> None:
        self.sampler = sampler
        self.model = model
        self.strategy = strategy
        self.own_weights = isinstance(sampler, HoldsWeights)
        self.sleeps = isinstance(sampler, Sleeps)
        # LoRA: a copy holds the merged model (W + s B A), started from the base (a resumed
        # run's checkpoint holds only the adapters), and is sent the merge at once
        self.adapters = hasattr(model, "get_base_model")
        if self.sleeps:  # outside a rollout the sampler sleeps
            sampler.sleep()
        dropped = self.sleeps and sampler.sleep_drops_weights()  # the first session sends them
        self.stale = self.own_weights and (dropped or self.adapters)
        self.sync_s = 0.0

    @property
    def name(self) -> str:
        return self.sampler.name

    @property
    def tokenizer(self) -> Any:
        return self.sampler.tokenizer

    @property
    def generation_config(self) -> Any:
        return self.sampler.generation_config

    @property
    def stop_token_ids(self) -> list[int]:
        return self.sampler.stop_token_ids

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """One step's rollout rounds (every rank enters and leaves together): a stale copy is
        sent the policy's weights, the sampler wakes, and after the rounds it sleeps and its
        copy is stale (the update that follows changes the policy)."""
        self.sync_s = 0.0
        if self.stale:
            start = time.perf_counter()
            self.sync_weights()
            self.sync_s = time.perf_counter() - start
        region = (
            contextlib.nullcontext() if self.own_weights else self.strategy.sampling(self.model)
        )
        with region, self.sampler.session():
            try:
                yield
            finally:
                self.stale = self.own_weights
                if self.sleeps:
                    self.sampler.sleep()

    def sync_weights(self) -> None:
        """Send the policy's weights to the sampler's copy (collective under fsdp).

        Full fine-tuning: the float32 master weights, one whole parameter at a time
        (``Strategy.full_parameters``). LoRA: the merged weights W + s B A, one merged tensor
        at a time (``merged_weights``; under fsdp with the layers gathered, as for sampling)."""
        if self.adapters:
            with self.strategy.sampling(self.model):
                self.sampler.load_weights(merged_weights(self.model, every_name=True))
        else:
            dtype = self.sampler.weights_dtype()
            self.sampler.load_weights(self.strategy.full_parameters(self.model, dtype))
        self.stale = False

    def sample(self, problems: Sequence[Any], **settings: Any) -> Rollout:
        """The sampler's :meth:`gmts.sampling.sampler.Sampler.sample` (``num_samples``,
        ``max_new_tokens``, ``temperature``, ``seed``), inside a session."""
        return self.sampler.sample(problems, **settings)

    def metrics(self) -> dict[str, float]:
        """``time/weight_sync_s`` of the last session for a sampler with its own copy; {}."""
        return {"time/weight_sync_s": self.sync_s} if self.own_weights else {}

    def close(self) -> None:
        """Release the sampler; vLLM's teardown leaves the process group too (the run's last
        collective is over by then)."""
        self.sampler.close()


def make_engine(inputs: EngineInputs) -> RolloutEngine:
    """The engine of ``inputs.cfg.rollout.engine`` for this rank."""
    sampler = make_sampler(inputs.cfg.rollout.engine, sampler_inputs(inputs))
    return RolloutEngine(sampler, model=inputs.model, strategy=inputs.strategy)


def sampler_inputs(inputs: EngineInputs) -> SamplerInputs:
    """The run's :class:`gmts.sampling.sampler.SamplerInputs`: the policy and the hf settings;
    for a sampler that holds its own weights also where it starts (the policy's folder; with
    LoRA adapters their base) and its KV cache (:func:`engine_kv_cache_bytes`)."""
    cfg = inputs.cfg
    on_gpu = inputs.device.type == "cuda"
    built = SamplerInputs(
        inputs.tokenizer,
        model=inputs.model,
        batch_size=cfg.rollout.generation_batch_size,
        draw=cfg.rollout.draw,
        prepack=cfg.rollout.prepack_weights,
        drop_finished_rows=cfg.rollout.drop_finished_rows,
        vllm=cfg.rollout.vllm,
        dtype=engine_dtype(cfg),
        seed=cfg.seed,
        on_gpu=on_gpu,
        distributed=inputs.info.world_size > 1,
        trust_remote_code=cfg.model.trust_remote_code,
    )
    if not holds_weights(cfg.rollout.engine):
        return built
    start_path = inputs.model_path
    if hasattr(inputs.model, "get_base_model") and is_adapter_folder(start_path):
        start_path = adapter_base_path(start_path)
    return dataclasses.replace(
        built, model_path=start_path, kv_cache_bytes=engine_kv_cache_bytes(inputs, on_gpu)
    )


def engine_dtype(cfg: TrainConfig) -> str:
    """``rollout.vllm.dtype`` resolved: ``auto`` is ``model.dtype``."""
    v = cfg.rollout.vllm
    return cfg.model.dtype if v.dtype == "auto" else v.dtype


def engine_kv_cache_bytes(inputs: EngineInputs, on_gpu: bool) -> int | None:
    """The vllm engine's KV cache in bytes (:func:`gmts.sampling.kv_sizing.vllm_kv_cache_bytes`):
    ``rollout.vllm.kv_cache_gib`` when set; on a GPU otherwise None (vLLM sizes it from
    ``gpu_memory_utilization``); on a CPU the KV cache of one generation batch (the rows a rank
    generates at once, as the memory plan counts them: ``PlanSettings.generation_rows``, of the
    longest prompt + ``max_new_tokens``), at least one sequence of the engine's whole context,
    plus :data:`MIN_CPU_KV_BYTES`."""
    cfg = inputs.cfg
    settings = PlanSettings.from_config(
        cfg,
        world_size=inputs.info.world_size,
        prompt_length=inputs.prompt_tokens,
        response_length=inputs.max_new_tokens,
        gpu=on_gpu,
    )
    positions = getattr(inputs.model_config, "max_position_embeddings", None)
    return vllm_kv_cache_bytes(
        cfg.rollout.vllm,
        KVShape.from_config(inputs.model_config),
        dtype=engine_dtype(cfg),
        on_gpu=on_gpu,
        rows=settings.generation_rows,
        tokens=inputs.prompt_tokens + inputs.max_new_tokens,
        context=positions if isinstance(positions, int) else None,
        margin_bytes=MIN_CPU_KV_BYTES,
    )


def logprob_gap_metrics(batch: ScoredBatch, info: DistInfo) -> dict[str, float]:
    """``rollout/logprob_gap_mean`` and ``rollout/logprob_gap_max``: ``|trainer - engine|``
    log-probs of the sampled tokens over every valid token of the step (all ranks); {} when
    the engine recorded none. The trainer's are ``batch.old_logprobs`` (its own forward of the
    rollout policy, the loss's pi_old)."""
    if batch.engine_logprobs is None:
        return {}
    mask = batch.response_mask
    engine = batch.engine_logprobs.to(batch.old_logprobs.device)
    gap = (batch.old_logprobs.double() - engine.double()).abs() * mask  # (B, T)
    sums = all_reduce_sum(torch.stack([gap.sum(), mask.sum().double()]), info.group)
    peak = all_reduce_max(gap.max() if gap.numel() else gap.new_zeros(()), info.group)
    return {
        "rollout/logprob_gap_mean": (sums[0] / sums[1].clamp_min(1)).item(),
        "rollout/logprob_gap_max": peak.item(),
    }


def check_engine(cfg: TrainConfig, device: torch.device) -> None:
    """What can be checked about the engine on this machine before any model loads:
    ``rollout.prepack_weights`` has a CPU with oneDNN; the sampler's own preflight (vllm: it
    is installed, its sleep mode has a GPU, the engine may run in this process). (The config
    itself does not ask for vllm or a CPU: ``gmts plan`` plans any run anywhere.)"""
    if cfg.rollout.prepack_weights:
        from gmts.sampling.packed_linear import can_prepack

        if not can_prepack(device) or cfg.model.dtype != "float32":
            raise ValueError(
                "rollout.prepack_weights=true packs float32 linear weights for a CPU with "
                f"oneDNN; this run has device {device.type}, model.dtype={cfg.model.dtype}"
                + ("" if torch.backends.mkldnn.is_available() else ", no oneDNN in this torch")
            )
    SAMPLERS.get(cfg.rollout.engine).preflight(
        SamplerInputs(None, vllm=cfg.rollout.vllm, on_gpu=device.type == "cuda"),
        who=f"rollout.engine={cfg.rollout.engine}",
        fields="rollout.vllm.",
    )
