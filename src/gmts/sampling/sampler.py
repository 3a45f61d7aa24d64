"""The one sampling protocol, :class:`Sampler`, and its one registry, :data:`SAMPLERS`.

Everything that samples answers samples through a :class:`Sampler`: the trainer (``rollout.engine``
names one; :class:`gmts.train.rollout_engine.RolloutEngine` wraps it for training) and
``gmts eval`` (``--backend`` names one; :func:`gmts.eval.backends.make_backend` loads it). The
implementations are registered by name (``hf``: the KV-cached
:func:`gmts.sampling.rollout.generate_rollouts` on a loaded model; ``vllm``: a colocated
:class:`gmts.sampling.vllm_engine.VLLMEngine`) and all are built from one
:class:`SamplerInputs`. A sampler has

- **its stop rule**, fixed when it is built: ``stop_token_ids``, the end token
  (``SamplerInputs.eos_token_id``, default the tokenizer's eos; ``gmts eval`` gives the chat
  template's end-of-turn token) followed by the generation config's eos ids;
- **sessions**: ``session()`` is the context around the ``sample`` calls that belong together
  (one training step's rounds, one evaluation); a sampler that can release its memory is awake
  inside it;
- ``sample(problems, *, num_samples, max_new_tokens, temperature, seed)`` -> the
  :class:`Rollout` record, the same from every sampler;
- ``close()``.

What only some samplers can do is an optional capability: a small protocol that the
implementation (or its class, :func:`holds_weights`) is checked against, never its name:

- :class:`HoldsWeights`: it samples from its own copy of the weights, started from
  ``SamplerInputs.model_path`` (vllm), not from the module it was given; whoever changes the
  model sends it the new weights (the trainer, after every update);
- :class:`Sleeps`: it can release its memory between sessions (vLLM's sleep mode).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from gmts._registry import Registry
from gmts.sampling.rollout import Rollout, encode_prompts, stop_ids_from_eos
from gmts.sampling.vllm_engine import VLLMConfig, VLLMEngine, check_engine_can_start

__all__ = [
    "SAMPLERS",
    "HFSampler",
    "HoldsWeights",
    "Sampler",
    "SamplerBase",
    "SamplerInputs",
    "Sleeps",
    "VLLMSampler",
    "holds_weights",
    "make_sampler",
]


@dataclass(frozen=True)
class SamplerInputs:
    """What every sampler is built from; each reads the fields that apply to it.

    Attributes:
        tokenizer: encodes the prompts and decodes the completions.
        eos_token_id: the id that ends an answer in place of the tokenizer's eos (``gmts
            eval``: the chat template's end-of-turn token); None: the tokenizer's eos. The
            generation config's eos ids end one too (:attr:`Sampler.stop_token_ids`).
        context: the most tokens a row may hold (prompt + answer: the model's context); a call
            whose longest prompt + ``max_new_tokens`` exceeds it is refused before sampling.
            None: not checked (the trainer checks its data once, before any weight is read).
        model: hf: the loaded causal LM to sample from.
        batch_size: hf: at most this many rows per forward pass (None: all at once).
        draw: hf: how a token is drawn (:data:`gmts.sampling.draws.DRAWS`).
        prepack: hf: multiply against oneDNN-prepacked linear weights on a CPU
            (:mod:`gmts.sampling.packed_linear`).
        drop_finished_rows: hf: rows that have stopped leave the batch
            (:data:`gmts.sampling.rollout.DROP_ROWS_AT`) and a group's prompt is prefilled
            once; False computes every row's prompt and keeps every row until the last stops.
        model_path: vllm: the model folder the engine starts from.
        vllm: vllm: the engine's settings.
        dtype, seed, on_gpu, kv_cache_bytes, distributed, trust_remote_code: vllm: the
            :class:`gmts.sampling.vllm_engine.VLLMEngine` arguments of the same names.
    """

    tokenizer: Any
    eos_token_id: int | None = None
    context: int | None = None
    model: torch.nn.Module | None = None
    batch_size: int | None = None
    draw: str = "multinomial"
    prepack: bool = False
    drop_finished_rows: bool = True
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
    """Samples answers to prompts (see the module docstring).

    Attributes:
        name: the registered name.
        tokenizer: the tokenizer it encodes and decodes with.
        generation_config: the model's ``transformers`` generation config, or None (its
            ``eos_token_id`` is part of the stop rule).
        stop_token_ids: the stop rule: a row ends after its first of these ids (kept).
    """

    name: str
    tokenizer: Any
    generation_config: Any
    stop_token_ids: list[int]

    def session(self) -> contextlib.AbstractContextManager[None]:
        """The context around ``sample`` calls that belong together (every rank enters and
        leaves it together); a sampler that can sleep is awake inside."""
        ...

    def sample(
        self,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> Rollout:
        """``num_samples`` answers per problem (B = Q * G rows, grouped), sampled with ``seed``
        (the same arguments give the same tokens); a row ends after its first id in
        ``stop_token_ids`` (kept) or after ``max_new_tokens``; temperature 0 is greedy."""
        ...

    def close(self) -> None:
        """Release the sampler's memory."""
        ...


@runtime_checkable
class HoldsWeights(Protocol):
    """Optional capability: the sampler samples from its own copy of the weights (started from
    ``SamplerInputs.model_path``), so a changed model reaches it only through
    :meth:`load_weights`."""

    def weights_dtype(self) -> torch.dtype:
        """The dtype its copy is held in (what the weights are best sent as)."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace its copy by ``(name, tensor)`` pairs in the Hugging Face checkpoint's names
        (every parameter once), consumed one at a time; works while the rest sleeps."""
        ...


@runtime_checkable
class Sleeps(Protocol):
    """Optional capability: the sampler can release its memory between sessions (a no-op where
    its sleep mode is off); the next ``session()`` or ``load_weights`` takes it back."""

    def sleep(self) -> None:
        """Release the memory."""
        ...

    def sleep_drops_weights(self) -> bool:
        """Whether :meth:`sleep` discards the weights (they must be loaded before the next
        session samples), rather than keeping them aside."""
        ...


class SamplerBase:
    """What the registered samplers share: the stop rule built from :class:`SamplerInputs`,
    the context check, a null session, and :meth:`Sampler.sample` passed on to
    ``self._sampler()`` with the stop ids.

    A registered class also has :meth:`preflight`: what it can refuse from its inputs before
    anything loads (a tokenizer or a model is not needed yet)."""

    name: str
    tokenizer: Any
    generation_config: Any
    stop_token_ids: list[int]
    context: int | None

    def _set_limits(self, inputs: SamplerInputs) -> None:
        """``stop_token_ids`` and ``context`` from ``inputs``, once the generation config is
        known."""
        eos = inputs.tokenizer.eos_token_id if inputs.eos_token_id is None else inputs.eos_token_id
        self.stop_token_ids = stop_ids_from_eos(eos, self.generation_config)
        self.context = inputs.context

    @classmethod
    def preflight(cls, inputs: SamplerInputs, *, who: str, fields: str = "") -> None:
        """Refuse ``inputs`` that cannot start on this machine, naming ``who`` (the setting
        that chose this sampler) and ``fields`` (where its settings are set); nothing here."""

    def _sampler(self) -> Callable[..., Rollout]:
        raise NotImplementedError

    def session(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sample(
        self,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> Rollout:
        if self.context is not None:
            self._check_context(problems, max_new_tokens)
        return self._sampler()(
            problems,
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=self.stop_token_ids,
        )

    def _check_context(self, problems: Sequence[Any], max_new_tokens: int) -> None:
        """ValueError when the longest prompt + ``max_new_tokens`` exceeds ``context`` (a clear
        error instead of an IndexError deep in the position embedding)."""
        _, _, encoded = encode_prompts(self.tokenizer, problems)
        longest = max(len(ids) for ids in encoded)
        if longest + max_new_tokens > self.context:
            raise ValueError(
                f"the {self.name} sampler: the longest prompt ({longest} tokens) + "
                f"{max_new_tokens} new tokens = {longest + max_new_tokens} tokens exceeds the "
                f"model's context of {self.context}; sample fewer new tokens (max_new_tokens) "
                "or use a model with a longer context"
            )

    def close(self) -> None:
        pass


SAMPLERS: Registry[type[SamplerBase]] = Registry("sampler")


@SAMPLERS.decorator("hf")
class HFSampler(SamplerBase):
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
        self.drop_finished_rows = inputs.drop_finished_rows
        self._set_limits(inputs)

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
            drop_finished_rows=self.drop_finished_rows,
        )


@SAMPLERS.decorator("vllm")
class VLLMSampler(SamplerBase):
    """A :class:`gmts.sampling.vllm_engine.VLLMEngine` started from ``SamplerInputs.model_path``
    (``engine``); it holds its own weights (:class:`HoldsWeights`) and sleeps (:class:`Sleeps`)
    when its sleep mode is on."""

    name = "vllm"

    @classmethod
    def preflight(cls, inputs: SamplerInputs, *, who: str, fields: str = "") -> None:
        """:func:`gmts.sampling.vllm_engine.check_engine_can_start` (vllm installed, sleep
        mode on a GPU only, the engine in this process)."""
        check_engine_can_start(
            inputs.vllm or VLLMConfig(), on_gpu=inputs.on_gpu, who=who, fields=fields
        )

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
        self._set_limits(inputs)

    def _sampler(self) -> Callable[..., Rollout]:
        return functools.partial(self.engine.sample_rollouts, self.tokenizer)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        self.engine.wake_up()  # whatever sleeps (nothing without sleep mode)
        yield

    def weights_dtype(self) -> torch.dtype:
        return self.engine.torch_dtype

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.wake_up(["weights"])  # the KV cache sleeps on while the weights arrive
        self.engine.load_weights(weights)

    def sleep(self) -> None:
        self.engine.sleep()

    def sleep_drops_weights(self) -> bool:
        return self.engine.sleeps and self.engine.config.sleep_level == 2

    def close(self) -> None:
        self.engine.close()


def make_sampler(name: str, inputs: SamplerInputs) -> Sampler:
    """The sampler ``name`` built from ``inputs``; unknown names list the valid ones."""
    return SAMPLERS.get(name)(inputs)


def holds_weights(name: str) -> bool:
    """Whether the sampler ``name`` holds its own copy of the weights (:class:`HoldsWeights`):
    it starts from ``SamplerInputs.model_path`` and needs no loaded model. Asked before it is
    built, to load only what it reads."""
    return issubclass(SAMPLERS.get(name), HoldsWeights)
