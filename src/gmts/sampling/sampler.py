"""One sampling protocol for the trainer's rollout engines and ``gmts eval``: :class:`Sampler`.

The implementations are registered by name in :data:`SAMPLERS` (``hf``: the KV-cached
:func:`gmts.sampling.rollout.generate_rollouts` on a loaded model; ``vllm``: a colocated
:class:`gmts.sampling.vllm_engine.VLLMEngine`) and all are built from one
:class:`SamplerInputs`. A sampler's call returns the :class:`Rollout` record and takes the stop
ids as an argument, because the stop rule is the caller's: the trainer stops at the
tokenizer's eos plus the generation config's (:func:`eos_stop_ids`), ``gmts eval`` at the chat
template's end-of-turn token instead of eos (``gmts.eval.backends``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from gmts._registry import Registry
from gmts.sampling.rollout import Rollout, stop_ids_from_eos
from gmts.sampling.vllm_engine import VLLMConfig, VLLMEngine

__all__ = ["SAMPLERS", "Sampler", "SamplerInputs", "eos_stop_ids", "make_sampler"]


@dataclass(frozen=True)
class SamplerInputs:
    """What every sampler is built from; each reads the fields that apply to it.

    Attributes:
        tokenizer: encodes the prompts and decodes the completions.
        model: hf: the loaded causal LM to sample from.
        batch_size: hf: at most this many rows per forward pass (None: all at once).
        draw: hf: how a token is drawn (:data:`gmts.sampling.draws.DRAWS`).
        prepack: hf: multiply against oneDNN-prepacked linear weights on a CPU
            (:mod:`gmts.sampling.packed_linear`).
        model_path: vllm: the model folder the engine starts from.
        vllm: vllm: the engine's settings.
        dtype, seed, on_gpu, kv_cache_bytes, distributed, trust_remote_code: vllm: the
            :class:`gmts.sampling.vllm_engine.VLLMEngine` arguments of the same names.
    """

    tokenizer: Any
    model: torch.nn.Module | None = None
    batch_size: int | None = None
    draw: str = "multinomial"
    prepack: bool = False
    model_path: str | os.PathLike[str] | None = None
    vllm: VLLMConfig | None = None
    dtype: str = "auto"
    seed: int = 0
    on_gpu: bool = False
    kv_cache_bytes: int | None = None
    distributed: bool = False
    trust_remote_code: bool = False


@runtime_checkable
class Sampler(Protocol):
    """Samples answers to prompts.

    Attributes:
        name: the registered name.
        tokenizer: the tokenizer it encodes and decodes with.
        generation_config: the model's ``transformers`` generation config, or None (its
            ``eos_token_id`` is part of the default stop rule, :func:`eos_stop_ids`).
    """

    name: str
    tokenizer: Any
    generation_config: Any

    def sample(
        self,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        stop_token_ids: Sequence[int],
    ) -> Rollout:
        """``num_samples`` answers per problem (B = Q * G rows, grouped), sampled with ``seed``
        (the same arguments give the same tokens); a row ends after its first id in
        ``stop_token_ids`` (kept) or after ``max_new_tokens``; temperature 0 is greedy."""
        ...

    def close(self) -> None:
        """Release the sampler's memory."""
        ...


SAMPLERS: Registry[Callable[[SamplerInputs], Sampler]] = Registry("sampler")


class _SamplerBase:
    """:meth:`Sampler.sample` with the arguments every implementation shares passed on to
    ``self._sampler()``."""

    def _sampler(self) -> Callable[..., Rollout]:
        raise NotImplementedError

    def sample(
        self,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        stop_token_ids: Sequence[int],
    ) -> Rollout:
        return self._sampler()(
            problems,
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=stop_token_ids,
        )


@SAMPLERS.decorator("hf")
class HFSampler(_SamplerBase):
    """:func:`gmts.sampling.rollout.generate_rollouts` on ``SamplerInputs.model``."""

    name = "hf"

    def __init__(self, inputs: SamplerInputs) -> None:
        if inputs.model is None:
            raise ValueError("the hf sampler needs SamplerInputs.model")
        self.model = inputs.model
        self.tokenizer = inputs.tokenizer
        self.batch_size = inputs.batch_size
        self.draw = inputs.draw
        self.prepack = inputs.prepack

    @property
    def generation_config(self) -> Any:
        return getattr(self.model, "generation_config", None)

    def _sampler(self) -> Callable[..., Rollout]:
        from gmts.sampling import rollout  # looked up at the call (tests count its calls)

        return functools.partial(
            rollout.generate_rollouts,
            self.model,
            self.tokenizer,
            batch_size=self.batch_size,
            draw=self.draw,
            prepack=self.prepack,
        )

    def close(self) -> None:
        pass


@SAMPLERS.decorator("vllm")
class VLLMSampler(_SamplerBase):
    """A :class:`gmts.sampling.vllm_engine.VLLMEngine` started from ``SamplerInputs.model_path``
    (``engine``: the trainer also sleeps, wakes and reloads it)."""

    name = "vllm"

    def __init__(self, inputs: SamplerInputs) -> None:
        if inputs.model_path is None or inputs.vllm is None:
            raise ValueError("the vllm sampler needs SamplerInputs.model_path and .vllm")
        self.tokenizer = inputs.tokenizer
        self.engine = VLLMEngine(
            inputs.model_path,
            inputs.vllm,
            dtype=inputs.dtype,
            seed=inputs.seed,
            on_gpu=inputs.on_gpu,
            kv_cache_bytes=inputs.kv_cache_bytes,
            distributed=inputs.distributed,
            trust_remote_code=inputs.trust_remote_code,
        )
        self.generation_config = self.engine.generation_config

    def _sampler(self) -> Callable[..., Rollout]:
        return functools.partial(self.engine.sample_rollouts, self.tokenizer)

    def close(self) -> None:
        self.engine.close()


def make_sampler(name: str, inputs: SamplerInputs) -> Sampler:
    """The sampler ``name`` built from ``inputs``; unknown names list the valid ones."""
    return SAMPLERS.get(name)(inputs)


def eos_stop_ids(sampler: Sampler, eos_token_id: int | None = None) -> list[int]:
    """``eos_token_id`` (default: the tokenizer's eos) then the generation config's eos ids,
    without repeats: the trainer's stop rule, and eval's with its end-of-turn token as eos."""
    eos = sampler.tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    return stop_ids_from_eos(eos, sampler.generation_config)
