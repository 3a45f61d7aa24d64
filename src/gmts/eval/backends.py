"""``gmts eval``'s samplers: a :class:`gmts.sampling.sampler.Sampler` (``--backend``: any name in
:data:`gmts.sampling.sampler.SAMPLERS`, ``hf`` or ``vllm``) loaded for evaluation.

:func:`make_backend` builds one from :class:`BackendOptions`, with eval's stop rule (the chat
template's end-of-turn token in place of eos: :func:`end_of_turn_id`) and the model's context
(a prompt + budget beyond it is refused before sampling). The harness
(:mod:`gmts.eval.harness`) calls its ``sample`` and groups the completions by prompt
(:func:`group_completions`), so it never asks which sampler it has; tests plug in a fake one.
``temperature == 0`` means greedy decoding.

- ``hf``: Hugging Face ``transformers`` on CPU or GPU, sampling through
  :func:`gmts.sampling.rollout.generate_rollouts`, the same KV-cached sampler training uses.
- ``vllm``: vLLM's offline engine when the package is installed (import guarded), the engine
  wrapper the trainer uses (:mod:`gmts.sampling.vllm_engine`), with the same sampling
  semantics as ``hf`` (on the embedded warm start in float32 the greedy answers of the two are
  identical: tests/vllm/test_vllm_eval.py).

What is loaded depends on the sampler's capability, not on its name: one that holds its own
weights (:class:`gmts.sampling.sampler.HoldsWeights`: vllm) starts from the model folder, which
must hold a whole model (:func:`check_whole_model`), with a KV cache sized by
:func:`eval_kv_cache_bytes`; any other is given the model, loaded by
:mod:`gmts.models.loading`. Also here: :func:`check_benchmarks_fit`, the context guard
``gmts eval`` runs before loading a model.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gmts.models.loading import (
    load_model,
    load_model_config,
    load_tokenizer,
    pick_device,
    resolve_model_path,
    torch_dtype,
)
from gmts.sampling.kv_sizing import KVShape, vllm_kv_cache_bytes
from gmts.sampling.sampler import SAMPLERS, Sampler, SamplerInputs, holds_weights
from gmts.sampling.vllm_engine import VLLMConfig

__all__ = [
    "BackendOptions",
    "available_backends",
    "check_benchmarks_fit",
    "check_whole_model",
    "end_of_turn_id",
    "eval_kv_cache_bytes",
    "group_completions",
    "make_backend",
]

CPU_ROWS = 256
"""A CPU engine's KV cache holds this many sequences of the model's whole context (at most
:data:`CPU_KV_CAP_BYTES`): the prompts are not known when the engine is built."""

CPU_KV_CAP_BYTES = 4 * 2**30
"""The most KV cache a CPU engine is given (vLLM would otherwise reserve
``gpu_memory_utilization`` of the machine's RAM)."""


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
        drop_finished_rows: hf: answers that have stopped leave the batch
            (:data:`gmts.sampling.rollout.DROP_ROWS_AT`); False keeps them until the last stops.
            A sampler with its own engine (vllm) batches its rows itself and refuses False.
        seed: vllm: the engine's seed (every request also carries its own).
        gpu_memory_utilization: vllm: the fraction of GPU memory the engine may take.
        engine_kwargs: vllm: further ``vllm.LLM`` keyword arguments.
    """

    model_path: str | os.PathLike[str]
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int | None = None
    drop_finished_rows: bool = True
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
# the sampler


def available_backends() -> list[str]:
    """The ``--backend`` names: the samplers (whether or not their package is installed)."""
    return SAMPLERS.names()


def make_backend(name: str, options: BackendOptions) -> Sampler:
    """The sampler ``name`` for ``gmts eval``, loaded from ``options`` (see the module
    docstring); what cannot start on this machine is refused before anything loads.

    Keys of ``options.engine_kwargs`` that are :class:`VLLMConfig` fields (e.g.
    ``enforce_eager`` or ``kv_cache_gib``) set those fields; the rest go to ``vllm.LLM``.
    """
    import torch

    sampler_class = SAMPLERS.get(name)  # an unknown name lists the valid ones
    own_weights = holds_weights(name)
    engine = _engine_config(options) if own_weights else None
    on_gpu = torch.cuda.is_available()
    who = f"the {name} backend"
    if own_weights and not options.drop_finished_rows:
        raise ValueError(
            f"{who} batches its rows itself: drop_finished_rows=False (--keep-finished-rows) "
            "is a setting of the hf backend"
        )
    sampler_class.preflight(SamplerInputs(None, vllm=engine, on_gpu=on_gpu), who=who)
    if own_weights:
        check_whole_model(options.model_path, who)
    model_path = resolve_model_path(options.model_path)
    tokenizer = load_tokenizer(model_path, pad_token=False)
    model_config = load_model_config(model_path)
    from gmts.models.context import context_limit

    limit = context_limit(model_config, tokenizer, str(model_path))
    inputs = SamplerInputs(
        tokenizer,
        eos_token_id=end_of_turn_id(tokenizer),
        context=None if limit is None else limit.positions,
        batch_size=options.batch_size,
        drop_finished_rows=options.drop_finished_rows,
    )
    if own_weights:
        kv = eval_kv_cache_bytes(engine, model_config, dtype=options.dtype, on_gpu=on_gpu)
        inputs = dataclasses.replace(
            inputs,
            model_path=model_path,
            vllm=engine,
            dtype=options.dtype,
            seed=options.seed,
            on_gpu=on_gpu,
            kv_cache_bytes=kv,
        )
    else:
        device = pick_device(options.device)
        model = load_model(model_path, dtype=torch_dtype(options.dtype, device), training=False)
        inputs = dataclasses.replace(inputs, model=model.to(device))
    return sampler_class(inputs)


def _engine_config(options: BackendOptions) -> VLLMConfig:
    """The engine settings of ``options``: ``gpu_memory_utilization``, and the
    ``engine_kwargs`` that are :class:`VLLMConfig` fields (the rest stay ``engine_kwargs``)."""
    fields = {f.name for f in dataclasses.fields(VLLMConfig)}
    extra = dict(options.engine_kwargs)
    return VLLMConfig(
        gpu_memory_utilization=options.gpu_memory_utilization,
        **{k: extra.pop(k) for k in list(extra) if k in fields},
        engine_kwargs=extra,
    )


def eval_kv_cache_bytes(
    config: VLLMConfig, model_config: Any, *, dtype: str, on_gpu: bool
) -> int | None:
    """The engine's KV cache (:func:`gmts.sampling.kv_sizing.vllm_kv_cache_bytes`):
    ``kv_cache_gib`` when set; on a GPU otherwise None (vLLM's ``gpu_memory_utilization``); on
    a CPU :data:`CPU_ROWS` sequences of the engine's whole context (the model's, else 4096
    tokens), at most :data:`CPU_KV_CAP_BYTES`, at least one sequence. The prompts are not
    known when the engine is built, hence the whole context."""
    return vllm_kv_cache_bytes(
        config,
        KVShape.from_config(model_config),
        dtype=dtype,
        on_gpu=on_gpu,
        rows=CPU_ROWS,
        tokens=None,
        context=getattr(model_config, "max_position_embeddings", None) or 4096,
        cap_bytes=CPU_KV_CAP_BYTES,
    )


# ------------------------------------------------------------------------------------------
# eval's stop rule, the completions by prompt, the whole-model check


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
