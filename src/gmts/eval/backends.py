"""Text-generation backends for the evaluation harness, by name: ``hf`` and ``vllm``.

A backend turns prompt strings into ``n`` completion strings each. All backends share one
signature (:class:`GenerationBackend`), so the harness never special-cases one; tests plug in a
fake. ``temperature == 0`` means greedy decoding.

- ``hf``: Hugging Face ``transformers`` on CPU or GPU, sampling through
  :func:`gmts.sampling.rollout.generate_rollouts`, the same KV-cached sampler training uses.
- ``vllm``: vLLM's offline engine when the package is installed (import guarded), through the
  engine wrapper the trainer uses (:mod:`gmts.sampling.vllm_engine`), with the same sampling
  semantics as ``hf`` (on the embedded warm start in float32 the greedy answers of the two are
  identical: tests/vllm/test_vllm_eval.py).

Both sample through the one sampling protocol the trainer's engines use
(:mod:`gmts.sampling.sampler`), stopping at the chat template's end-of-turn token in place of
eos (:func:`end_of_turn_id`). Also here: :func:`check_benchmarks_fit`, the context guard ``gmts eval`` runs before loading a
model. Model paths are resolved and models loaded by :mod:`gmts.models.loading`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gmts._registry import Registry
from gmts.models.loading import (
    load_model,
    load_tokenizer,
    pick_device,
    resolve_model_path,
    torch_dtype,
)
from gmts.sampling.kv_sizing import KVShape, vllm_kv_cache_bytes
from gmts.sampling.sampler import Sampler, SamplerInputs, eos_stop_ids, make_sampler
from gmts.sampling.vllm_engine import VLLMConfig, check_engine_can_start


@dataclass(frozen=True)
class BackendOptions:
    """What every backend is built from (one type for all, so callers never special-case one);
    each backend reads the fields that apply to it.

    Attributes:
        model_path: anything :func:`gmts.models.loading.resolve_model_path` accepts.
        device: hf: "cpu", "cuda", "cuda:1" or "auto" (GPU when available).
        dtype: "auto" (bfloat16 on GPU, float32 on CPU; vllm: its own choice), "float32",
            "bfloat16" or "float16".
        batch_size: hf: at most this many sequences per forward pass (None: all at once).
        seed: vllm: the engine's seed (every request also carries its own).
        gpu_memory_utilization: vllm: the fraction of GPU memory the engine may take.
        engine_kwargs: vllm: further ``vllm.LLM`` keyword arguments.
    """

    model_path: str | os.PathLike[str]
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int | None = None
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@runtime_checkable
class GenerationBackend(Protocol):
    """What the harness needs from a generator.

    Attributes:
        name: backend name (recorded in the results).
        tokenizer: the tokenizer whose chat template formats the prompts, or None (plain text).
    """

    name: str
    tokenizer: Any

    def generate(
        self,
        prompts: list[str],
        *,
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[str]]:
        """``n`` completions for each prompt: a list of ``len(prompts)`` lists of ``n`` strings.

        The completions are decoded without special tokens. The same ``(prompts, n,
        temperature, max_new_tokens, seed)`` must give the same completions (on the same
        hardware): resumed evaluations rely on it.
        """
        ...


# ------------------------------------------------------------------------------------------
# context guard


def check_benchmarks_fit(
    model_path: str | os.PathLike[str],
    benchmarks: list[str],
    *,
    max_new_tokens: int | None,
    data_dir: str | None = None,
    limit: int | None = None,
) -> None:
    """Check, from the model's config.json and tokenizer only (no weights), that every
    benchmark's longest formatted prompt + its generation budget fits the model's context.

    Raises:
        gmts.models.context.ContextError: naming the benchmark, the numbers and the flags.
    """
    from gmts.data.prompts import resolve_template
    from gmts.eval.benchmarks import get_spec, is_data_file, load_eval_benchmark
    from gmts.models.context import check_fits, longest_prompt, read_limit

    path = resolve_model_path(model_path)
    tokenizer = load_tokenizer(path, pad_token=False)
    context = read_limit(str(path), tokenizer)
    if context is None:
        return
    for name in benchmarks:
        bench = load_eval_benchmark(name, tokenizer=tokenizer, data_dir=data_dir, limit=limit)
        spec = get_spec(name)
        budget = max_new_tokens or spec.max_new_tokens
        default = "" if max_new_tokens else f" (default: the benchmark's {budget})"
        # your file's template adds its text to every prompt: it is named first
        template = resolve_template(spec.template, tokenizer) if is_data_file(name) else None
        check_fits(
            prompt_tokens=longest_prompt(tokenizer, [item.prompt for item in bench.items]),
            new_tokens=budget,
            limit=context,
            what=f"benchmark {name}" + (f" (template {template})" if template else ""),
            settings=(f"--template (now {template}), " if template else "")
            + f"--max-new-tokens{default} or --benchmarks",
        )


# ------------------------------------------------------------------------------------------
# the backends: a gmts.sampling sampler with eval's stop rule


class _SamplerBackend:
    """What both backends share: prompts checked against the context, sampled through
    ``self.sampler`` (:class:`gmts.sampling.sampler.Sampler`) with eval's stop rule (the chat
    template's end-of-turn token in place of eos: :func:`end_of_turn_id`), completions grouped
    by prompt."""

    name: str
    tokenizer: Any
    sampler: Sampler
    context: int | None

    def generate(
        self,
        prompts: list[str],
        *,
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[str]]:
        from gmts.embedded.tasks import Problem
        from gmts.models.context import check_fits, longest_prompt

        check_fits(  # a clear error instead of an IndexError deep in the position embedding
            prompt_tokens=longest_prompt(self.tokenizer, prompts),
            new_tokens=max_new_tokens,
            limit=self.context,
            what=f"{self.name} backend",
            settings="max_new_tokens (gmts eval --max-new-tokens)",
        )
        rollout = self.sampler.sample(
            [Problem(prompt=p, answer="") for p in prompts],
            num_samples=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
            stop_token_ids=eos_stop_ids(self.sampler, end_of_turn_id(self.tokenizer)),
        )
        return group_completions(rollout.completions, rollout.group_ids, len(prompts), n)

    def close(self) -> None:
        """Release the sampler (frees the vllm engine's memory)."""
        self.sampler.close()


class HFBackend(_SamplerBackend):
    """Generation with a ``transformers`` causal LM and :func:`generate_rollouts`.

    Built from :class:`BackendOptions`: ``model_path``, ``device``, ``dtype``, ``batch_size``.
    """

    name = "hf"

    def __init__(self, options: BackendOptions) -> None:
        self.model_path = resolve_model_path(options.model_path)
        self.device = pick_device(options.device)
        self.tokenizer = load_tokenizer(self.model_path, pad_token=False)
        self.model = load_model(
            self.model_path, dtype=torch_dtype(options.dtype, self.device), training=False
        ).to(self.device)
        self.sampler = make_sampler(
            "hf", SamplerInputs(self.tokenizer, model=self.model, batch_size=options.batch_size)
        )
        from gmts.models.context import context_limit

        self.context = context_limit(self.model.config, self.tokenizer, str(self.model_path))


_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The chat template's end-of-turn token id when it is not the eos token, else None: eval
    stops sampling there in place of eos.

    Base models used with a chat template (Qwen2.5-Math: eos ``<|endoftext|>``, turns end with
    ``<|im_end|>``) would otherwise run on past the answer into a new turn until the budget.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    for token in _END_OF_TURN_TOKENS:
        if token in template and token != tokenizer.eos_token:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                return token_id
    return None


def group_completions(
    completions: list[str], group_ids: Any, num_prompts: int, n: int
) -> list[list[str]]:
    """Split a flat list of ``num_prompts * n`` completions into per-prompt lists by group id.

    Args:
        completions: ``B`` strings, ``B = num_prompts * n``.
        group_ids: ``(B,)`` prompt index of each completion (tensor or sequence).
    """
    ids = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
    if len(completions) != num_prompts * n or len(ids) != len(completions):
        raise RuntimeError(
            f"backend returned {len(completions)} completions for {num_prompts} prompts x {n}"
        )
    grouped: list[list[str]] = [[] for _ in range(num_prompts)]
    for gid, text in zip(ids, completions):
        grouped[int(gid)].append(text)
    if any(len(g) != n for g in grouped):
        raise RuntimeError("backend returned an uneven number of completions per prompt")
    return grouped


# ------------------------------------------------------------------------------------------
# vLLM backend


def check_whole_model(model_path: str | os.PathLike[str], who: str) -> None:
    """ValueError when ``model_path`` designates LoRA adapters (a LoRA run's checkpoint), which
    ``who`` cannot load: it needs a whole model, which ``gmts export`` writes (merged)."""
    from gmts.models.lora import is_adapter_folder

    path = resolve_model_path(model_path)
    if is_adapter_folder(path):
        raise ValueError(
            f"{path} holds LoRA adapters, not a whole model, and {who} needs one: write the "
            f"merged model with `gmts export {model_path} OUT_DIR` and evaluate OUT_DIR, or use "
            "--backend hf (which merges the adapters itself)"
        )


class VLLMBackend(_SamplerBackend):
    """Generation with vLLM's offline engine, through the same colocated engine wrapper the
    trainer samples with (:class:`gmts.sampling.vllm_engine.VLLMEngine`).

    The same sampling semantics as ``hf``: prompts tokenized as the hf backend does (no special
    tokens added), plain softmax at the temperature, a row ends at the same stop ids (the
    chat template's end-of-turn token included), completions decoded the same way. Each row's
    request carries its own seed (from the call's seed and the row), so results do not depend
    on which other prompts share the engine's batch. Built from :class:`BackendOptions`:
    ``model_path``, ``dtype``, ``seed``, ``gpu_memory_utilization``, ``engine_kwargs`` (keys
    that are :class:`VLLMConfig` fields, e.g. ``enforce_eager`` or ``kv_cache_gib``, set those
    fields; the rest go to ``vllm.LLM``). On a CPU the KV cache is sized for
    :data:`CPU_ROWS` sequences of the model's whole context, at most :data:`CPU_KV_CAP_BYTES`
    (vLLM would otherwise reserve ``gpu_memory_utilization`` of the machine's RAM).
    """

    name = "vllm"
    CPU_ROWS = 256
    CPU_KV_CAP_BYTES = 4 * 2**30

    def __init__(self, options: BackendOptions) -> None:
        import dataclasses

        import torch

        fields = {f.name for f in dataclasses.fields(VLLMConfig)}
        extra = dict(options.engine_kwargs)
        config = VLLMConfig(
            gpu_memory_utilization=options.gpu_memory_utilization,
            **{k: extra.pop(k) for k in list(extra) if k in fields},
            engine_kwargs=extra,
        )
        on_gpu = torch.cuda.is_available()
        check_engine_can_start(config, on_gpu=on_gpu, who="the vllm backend")
        check_whole_model(options.model_path, "the vllm backend")
        self.model_path = resolve_model_path(options.model_path)
        self.tokenizer = load_tokenizer(self.model_path, pad_token=False)
        from transformers import AutoConfig

        from gmts.models.context import context_limit

        model_config = AutoConfig.from_pretrained(self.model_path)
        self.context = context_limit(model_config, self.tokenizer, str(self.model_path))
        kv = self.kv_cache_bytes(config, model_config, dtype=options.dtype, on_gpu=on_gpu)
        inputs = SamplerInputs(
            self.tokenizer,
            model_path=self.model_path,
            vllm=config,
            dtype=options.dtype,
            seed=options.seed,
            on_gpu=on_gpu,
            kv_cache_bytes=kv,
        )
        self.sampler = make_sampler("vllm", inputs)

    @classmethod
    def kv_cache_bytes(
        cls, config: VLLMConfig, model_config: Any, *, dtype: str, on_gpu: bool
    ) -> int | None:
        """The engine's KV cache (:func:`gmts.sampling.kv_sizing.vllm_kv_cache_bytes`):
        ``kv_cache_gib`` when set; on a GPU otherwise None (vLLM's ``gpu_memory_utilization``);
        on a CPU :data:`CPU_ROWS` sequences of the engine's whole context (the model's, else
        4096 tokens), at most :data:`CPU_KV_CAP_BYTES`, at least one sequence. The prompts are
        not known when the engine is built, hence the whole context."""
        return vllm_kv_cache_bytes(
            config,
            KVShape.from_config(model_config),
            dtype=dtype,
            on_gpu=on_gpu,
            rows=cls.CPU_ROWS,
            tokens=None,
            context=getattr(model_config, "max_position_embeddings", None) or 4096,
            cap_bytes=cls.CPU_KV_CAP_BYTES,
        )


# ------------------------------------------------------------------------------------------
# registry

BackendFactory = Callable[[BackendOptions], GenerationBackend]
_BACKENDS: Registry[BackendFactory] = Registry("backend")
_BACKENDS.add("hf", HFBackend)
_BACKENDS.add("vllm", VLLMBackend)


def available_backends() -> list[str]:
    """Names of the backends (whether or not their package is installed)."""
    return _BACKENDS.names()


def make_backend(name: str, options: BackendOptions) -> GenerationBackend:
    """Build the backend ``name`` from ``options``; unknown names list the valid ones."""
    return _BACKENDS.get(name)(options)
