"""bf16 compute vs float32 on this machine: the log-prob gap first, then the speed of a forward +
backward (issue 34 item 4; ``model.dtype: auto``, gmts.scale.auto_dtype).

    python benchmarks/bench_bf16.py --threads 2 --rounds 7 \
        --out benchmarks/results/real_model/bf16          # SmolLM2-135M-Instruct
    python benchmarks/bench_bf16.py --quick --out /tmp/bf16  # CI: a random tiny llama, seconds

bf16 here is what ``model.dtype: bfloat16`` runs: float32 weights, the forward under
``torch.autocast(dtype=torch.bfloat16)`` (:meth:`gmts.scale.precision.Precision.autocast`),
log-probs reduced in float32 by the trainer's scorer (:class:`gmts.train.scoring.TokenScorer`).

1. **Agreement.** ``--questions`` x ``--group`` answers (at most ``--answer-tokens`` each) are
   sampled once in float32 at temperature 0.7 from the training prompts of
   configs/smollm2-135m-instruct/base.yaml (2-digit sums, the model's chat template), the rows
   the trainer scores. Their per-token log-probs
   and entropies are computed in float32 and in bf16: max and mean |bf16 - float32| over the
   answer tokens, and the gap of each answer's summed log-prob (what a sequence-level ratio
   sees).
2. **Speed.** One forward + backward of ``-sum(log-probs)`` over ``--rows`` rows of
   ``--prompt-tokens`` + ``--response-tokens`` tokens (24 x (48 + 112) = 160: issue 34's
   shape), float32 and bf16 alternated in one process, ``--rounds`` rounds after one untimed
   pass each. Per round the ratio bf16 / float32 of the two neighbouring passes; the record
   keeps every time, the ratios' median, min and max, and the machine's load before and after.
   On a loaded machine the per-round ratio is what to read, and its spread says how much the
   load moved it.

The record also holds what ``model.dtype=auto`` picks on this machine and what it read.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gmts.sampling.sequences import PromptResponse
from gmts.scale.precision import Precision
from gmts.train.scoring import TokenScorer

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from bench_common import (  # noqa: E402  (the benchmarks folder, put on the path above)
    DEFAULT_RESULTS_DIR,
    git_commit,
    machine_description,
    standalone_record,
    write_result,
)

MODEL = "smollm2-135m-instruct"
CONFIG = BENCH_DIR.parent / "configs" / "smollm2-135m-instruct" / "base.yaml"
"""Where the real prompts come from (its dataset, template and prompt budget)."""
QUICK = {
    "questions": 2,
    "group": 2,
    "answer_tokens": 6,
    "rows": 4,
    "prompt_tokens": 8,
    "response_tokens": 8,
    "rounds": 2,
}
"""``--quick``'s sizes (a random tiny llama: only checks that the script runs)."""


@dataclass
class Rows(PromptResponse):
    """Prompt + response rows (the four tensors the scorer reads)."""

    prompt_ids: torch.Tensor  # (B, P) long
    prompt_mask: torch.Tensor  # (B, P) bool
    response_ids: torch.Tensor  # (B, T) long
    response_mask: torch.Tensor  # (B, T) bool


def scorer(dtype: str, temperature: float = 1.0) -> TokenScorer:
    """The trainer's scorer with ``model.dtype=dtype``'s autocast on the CPU."""
    precision = Precision.from_name(dtype)
    return TokenScorer(
        temperature=temperature, autocast=lambda: precision.autocast(torch.device("cpu"))
    )


def tiny_model() -> tuple[Any, Any]:
    """A random 2-layer llama (width 64) with the embedded one-character tokenizer."""
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = TinyModelConfig(architecture="llama", hidden_size=64, num_heads=2, seed=0)
    return build_tiny_model(tokenizer, config), tokenizer


def real_prompts(tokenizer: Any) -> list[str]:
    """The training prompts of configs/smollm2-135m-instruct/base.yaml (its dataset, template
    and prompt budget), rendered with ``tokenizer``, in the dataset's order."""
    from gmts.train.config import load_config
    from gmts.train.sources import DatasetSource, load_examples, training_split

    cfg = load_config(CONFIG)
    d = cfg.data
    examples = load_examples(
        d.dataset,
        split=training_split(d.dataset, d.split),
        question_field=d.question_field,
        answer_field=d.answer_field,
    )
    source = DatasetSource(
        examples,
        tokenizer=tokenizer,
        template=d.template,
        max_prompt_tokens=cfg.rollout.max_prompt_length,
        shuffle=False,
        seed=0,
    )
    return [p.prompt for p in source.problems]


def load(quick: bool) -> tuple[Any, Any, list[str]]:
    """(float32 model, tokenizer, prompt texts): SmolLM2 with its config's prompts
    (:func:`real_prompts`), or the tiny model with the embedded addition task's prompts."""
    if quick:
        from gmts.embedded.tasks import get_task

        model, tokenizer = tiny_model()
        problems = get_task("addition").sample(16, random.Random(0))
        return model, tokenizer, [p.prompt for p in problems]
    from gmts.models.loading import load_model, load_tokenizer, resolve_model_path

    path = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(path)
    return load_model(path, training=True), tokenizer, real_prompts(tokenizer)


def sample_rows(model: Any, tokenizer: Any, prompts: list[str], args: argparse.Namespace) -> Any:
    """``questions`` x ``group`` answers sampled in float32 (the rows both dtypes score)."""
    from gmts.sampling.rollout import generate_rollouts

    return generate_rollouts(
        model,
        tokenizer,
        prompts[: args.questions],
        num_samples=args.group,
        max_new_tokens=args.answer_tokens,
        temperature=0.7,
        seed=0,
    )


def agreement(model: Any, rows: Any) -> dict[str, Any]:
    """|bf16 - float32| of the per-token log-probs and entropies of ``rows`` (answer tokens
    only) and of each answer's summed log-prob; the trainer's scorer in both dtypes."""
    with torch.no_grad():
        stats = {name: scorer(name, 0.7)(model, rows) for name in ("float32", "bfloat16")}
    mask = rows.response_mask  # (B, T)
    lp32, lp16 = stats["float32"].logprobs.double(), stats["bfloat16"].logprobs.double()
    gap = (lp16 - lp32).abs()[mask]  # (N,) answer tokens
    entropy_gap = (stats["bfloat16"].entropy.double() - stats["float32"].entropy.double()).abs()[
        mask
    ]
    seq_gap = ((lp16 - lp32) * mask).sum(dim=1).abs()  # (B,)
    return {
        "answers": int(mask.shape[0]),
        "answer_tokens": int(mask.sum()),
        "logprob_gap_max": gap.max().item(),
        "logprob_gap_mean": gap.mean().item(),
        "logprob_gap_median": gap.median().item(),
        "entropy_gap_max": entropy_gap.max().item(),
        "entropy_gap_mean": entropy_gap.mean().item(),
        "answer_logprob_gap_max": seq_gap.max().item(),
        "answer_logprob_gap_mean": seq_gap.mean().item(),
        "float32_logprob_mean": lp32[mask].mean().item(),
    }


class TimedRows:
    """``rows`` x (``prompt`` + ``response``) random tokens and the forward + backward both
    dtypes run on them (the trainer's scorer, loss ``-sum(log-probs)``)."""

    def __init__(self, model: Any, vocab: int, rows: int, prompt: int, response: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.model = model
        self.batch = Rows(
            prompt_ids=torch.randint(vocab, (rows, prompt), generator=generator),
            prompt_mask=torch.ones(rows, prompt, dtype=torch.bool),
            response_ids=torch.randint(vocab, (rows, response), generator=generator),
            response_mask=torch.ones(rows, response, dtype=torch.bool),
        )

    def step(self, dtype: str) -> float:
        """Seconds of one forward + backward in ``dtype`` (gradients cleared after)."""
        start = time.perf_counter()
        loss = -scorer(dtype)(self.model, self.batch).logprobs.sum()
        loss.backward()
        elapsed = time.perf_counter() - start
        self.model.zero_grad(set_to_none=True)
        return elapsed


def speed(timed: TimedRows, rounds: int) -> dict[str, Any]:
    """float32 and bf16 alternated (the order flips every round), one untimed pass each
    first; the per-round ratio bf16 / float32."""
    timed.step("float32"), timed.step("bfloat16")
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for r in range(rounds):
        order = ("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32")
        for name in order:
            times[name].append(timed.step(name))
    ratios = [b / f for b, f in zip(times["bfloat16"], times["float32"])]
    return {
        "times_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "ratio_per_round": [round(x, 4) for x in ratios],
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a random tiny llama, seconds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--response-tokens", type=int, default=112)
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--skip-speed", action="store_true", help="the agreement only")
    parser.add_argument("--skip-agreement", action="store_true", help="the speed only")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR / "real_model" / "bf16")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for key in ("threads", "rounds", "rows", "prompt_tokens", "response_tokens", "questions"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1")
    from gmts.scale.auto_dtype import choose_dtype

    torch.set_num_threads(args.threads)
    started, load_before = time.perf_counter(), os.getloadavg()
    before, commit = machine_description(), git_commit()
    choice = choose_dtype("auto", torch.device("cpu"))
    print(choice.line(), flush=True)
    model, tokenizer, prompts = load(args.quick)
    agree = None
    if not args.skip_agreement:
        agree = agreement(model, sample_rows(model, tokenizer, prompts, args))
        print(
            f"log-prob |bf16 - float32| over {agree['answer_tokens']} answer tokens: max "
            f"{agree['logprob_gap_max']:.3g}, mean {agree['logprob_gap_mean']:.3g}; per answer "
            f"(summed) max {agree['answer_logprob_gap_max']:.3g}",
            flush=True,
        )
    timing = None
    if not args.skip_speed:
        vocab = model.get_output_embeddings().weight.shape[0]
        timed = TimedRows(model, vocab, args.rows, args.prompt_tokens, args.response_tokens)
        timing = speed(timed, args.rounds)
        print(
            f"forward + backward, {args.rows} x {args.prompt_tokens + args.response_tokens} "
            f"tokens: float32 {timing['median_s']['float32']:.2f} s, bf16 "
            f"{timing['median_s']['bfloat16']:.2f} s (medians); bf16 / float32 per round "
            f"{timing['ratio_median']:.2f} ({timing['ratio_min']:.2f}-{timing['ratio_max']:.2f})",
            flush=True,
        )
    record = {
        **standalone_record(
            "bf16",
            quick=args.quick,
            commit=commit,
            machine_before=before,
            load_before=load_before,
            started=started,
            argv=sys.argv if argv is None else ["benchmarks/bench_bf16.py", *argv],
            executable=sys.executable,
        ),
        "model": "random tiny llama (quick)" if args.quick else MODEL,
        "threads": args.threads,
        "settings": {
            k: getattr(args, k)
            for k in (
                "rounds",
                "rows",
                "prompt_tokens",
                "response_tokens",
                "questions",
                "group",
                "answer_tokens",
            )
        },
        "auto": choice.record(),
        "agreement": agree,
        "speed": timing,
    }
    # a speed-only run must not replace the record that holds the agreement
    threads = "1thread" if args.threads == 1 else f"{args.threads}threads"
    name = f"speed_{threads}" if args.skip_agreement else "bf16"
    path = write_result(args.out, name, record)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
