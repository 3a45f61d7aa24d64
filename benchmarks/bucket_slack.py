"""Forward + backward of SmolLM2-135M-Instruct in the trainer's grouped layout with looser
length buckets than the shipped rule (a bucket's padded area at most 1.1x its real tokens):
fewer, larger model calls against more padding. One rollout of 3 questions x 8 answers
(temperature 0.7, 64 new tokens, ``--seed``), then 1 warm-up + ``--rounds`` interleaved rounds
per slack, 2 threads; prints each slack's calls, positions and median seconds.

    GMTS_CACHE=<cache> HF_HUB_OFFLINE=1 python benchmarks/bucket_slack.py [--seed 0]

The question it answers (docs/results.md section 11b): whether the extra model calls of the
10% rule cost more than the padding a looser rule adds. No record is written.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from typing import Any

import torch

TEMPERATURE = 0.7
"""The sampling temperature of these rollouts and of the update's log-probs (SmolLM2's configs')."""

SLACKS = {"11/10 (shipped)": (11, 10), "13/10": (13, 10), "3/2": (3, 2), "one bucket": (1000, 1)}


def rollout(
    model: Any,
    tokenizer: Any,
    seed: int,
    drop_finished_rows: bool = True,
    max_new_tokens: int = 64,
) -> Any:
    """3 chat-templated 2-digit additions x 8 answers (``drop_finished_rows`` False: the
    sampler's loop before issue 34); ``a+b=`` for a tokenizer without a chat template."""
    from gmts.sampling.rollout import generate_rollouts

    rng = random.Random(0)
    sums = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(3)]
    problems = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        if tokenizer.chat_template
        else f"{a}+{b}="
        for a, b in sums
    ]
    return generate_rollouts(
        model,
        tokenizer,
        problems,
        num_samples=8,
        max_new_tokens=max_new_tokens,
        temperature=TEMPERATURE,
        seed=seed,
        drop_finished_rows=drop_finished_rows,
    )


def forward_backward(model: Any, rows: Any, slack: tuple[int, int]) -> Any:
    """One grouped forward + backward with the bucket rule's slack set to ``slack``; its plan."""
    import gmts.train.forward_plan as plan_module
    from gmts.train.grouped_forward import grouped_statistics

    plan_module._SLACK_NUM, plan_module._SLACK_DEN = slack
    plan = plan_module.plan_forward(rows.prompt_ids, rows.prompt_mask, rows.response_mask)
    stats = grouped_statistics(
        model,
        rows,
        temperature=TEMPERATURE,
        chunk_size=None,
        logit_grad_norm=False,
        autocast=contextlib.nullcontext,
    )
    (stats.logprobs * rows.response_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts.models.named import named_model_folder

    torch.set_num_threads(2)
    path = named_model_folder("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = rollout(model, tokenizer, args.seed)
    print("response lengths", sorted(rows.response_lengths.tolist(), reverse=True))
    model.train()
    times: dict[str, list[float]] = {name: [] for name in SLACKS}
    for round_index in range(args.rounds + 1):
        for name, slack in SLACKS.items():
            start = time.perf_counter()
            plan = forward_backward(model, rows, slack)
            if round_index:
                times[name].append(time.perf_counter() - start)
                print(f"round {round_index}, {name}: {times[name][-1]:.2f} s", flush=True)
            else:
                print(f"{name}: {plan.calls} calls, positions {plan.positions}", flush=True)
    for name, values in times.items():
        print(f"{name}: median {statistics.median(values):.2f} s {[round(v, 2) for v in values]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
