"""How far a training step of SmolLM2-135M-Instruct can still shrink in float32 on this CPU:
today's rollout and update, the path before issue 34 (every row decoded until the last stops;
every row's prompt and response padded), and the time of the matrix products alone that
today's path cannot do without, side by side in one process, interleaved rounds.

    GMTS_CACHE=<cache> HF_HUB_OFFLINE=1 python benchmarks/step_floor.py [--rounds 3] [--out F]

One rollout shape as the real-model configs train on (3 chat-templated 2-digit sums x 8
answers, temperature 0.7, up to 64 new tokens, the sampling seed of each round fixed), 2
threads. Per round it times:

- ``rollout``: ``generate_rollouts`` as shipped (each prompt prefilled once, stopped rows leave
  the batch) and with ``drop_finished_rows=False`` (the loop before issue 34);
- ``update``: one forward with gradients and its backward over the rollout's rows (the sum of
  the response log-probs, the objective's shape without its arithmetic) in the ``grouped`` and
  the ``padded`` layouts;
- ``floor``: the matrix products of today's path alone, on the model's own weights: per
  decoding step one product per linear layer (the 210 of the decoder layers and the output
  head) at the number of rows still generating at that step (a row leaves as soon as it stops:
  a lower bound of the sampler's rule), the prefill's products at each distinct prompt's
  tokens, and the update's three products per linear layer (forward, input gradient, weight
  gradient) at the positions the grouped layout computes (the head at the response positions
  only).

The floor leaves out attention, norms, activations, the softmax and the draw, the optimizer
step and Python: a lower bound of any float32 path that computes these products with torch's
kernels on this machine. ``floor / old`` is then the smallest step ratio that removing every
other cost could reach. Prints a table; ``--out`` writes the record (JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import git_commit, machine_description, median_time, utc_now  # noqa: E402
from bucket_slack import TEMPERATURE  # noqa: E402
from bucket_slack import rollout as sample  # noqa: E402  (3 x 8 sums, the shared shape)


def _linears(model: Any) -> list[torch.Tensor]:
    """The weights ``(out, in)`` of every ``nn.Linear`` of the decoder layers, then the head."""
    layers = [m.weight for m in model.model.modules() if isinstance(m, torch.nn.Linear)]
    return [*layers, model.get_output_embeddings().weight]


@torch.no_grad()
def _products(weights: list[torch.Tensor], rows: int, head_rows: int, backward: bool) -> None:
    """Every weight's forward product at ``rows`` positions (the head at ``head_rows``), and
    with ``backward`` the input-gradient and weight-gradient products too."""
    for i, w in enumerate(weights):
        n = head_rows if i == len(weights) - 1 else rows
        if n == 0:
            continue
        x = torch.ones(n, w.shape[1])  # (n, in)
        y = torch.nn.functional.linear(x, w)  # (n, out)
        if backward:
            torch.mm(y, w)  # (n, in): the input's gradient
            torch.mm(y.t(), x)  # (out, in): the weight's gradient


def decode_batches(lengths: list[int]) -> Counter[int]:
    """``{rows: decoding steps}`` of a rollout whose rows answer ``lengths`` tokens (the stop
    token included) when a row leaves the batch as soon as it stops: the prefill gives token 0,
    decoding step t (1..longest-1) feeds token t-1 of the rows that have not stopped, those
    longer than t."""
    longest = max(lengths, default=0)
    return Counter(sum(1 for n in lengths if n > t) for t in range(1, longest))


def floors(model: Any, rows: Any, reps: int) -> dict[str, float]:
    """The seconds of the products alone: decoding (rows still generating per step), the
    prefill (distinct prompts), the grouped update."""
    from gmts.train.forward_plan import plan_forward

    weights = _linears(model)
    lengths = rows.response_lengths.tolist()
    batches = decode_batches(lengths)
    decode = sum(
        count * median_time(lambda a=a: _products(weights, a, a, False), reps, 0)["median_s"]
        for a, count in batches.items()
        if a
    )
    plan = plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
    prompt_tokens = sum(plan.prompt_lengths)
    prefill = median_time(
        lambda: _products(weights, prompt_tokens, len(plan.prompt_lengths), False), reps, 0
    )["median_s"]
    # the response calls feed each row's tokens but its last; the head predicts every token
    fed, response_tokens = sum(plan.fed_lengths), sum(lengths)
    update = median_time(
        lambda: _products(weights, prompt_tokens + fed, response_tokens, True), reps, 0
    )["median_s"]
    return {"rollout": decode + prefill, "decode": decode, "prefill": prefill, "update": update}


def update_time(model: Any, rows: Any, layout: str) -> float:
    from gmts.train.scoring import TokenScorer

    scorer = TokenScorer(temperature=TEMPERATURE, autocast=contextlib.nullcontext, layout=layout)
    start = time.perf_counter()
    stats = scorer(model, rows)
    (stats.logprobs * rows.response_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def profile_update(model: Any, rows: Any, top: int) -> None:
    """torch's profiler over one grouped update: the ``top`` operators by their own time."""
    from torch.profiler import ProfilerActivity, profile

    model.train()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update_time(model, rows, "grouped")
    model.eval()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def _took(times: dict[str, float], name: str, seconds: float) -> None:
    """Record one part's seconds and show it at once (a round of SmolLM2 takes ~40 s)."""
    times[name] = seconds
    print(f" {name} {seconds:.2f} s,", end="", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="repeats of each floor's products")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="a random tiny llama, 4 new tokens (CI: no figure)"
    )
    parser.add_argument(
        "--profile", type=int, default=0, help="print the top N operators of today's update"
    )
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts.models.named import named_model_folder

    torch.set_num_threads(2)
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            from bench_rollout_real import save_quick_model

            path = save_quick_model(Path(tmp) / "model")
        else:
            path = named_model_folder("smollm2-135m-instruct")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    new_tokens = 4 if args.quick else 64
    names = ("rollout", "update", "step")
    seen: dict[str, list[float]] = {f"{p} {n}": [] for p in ("new", "old", "floor") for n in names}
    tokens = []
    for r in range(args.rounds + 1):  # round 0 warms up
        t = {}
        print(f"round {r}{' (warm-up)' if r == 0 else ''}:", end="", flush=True)
        for drop in (True, False):
            start = time.perf_counter()
            rows = sample(model, tokenizer, r, drop, new_tokens)
            _took(t, "new rollout" if drop else "old rollout", time.perf_counter() - start)
        model.train()
        _took(t, "new update", update_time(model, rows, "grouped"))
        _took(t, "old update", update_time(model, rows, "padded"))
        model.eval()
        f = floors(model, rows, args.reps)
        _took(t, "floor rollout", f["rollout"])
        _took(t, "floor update", f["update"])
        for p in ("new", "old", "floor"):
            t[f"{p} step"] = t[f"{p} rollout"] + t[f"{p} update"]
        if r:
            for k, v in t.items():
                seen[k].append(v)
            tokens.append(int(rows.response_lengths.sum()))
        print(f" step new {t['new step']:.2f} s, old {t['old step']:.2f} s", flush=True)
    if args.profile:
        profile_update(model, rows, args.profile)
    med = {k: statistics.median(v) for k, v in seen.items()}
    print(f"\nmedians over {args.rounds} rounds (s); response tokens {tokens}")
    print("| part | old | new | floor | new / old | floor / old | floor / new |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        o, w, f = med[f"old {n}"], med[f"new {n}"], med[f"floor {n}"]
        print(f"| {n} | {o:.2f} | {w:.2f} | {f:.2f} | {w / o:.2f}x | {f / o:.2f}x | {f / w:.2f}x |")
    if args.out:
        record = {
            "command": " ".join(["python", "benchmarks/step_floor.py", *(argv or sys.argv[1:])]),
            "commit": git_commit(),
            "date": utc_now(),
            "machine": {
                **machine_description(),
                "threads": torch.get_num_threads(),
                "load_before": load_before,
                "load_after": list(os.getloadavg()),
            },
            "quick": args.quick,
            "response_tokens": tokens,
            "rounds": seen,
            "medians": med,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
