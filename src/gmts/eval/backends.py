"""Text-generation backends for the evaluation harness, by name: ``hf`` and ``vllm``.

A backend turns prompt strings into ``n`` completion strings each. All backends share one
signature (:class:`GenerationBackend`), so the harness never special-cases one; tests plug in a
fake. ``temperature == 0`` means greedy decoding.

- ``hf``: Hugging Face ``transformers`` on CPU or GPU, sampling through
  :func:`gmts.sampling.rollout.generate_rollouts`, the same KV-cached sampler training uses.
- ``vllm``: vLLM's offline ``LLM.generate`` when the package is installed (import guarded).

Also here: :func:`resolve_model_path`, the model-directory layouts ``gmts eval`` accepts, and
:func:`check_benchmarks_fit`, the context guard ``gmts eval`` runs before loading a model.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gmts._registry import Registry


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
# model directories


class ModelPathError(ValueError):
    """``--model`` does not name a usable model directory (message fits on one line)."""


_STEP_DIR = re.compile(r"^step_(\d+)$")


def resolve_model_path(path: str | os.PathLike[str]) -> Path:
    """The Hugging Face model folder that ``path`` designates.

    Accepted layouts, tried in this order:

    1. ``path/config.json``: a Hugging Face model folder (``save_pretrained``), e.g. the
       folder returned by ``gmts.embedded.warmstart.warm_start``.
    2. ``path/model/config.json``: a gmts checkpoint (``<run>/checkpoints/step_000100``) or
       any folder holding the model in ``model/``.
    3. ``path/checkpoints/step_*/model/config.json``: a gmts training run; the checkpoint with
       the highest step is used.

    Raises:
        ModelPathError: the path does not exist or matches none of the layouts.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise ModelPathError(f"model path does not exist: {root}")
    if (root / "config.json").is_file():
        return root
    if (root / "model" / "config.json").is_file():
        return root / "model"
    steps = []
    ckpt_root = root / "checkpoints"
    if ckpt_root.is_dir():
        for child in ckpt_root.iterdir():
            match = _STEP_DIR.match(child.name)
            if match and (child / "model" / "config.json").is_file():
                steps.append((int(match.group(1)), child / "model"))
    if steps:
        return max(steps)[1]
    raise ModelPathError(
        f"no model found at {root}: expected config.json there, in model/, or in "
        "checkpoints/step_*/model/"
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
    from transformers import AutoTokenizer

    from gmts.eval.benchmarks import get_spec, load_eval_benchmark
    from gmts.models.context import check_fits, longest_prompt, read_limit

    path = resolve_model_path(model_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    context = read_limit(str(path), tokenizer)
    if context is None:
        return
    for name in benchmarks:
        bench = load_eval_benchmark(name, tokenizer=tokenizer, data_dir=data_dir, limit=limit)
        budget = max_new_tokens or get_spec(name).max_new_tokens
        default = "" if max_new_tokens else f" (default: the benchmark's {budget})"
        check_fits(
            prompt_tokens=longest_prompt(tokenizer, [item.prompt for item in bench.items]),
            new_tokens=budget,
            limit=context,
            what=f"benchmark {name}",
            settings=f"--max-new-tokens{default} or --benchmarks",
        )


# ------------------------------------------------------------------------------------------
# Hugging Face backend


def _pick_device(device: str | None) -> str:
    import torch

    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


class HFBackend:
    """Generation with a ``transformers`` causal LM and :func:`generate_rollouts`.

    Args:
        model_path: a folder accepted by :func:`resolve_model_path`.
        device: "cpu", "cuda", "cuda:1", or "auto"/None (GPU when available).
        dtype: "auto" (bfloat16 on GPU, float32 on CPU), "float32", "bfloat16" or "float16".
        batch_size: at most this many sequences per forward pass (None: all at once).
    """

    name = "hf"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        device: str | None = "auto",
        dtype: str = "auto",
        batch_size: int | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_path = resolve_model_path(model_path)
        self.device = _pick_device(device)
        dtypes = {
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
        }
        if dtype == "auto":
            torch_dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        elif dtype in dtypes:
            torch_dtype = dtypes[dtype]
        else:
            raise ValueError(f"dtype must be one of auto, {', '.join(dtypes)}; got {dtype!r}")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype)
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        self._sampling_tokenizer = _with_end_of_turn_stop(self.tokenizer)
        from gmts.models.context import context_limit

        self.context = context_limit(self.model.config, self.tokenizer, str(self.model_path))

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
        from gmts.sampling.rollout import generate_rollouts

        check_fits(  # a clear error instead of an IndexError deep in the position embedding
            prompt_tokens=longest_prompt(self.tokenizer, prompts),
            new_tokens=max_new_tokens,
            limit=self.context,
            what="hf backend",
            settings="max_new_tokens (gmts eval --max-new-tokens)",
        )
        problems = [Problem(prompt=p, answer="") for p in prompts]
        rollout = generate_rollouts(
            self.model,
            self._sampling_tokenizer,
            problems,
            num_samples=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            batch_size=self.batch_size,
            seed=seed,
        )
        return group_completions(rollout.completions, rollout.group_ids, len(prompts), n)


_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")


class _StopAtToken:
    """The tokenizer seen through a different ``eos_token_id`` (everything else delegated)."""

    def __init__(self, tokenizer: Any, eos_token_id: int) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = eos_token_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)


def _with_end_of_turn_stop(tokenizer: Any) -> Any:
    """Stop sampling at the chat template's end-of-turn token when it is not the eos token.

    Base models used with a chat template (Qwen2.5-Math: eos ``<|endoftext|>``, turns end with
    ``<|im_end|>``) would otherwise run on past the answer into a new turn until the budget.
    The sampler takes one stop id, so the end-of-turn token replaces eos for sampling.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return tokenizer
    for token in _END_OF_TURN_TOKENS:
        if token in template and token != tokenizer.eos_token:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                return _StopAtToken(tokenizer, token_id)
    return tokenizer


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


class VLLMBackend:
    """Generation with vLLM's offline engine (``pip install vllm``; GPU).

    Each request carries its own seed, so results do not depend on which other prompts share
    the engine's batch.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        seed: int = 0,
        **engine_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as err:
            raise ImportError(
                "the vllm backend needs the vllm package (pip install vllm); "
                "use --backend hf to evaluate with transformers instead"
            ) from err
        self._vllm = vllm
        self.model_path = resolve_model_path(model_path)
        self.llm = vllm.LLM(
            model=str(self.model_path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def generate(
        self,
        prompts: list[str],
        *,
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[str]]:
        params = [
            self._vllm.SamplingParams(
                n=n,
                temperature=temperature,
                max_tokens=max_new_tokens,
                seed=seed + i,
                skip_special_tokens=True,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[o.text for o in out.outputs] for out in outputs]


# ------------------------------------------------------------------------------------------
# registry

BackendFactory = Callable[..., GenerationBackend]
_BACKENDS: Registry[BackendFactory] = Registry("backend")
_BACKENDS.add("hf", HFBackend)
_BACKENDS.add("vllm", VLLMBackend)


def available_backends() -> list[str]:
    """Names of the backends (whether or not their package is installed)."""
    return _BACKENDS.names()


def vllm_available() -> bool:
    """Whether the vllm package can be imported."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_backend(name: str, model_path: str | os.PathLike[str], **kwargs: Any) -> GenerationBackend:
    """Build the backend ``name`` for ``model_path``; unknown names list the valid ones."""
    return _BACKENDS.get(name)(model_path, **kwargs)
