"""Rollout engines: who samples the trainer's rollouts (``rollout.engine``), by name.

Every engine is built once, in ``Trainer.__init__``, from one :class:`EngineInputs`, and has
the same three methods (:class:`RolloutEngine`), so the collection (:mod:`gmts.train.collect`)
and the step never ask which one they have:

- ``session()``: the context around one step's rollout rounds; every rank enters and leaves
  it together;
- ``generate(problems, *, num_samples, max_new_tokens, temperature, seed)`` -> a
  :class:`gmts.sampling.rollout.Rollout` (the same record from every engine);
- ``metrics()``: the engine's rows of the step's ``metrics.jsonl`` row;
- ``close()``: release it when the run is over.

Both sample through the one sampling protocol (:mod:`gmts.sampling.sampler`, the sampler of
the engine's name) and stop at the tokenizer's eos plus the generation config's.

``hf``: :func:`gmts.sampling.rollout.generate_rollouts` on the policy itself, inside the
strategy's sampling region (``Strategy.sampling``: one bf16 cast, or FSDP's layers gathered
once). ``rollout.generation_batch_size`` rows at a time; one generator seeded by ``seed``.

``vllm``: a colocated :class:`gmts.sampling.vllm_engine.VLLMEngine` per rank, in the trainer's
process (tensor parallel 1; ``external_launcher`` under torchrun), started from the same
weights as the policy. Its session:

1. wakes the engine's weights (sleep mode);
2. when the policy changed since the engine last got it (after every update: a session ends
   with the engine marked stale), pushes the policy's weights into it:
   ``Strategy.full_parameters`` yields the float32 master weights one whole parameter at a
   time (under FSDP each is cast on its shard and all-gathered, so no rank holds a second
   whole model), the engine casts each to its dtype and reloads it in place
   (``time/weight_sync_s``);
3. wakes the KV cache, samples the step's rounds, and puts the engine back to sleep.

Each row's request is seeded from ``(seed, step, round, rank, row)``: the collection's
``sampling_seed(seed, step, round, rank)`` and the row (:func:`request_seeds`), so a resumed
run samples what the uninterrupted one did. The engine's log-probs of the sampled tokens travel
with the batch (``TrainBatch.engine_logprobs``); the loss's pi_old stays the trainer's own
forward, and :func:`logprob_gap_metrics` logs how far the two are apart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from gmts._registry import Registry
from gmts.core.distributed import all_reduce_max, all_reduce_sum
from gmts.models.lora import adapter_base_path, is_adapter_folder, merged_weights
from gmts.sampling.kv_sizing import KVShape, vllm_kv_cache_bytes
from gmts.sampling.rollout import Rollout
from gmts.sampling.sampler import Sampler, SamplerInputs, eos_stop_ids, make_sampler
from gmts.scale.distributed import DistInfo
from gmts.scale.layout import PlanSettings
from gmts.scale.strategy import Strategy

if TYPE_CHECKING:  # config.py imports this module lazily (available_engines)
    from gmts.train.batch import ScoredBatch
    from gmts.train.config import TrainConfig

__all__ = [
    "ENGINES",
    "EngineInputs",
    "HFEngine",
    "RolloutEngine",
    "VLLMRolloutEngine",
    "available_engines",
    "check_engine",
    "logprob_gap_metrics",
    "make_engine",
]

MIN_CPU_KV_BYTES = 16 * 2**20
"""What the vllm engine's KV cache on a CPU is given on top of its batch's (tiny models need a
few MiB more)."""


@runtime_checkable
class RolloutEngine(Protocol):
    """What the collection needs from an engine (see the module docstring)."""

    name: str

    def session(self) -> contextlib.AbstractContextManager[None]:
        """Around one step's rollout rounds (every rank enters and leaves together)."""
        ...

    def generate(
        self,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> Rollout:
        """``num_samples`` answers per problem (rows grouped), sampled with ``seed``."""
        ...

    def metrics(self) -> dict[str, float]:
        """The engine's metrics of the last session ({} when it has none)."""
        ...

    def close(self) -> None:
        """Release the engine (the run is over)."""
        ...


@dataclass(frozen=True)
class EngineInputs:
    """What an engine is built from (one type for every engine).

    Attributes:
        cfg: the run's config.
        model: the policy, laid out by ``strategy``.
        tokenizer: the policy's tokenizer.
        strategy: the distributed strategy (it yields the weights an engine is sent).
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


ENGINES: Registry[Callable[[EngineInputs], RolloutEngine]] = Registry("rollout engine")


class _SamplerEngine:
    """What both engines share: sampling through their :class:`gmts.sampling.sampler.Sampler`
    with the trainer's stop rule, the tokenizer's eos plus the generation config's
    (:func:`gmts.sampling.sampler.eos_stop_ids`)."""

    sampler: Sampler

    def generate(
        self,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> Rollout:
        return self.sampler.sample(
            problems,
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=eos_stop_ids(self.sampler),
        )

    def close(self) -> None:
        """Release the sampler; vLLM's teardown leaves the process group too (the run's last
        collective is over by then)."""
        self.sampler.close()


@ENGINES.decorator("hf")
class HFEngine(_SamplerEngine):
    """The KV-cached sampler on the policy itself."""

    name = "hf"

    def __init__(self, inputs: EngineInputs) -> None:
        self.model = inputs.model
        self.strategy = inputs.strategy
        self.sampler = make_sampler(
            "hf",
            SamplerInputs(
                inputs.tokenizer,
                model=inputs.model,
                batch_size=inputs.cfg.rollout.generation_batch_size,
                draw=inputs.cfg.rollout.draw,
                prepack=inputs.cfg.rollout.prepack_weights,
            ),
        )

    def session(self) -> contextlib.AbstractContextManager[None]:
        return self.strategy.sampling(self.model)

    def metrics(self) -> dict[str, float]:
        return {}


@ENGINES.decorator("vllm")
class VLLMRolloutEngine(_SamplerEngine):
    """A colocated vLLM engine that is sent the policy's weights before every rollout that
    follows an update (see the module docstring)."""

    name = "vllm"

    def __init__(self, inputs: EngineInputs) -> None:
        cfg = inputs.cfg
        v = cfg.rollout.vllm
        on_gpu = inputs.device.type == "cuda"
        self.model = inputs.model
        self.strategy = inputs.strategy
        # LoRA: the engine holds the merged model (W + s B A), started from the base (a
        # resumed run's checkpoint holds only the adapters) and sent the merge at once
        self.adapters = hasattr(inputs.model, "get_base_model")
        start_path = inputs.model_path
        if self.adapters and is_adapter_folder(start_path):
            start_path = adapter_base_path(start_path)
        self.sampler = make_sampler(
            "vllm",
            SamplerInputs(
                inputs.tokenizer,
                model_path=start_path,
                vllm=v,
                dtype=engine_dtype(cfg),
                seed=cfg.seed,
                on_gpu=on_gpu,
                kv_cache_bytes=engine_kv_cache_bytes(inputs, on_gpu),
                distributed=inputs.info.world_size > 1,
                trust_remote_code=cfg.model.trust_remote_code,
            ),
        )
        self.engine = self.sampler.engine
        # Outside a rollout the engine sleeps (sleep mode); level 2 drops the weights it was
        # started with, so the first session sends them.
        self.engine.sleep()
        self.stale = (self.engine.sleeps and v.sleep_level == 2) or self.adapters
        self.sync_s = 0.0

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        self.engine.wake_up(["weights"])
        self.sync_s = 0.0
        if self.stale:
            start = time.perf_counter()
            self.sync_weights()
            self.sync_s = time.perf_counter() - start
        self.engine.wake_up()  # the KV cache
        try:
            yield
        finally:
            self.stale = True  # the update that follows changes the policy
            self.engine.sleep()

    def sync_weights(self) -> None:
        """Send the policy's weights to the engine (collective under fsdp).

        Full fine-tuning: the float32 master weights, one whole parameter at a time
        (``Strategy.full_parameters``). LoRA: the merged weights W + s B A, one merged tensor
        at a time (``merged_weights``; under fsdp with the layers gathered, as for sampling)."""
        if self.adapters:
            with self.strategy.sampling(self.model):
                self.engine.load_weights(merged_weights(self.model, every_name=True))
        else:
            weights = self.strategy.full_parameters(self.model, self.engine.torch_dtype)
            self.engine.load_weights(weights)
        self.stale = False

    def metrics(self) -> dict[str, float]:
        return {"time/weight_sync_s": self.sync_s}


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


def available_engines() -> list[str]:
    """Names accepted by ``rollout.engine``."""
    return ENGINES.names()


def check_engine(cfg: TrainConfig, device: torch.device) -> None:
    """What can be checked about the engine on this machine before any model loads: hf's
    ``rollout.prepack_weights`` has a CPU with oneDNN; vllm is installed, its sleep mode has a
    GPU, the engine may run in this process. (The config itself does not ask for vllm or a
    CPU: ``gmts plan`` plans any run anywhere.)"""
    if cfg.rollout.prepack_weights:
        from gmts.sampling.packed_linear import can_prepack

        if not can_prepack(device) or cfg.model.dtype != "float32":
            raise ValueError(
                "rollout.prepack_weights=true packs float32 linear weights for a CPU with "
                f"oneDNN; this run has device {device.type}, model.dtype={cfg.model.dtype}"
                + ("" if torch.backends.mkldnn.is_available() else ", no oneDNN in this torch")
            )
    if cfg.rollout.engine != "vllm":
        return
    from gmts.sampling.vllm_engine import check_engine_can_start

    check_engine_can_start(
        cfg.rollout.vllm,
        on_gpu=device.type == "cuda",
        who="rollout.engine=vllm",
        fields="rollout.vllm.",
    )


def make_engine(inputs: EngineInputs) -> RolloutEngine:
    """The engine ``inputs.cfg.rollout.engine`` for this rank."""
    return ENGINES.get(inputs.cfg.rollout.engine)(inputs)
