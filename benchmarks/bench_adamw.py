"""One AdamW step over SmolLM2-135M's parameters with each of torch's implementations (the
choices of ``optim.adamw``): torch's CPU default (one tensor at a time), foreach and fused, in
interleaved rounds in one process, and how far their weights drift apart over the rounds.

    python benchmarks/bench_adamw.py                 # SmolLM2-135M's 272 tensors, 2 threads
    python benchmarks/bench_adamw.py --quick         # a tiny llama's shapes (CI)

SmolLM2's shapes come from its config (no weights are read: the values are random, a step's
cost does not depend on them). Every implementation starts from the same weights and receives
the same gradients each round; the record holds every round's seconds, medians, the ratios to
the default per round, and the largest weight difference to the default after all rounds.
Written to ``benchmarks/results/real_model/adamw.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import (  # noqa: E402
    DEFAULT_RESULTS_DIR,
    git_commit,
    machine_description,
    standalone_record,
    summarize_times,
    write_result,
)

IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
"""``optim.adamw``'s explicit choices (torch's keywords: ``gmts.train.run_parts.
adamw_implementation``); ``for-loop`` is torch's default for CPU tensors."""
SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    tie_word_embeddings=True,
)
"""SmolLM2-135M's shapes (its config.json)."""
TINY = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    tie_word_embeddings=True,
)


def parameter_shapes(quick: bool) -> list[torch.Size]:
    """The trainable tensors' shapes of a llama of SmolLM2's (or the tiny) config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**(TINY if quick else SMOLLM2)))
    return [p.shape for p in model.parameters()]


def measure(shapes: list[torch.Size], rounds: int, lr: float = 3e-5) -> dict[str, Any]:
    """Interleaved rounds of one step per implementation; every round's gradients are the same
    for all of them."""
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=generator) * 0.02 for s in shapes]
    params = {name: [torch.nn.Parameter(t.clone()) for t in start] for name in IMPLEMENTATIONS}
    from gmts.train.run_parts import adamw_implementation

    optimizers = {
        name: torch.optim.AdamW(
            params[name], lr=lr, betas=(0.9, 0.99), **adamw_implementation(name, params[name])
        )
        for name in IMPLEMENTATIONS
    }
    times: dict[str, list[float]] = {name: [] for name in IMPLEMENTATIONS}
    for _ in range(rounds + 1):  # the first round warms up, untimed
        grads = [torch.randn(s, generator=generator) * 1e-3 for s in shapes]
        for name, optimizer in optimizers.items():
            for p, g in zip(params[name], grads, strict=True):
                p.grad = g.clone()
            t0 = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - t0)
    times = {name: t[1:] for name, t in times.items()}
    base = times["for-loop"]
    out: dict[str, Any] = {"seconds": {n: summarize_times(t) for n, t in times.items()}}
    out["over_default_per_round"] = {
        name: {
            "median": statistics.median(a / b for a, b in zip(t, base, strict=True)),
            "min": min(a / b for a, b in zip(t, base, strict=True)),
            "max": max(a / b for a, b in zip(t, base, strict=True)),
        }
        for name, t in times.items()
    }
    out["max_weight_difference_to_default"] = {
        name: max(
            (a - b).abs().max().item()
            for a, b in zip(params[name], params["for-loop"], strict=True)
        )
        for name in IMPLEMENTATIONS
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny llama's shapes, seconds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR / "real_model")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1:
        parser.error("--threads and --rounds must be >= 1")
    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    before, commit = machine_description(), git_commit()
    shapes = parameter_shapes(args.quick)
    result = measure(shapes, 2 if args.quick else args.rounds)
    for name, stats in result["seconds"].items():
        ratio = result["over_default_per_round"][name]
        print(
            f"{name:>8}: median {stats['median_s']:.3f} s ({stats['min_s']:.3f}-"
            f"{stats['max_s']:.3f}); / for-loop per round {ratio['median']:.2f} "
            f"({ratio['min']:.2f}-{ratio['max']:.2f}); max |w - w_for-loop| "
            f"{result['max_weight_difference_to_default'][name]:.2g}",
            flush=True,
        )
    record = {
        **standalone_record(
            "adamw",
            quick=args.quick,
            commit=commit,
            machine_before=before,
            load_before=load_before,
            started=started,
            argv=sys.argv if argv is None else ["benchmarks/bench_adamw.py", *argv],
            executable=sys.executable,
        ),
        "model": "a tiny llama's shapes (quick)" if args.quick else "SmolLM2-135M's shapes",
        "tensors": len(shapes),
        "parameters": sum(s.numel() for s in shapes),
        "threads": args.threads,
        "rounds": 2 if args.quick else args.rounds,
        "torch": torch.__version__,
        **result,
    }
    path = write_result(args.out, "adamw", record)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
