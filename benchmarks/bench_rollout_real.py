"""Rollout tokens/s on a real model (issue 27, items 1 and 2): four generators side by side.

- ``ours``: :func:`gmts.sampling.rollout.generate_rollouts` (the trainer's ``hf`` engine);
- ``ours_inverse_cdf``: the same with ``draw="inverse_cdf"`` (``rollout.draw``: one random
  number per row instead of one per vocabulary entry, :mod:`gmts.sampling.draws`);
- ``ours_fast``: ``draw="inverse_cdf"`` and ``prepack=True`` (``rollout.prepack_weights``:
  oneDNN-prepacked linear weights while sampling, :mod:`gmts.sampling.packed_linear`);
- ``generate``: transformers' ``model.generate`` (what TRL samples with), plain softmax;
- ``vllm_plain``: ``LLM.generate`` with one plain request per row (no seed, no log-probs);
- ``vllm_engine``: :meth:`gmts.sampling.vllm_engine.VLLMEngine.sample` as the trainer calls it
  (per-row seeds, the sampled tokens' log-probs, no detokenisation) on the same ``LLM``, so the
  ratio ``vllm_engine / vllm_plain`` isolates what the engine asks of vLLM.

Every dtype runs in its own child process (one vLLM engine per process); in it the contenders
take turns (ours, generate, vllm_plain, vllm_engine, ours, ...) so that load changes on a shared
machine hit them alike, and ratios are taken per round (side by side) before the median. Every
row samples up to ``--new-tokens`` tokens at temperature 1 and stops only at the vocabulary's
last id (so rows run to the budget); tokens/s = tokens generated / wall time of the call.
The JSON record holds the machine, the load (``uptime``) before and after, the command and the
commit. vLLM contenders are skipped (and the skip recorded) where vllm is not installed.

    .venv-vllm/bin/python benchmarks/bench_rollout_real.py --model PATH   # <= 10 min
    python benchmarks/bench_rollout_real.py --quick   # a random tiny llama, a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench_common import (
    DEFAULT_RESULTS_DIR,
    child_env,
    git_commit,
    machine_description,
    standalone_record,
    summarize_times,
    write_result,
)

CONTENDERS = ("ours", "ours_inverse_cdf", "ours_fast", "generate", "vllm_plain", "vllm_engine")
RATIOS = {
    "ours_vs_generate": ("ours", "generate"),
    "fast_vs_generate": ("ours_fast", "generate"),
    "inverse_cdf_vs_ours": ("ours_inverse_cdf", "ours"),
    "prepack_effect": ("ours_fast", "ours_inverse_cdf"),
    "engine_vs_plain": ("vllm_engine", "vllm_plain"),
}
QUESTIONS = [(12, 35), (47, 58), (23, 91), (64, 17), (88, 29), (31, 76), (55, 44), (19, 83)]


def save_quick_model(path: Path) -> Path:
    """A random 2-layer llama (width 64, 2 heads of 32: vLLM's CPU attention needs head size
    >= 32) with the embedded one-character tokenizer, as a Hugging Face folder."""
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = TinyModelConfig(architecture="llama", hidden_size=64, num_heads=2, seed=0)
    build_tiny_model(tokenizer, config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def plain_vllm_tokens(
    llm: Any,
    rows: list[list[int]],
    *,
    max_tokens: int,
    temperature: float,
    stop_ids: list[int],
) -> int:
    """Plain vLLM: ``llm.generate`` (a ``vllm.LLM``) with one request per row of prompt token
    ids (no seed, no log-probs, vLLM's own detokenisation), stopping at exactly ``stop_ids``;
    returns the tokens generated."""
    import vllm

    params = vllm.SamplingParams(
        n=1,
        temperature=temperature,
        max_tokens=max_tokens,
        stop_token_ids=list(stop_ids),
        ignore_eos=True,
    )
    outs = llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs)


def _prompts(tokenizer: Any) -> list[str]:
    texts = [f"What is {a} + {b}?" for a, b in QUESTIONS]
    if getattr(tokenizer, "chat_template", None):
        return [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
            )
            for t in texts
        ]
    return [f"{a}+{b}=" for a, b in QUESTIONS]


class PromptBatch(NamedTuple):
    """The prompts every contender samples from: as text (ours), as ``rows`` of token ids
    (each prompt ``group`` times: vLLM) and as left-padded ``input_ids``/``attention`` of
    shape (rows, width) (``generate``); ``stop``: the one stop id, ``pad`` the padding id."""

    prompts: list[str]
    group: int
    rows: list[list[int]]
    input_ids: Any
    attention: Any
    stop: int
    pad: int

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]


def prompt_batch(model: Any, tokenizer: Any, rows_wanted: int) -> PromptBatch:
    """:data:`QUESTIONS` as prompts, each repeated to about ``rows_wanted`` rows in all."""
    import torch

    stop = model.config.vocab_size - 1  # never the eos: rows run to the budget
    prompts = _prompts(tokenizer)
    group = max(1, rows_wanted // len(prompts))
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    rows = [ids for ids in encoded for _ in range(group)]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention[i, width - len(ids) :] = 1
    return PromptBatch(prompts, group, rows, input_ids, attention, stop, pad)


def generate_tokens(model: Any, batch: PromptBatch, new_tokens: int, seed: int) -> int:
    """transformers' ``model.generate`` on ``batch``; returns the tokens generated (a row's:
    up to and including its first stop id, else all of them)."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=batch.input_ids,
            attention_mask=batch.attention,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            eos_token_id=batch.stop,
            pad_token_id=batch.pad,
        )
    new = out[:, batch.width :]
    ended = (new == batch.stop).int()
    # a row's tokens: up to and including its first stop id, else all of them
    first = torch.where(
        ended.any(1), ended.argmax(1) + 1, torch.full_like(ended[:, 0], new.shape[1])
    )
    return int(first.sum())


def hf_contenders(
    model: Any, tokenizer: Any, batch: PromptBatch, args: argparse.Namespace
) -> dict[str, Callable[[int], int]]:
    """Contender name -> a call ``seed -> tokens generated`` for ours (three draws/prepack
    settings) and ``generate`` (each reads ``args.new_tokens`` when it runs)."""
    from gmts.sampling.rollout import generate_rollouts

    def ours(seed: int, prepack: bool = False, draw: str = "multinomial") -> int:
        roll = generate_rollouts(
            model,
            tokenizer,
            batch.prompts,
            num_samples=batch.group,
            max_new_tokens=args.new_tokens,
            temperature=1.0,
            seed=seed,
            stop_token_ids=[batch.stop],
            prepack=prepack,
            draw=draw,
        )
        return int(roll.response_lengths.sum())

    def ours_inverse_cdf(seed: int) -> int:
        return ours(seed, draw="inverse_cdf")

    def ours_fast(seed: int) -> int:
        return ours(seed, prepack=True, draw="inverse_cdf")

    def generate(seed: int) -> int:
        return generate_tokens(model, batch, args.new_tokens, seed)

    return {
        "ours": ours,
        "ours_inverse_cdf": ours_inverse_cdf,
        "ours_fast": ours_fast,
        "generate": generate,
    }


def vllm_contenders(
    model_path: str, dtype: str, batch: PromptBatch, args: argparse.Namespace
) -> tuple[dict[str, Callable[[int], int]], Any, float]:
    """(``vllm_plain`` and ``vllm_engine`` as :func:`hf_contenders` gives its calls, the
    :class:`~gmts.sampling.vllm_engine.VLLMEngine` they share, the seconds it took to start)."""
    from gmts.sampling.vllm_engine import VLLMConfig, VLLMEngine, request_seeds

    t = time.perf_counter()
    engine = VLLMEngine(
        model_path,
        VLLMConfig(),
        dtype=dtype,
        seed=0,
        on_gpu=False,
        kv_cache_bytes=int(args.kv_cache_gib * 2**30),
    )
    start_s = time.perf_counter() - t

    def vllm_plain(seed: int) -> int:
        return plain_vllm_tokens(
            engine.llm,
            batch.rows,
            max_tokens=args.new_tokens,
            temperature=1.0,
            stop_ids=[batch.stop],
        )

    def vllm_engine(seed: int) -> int:
        samples = engine.sample(
            batch.rows,
            seeds=request_seeds(seed, len(batch.rows)),
            max_new_tokens=args.new_tokens,
            temperature=1.0,
            stop_ids=[batch.stop],
        )
        return sum(len(ids) for ids, _ in samples)

    return {"vllm_plain": vllm_plain, "vllm_engine": vllm_engine}, engine, start_s


def take_turns(
    fns: dict[str, Callable[[int], int]], args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """(seconds, tokens) per contender per round: a short warm-up call each, then
    ``args.repeats`` rounds in which the contenders take turns."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    tokens: dict[str, list[int]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up: a short call each
        saved, args.new_tokens = args.new_tokens, 2
        fn(0)
        args.new_tokens = saved
    for repeat in range(args.repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            tokens[name].append(fn(repeat))
            times[name].append(time.perf_counter() - t)
    return times, tokens


def measure(model_path: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """The child: every contender ``args.repeats`` times in turns, in this process."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    batch = prompt_batch(model, tokenizer, args.rows)
    fns = hf_contenders(model, tokenizer, batch, args)
    skipped: dict[str, str] = {}
    engine = None
    start_s = None
    try:
        import vllm  # noqa: F401
    except ImportError:
        for name in ("vllm_plain", "vllm_engine"):
            skipped[name] = "vllm is not installed in this interpreter"
    else:
        vllm_fns, engine, start_s = vllm_contenders(model_path, dtype, batch, args)
        fns.update(vllm_fns)
    try:
        times, tokens = take_turns(fns, args)
    finally:
        if engine is not None:
            engine.close()
    return {
        "dtype": dtype,
        "rows": len(batch.rows),
        "times": times,
        "tokens": tokens,
        "skipped": skipped,
        "vllm_start_s": start_s,
        "threads": args.threads,
    }


def summarize(child: dict[str, Any]) -> dict[str, Any]:
    """Per contender: tokens/s median, min, max; per ratio: the median and range of the
    per-round ratios."""
    rates = {
        name: [k / t for k, t in zip(child["tokens"][name], child["times"][name])]
        for name in child["times"]
    }
    out: dict[str, Any] = {"contenders": {}, "ratios": {}}
    for name, values in rates.items():
        out["contenders"][name] = {
            "tokens_per_s_median": statistics.median(values),
            "tokens_per_s_min": min(values),
            "tokens_per_s_max": max(values),
            "tokens_per_call": child["tokens"][name],
            "call": summarize_times(child["times"][name]),
        }
    for label, (num, den) in RATIOS.items():
        if num in rates and den in rates:
            per_round = [a / b for a, b in zip(rates[num], rates[den])]
            out["ratios"][label] = {
                "median": statistics.median(per_round),
                "min": min(per_round),
                "max": max(per_round),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a Hugging Face model folder (not with --quick)")
    parser.add_argument("--quick", action="store_true", help="a random tiny llama, seconds")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # dtype:json-path (internal)
    args = parser.parse_args(argv)
    if args.child:
        dtype, path = args.child.split(":", 1)
        Path(path).write_text(json.dumps(measure(args.model, dtype, args)))
        return 0
    if args.quick == bool(args.model):
        parser.error("give exactly one of --model PATH and --quick")
    if args.quick:
        args.dtypes, args.rows, args.new_tokens, args.repeats = "float32", 8, 4, 1
        args.threads, args.kv_cache_gib = 1, 0.0625
    dtypes = args.dtypes.split(",")
    for d in dtypes:
        if d not in ("float32", "bfloat16"):
            parser.error(f"--dtypes: float32 or bfloat16, got {d!r}")
    commit = git_commit()
    before = machine_description()
    load_before = os.getloadavg()
    started = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:  # a folder, or a name such as smollm2-135m-instruct (converted once)
            from gmts.models.loading import resolve_model_path

            model = resolve_model_path(args.model)
        else:
            model = str(save_quick_model(Path(tmp) / "model"))
        for dtype in dtypes:
            path = Path(tmp) / f"{dtype}.json"
            command = [sys.executable, __file__, "--model", model, "--child", f"{dtype}:{path}"]
            for name in ("rows", "new_tokens", "repeats", "threads", "kv_cache_gib"):
                command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
            subprocess.run(command, check=True, env=child_env(args.threads))
            child = json.loads(path.read_text())
            results[dtype] = {**summarize(child), "raw": child}
    record = {
        **standalone_record(
            "rollout_real",
            quick=args.quick,
            commit=commit,
            machine_before=before,
            load_before=load_before,
            started=started,
            argv=sys.argv,
            executable=sys.executable,
        ),
        "model": "random tiny llama (quick)" if args.quick else args.model,
        "settings": {
            k: getattr(args, k)
            for k in ("rows", "new_tokens", "repeats", "threads", "kv_cache_gib")
        },
        "results": results,
    }
    path = write_result(args.out, "rollout_real", record)
    for dtype, res in results.items():
        line = ", ".join(
            f"{n} {c['tokens_per_s_median']:.1f}" for n, c in res["contenders"].items()
        )
        ratios = ", ".join(f"{k} {v['median']:.2f}" for k, v in res["ratios"].items())
        print(f"{dtype}: tokens/s {line}; {ratios}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
