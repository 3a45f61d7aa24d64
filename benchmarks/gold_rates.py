"""Self-check of the math verifier on the benchmarks' own gold answers.

For every gold answer of a math benchmark, the completion ``"... so the answer is \\boxed{GOLD}"``
must score 1.0 (GOLD written two ways: the loader's normalised gold and the raw string as the
file stores it), and for integer golds, ``GOLD+1`` and ``GOLD-1`` must score 0.0.

    python benchmarks/gold_rates.py [--data-dir PATH] [--benchmarks math500,aime24,...]

A measurement script (docs/rewards.md quotes its table), not library code; the test suite runs
``measure`` on the real files (tests/rewards/test_rewards_benchmarks.py).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gmts.data.benchmarks import load_benchmark
from gmts.rewards.math_answer import symbolic_match
from gmts.rewards.math_verifier import math_reward

PAPER_MATH = ("math500", "aime24", "amc23", "minerva", "olympiadbench")
_INTEGER = re.compile(r"-?\d+")


@dataclass
class GoldRate:
    """Counts for one benchmark; ``*_failures`` hold the example ids that failed."""

    name: str
    total: int = 0
    normalised_ok: int = 0
    raw_ok: int = 0
    integer_golds: int = 0
    off_by_one_accepted: int = 0
    symbolic_ok: int | None = None  # --math-verify-only: parsed and verified, no string match
    normalised_failures: list[str] = field(default_factory=list)
    raw_failures: list[str] = field(default_factory=list)
    off_by_one_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def normalised_rate(self) -> float:
        return self.normalised_ok / max(self.total, 1)

    @property
    def raw_rate(self) -> float:
        return self.raw_ok / max(self.total, 1)


def _raw_gold(example) -> str:
    raw = example.meta.get("raw_answer", example.answer)
    if isinstance(raw, list):  # OlympiadBench: a list of one string
        raw = ",".join(str(part) for part in raw)
    return str(raw)


def measure(
    name: str,
    *,
    data_dir: str | Path | None = None,
    timeout: float = 5.0,
    math_verify_only: bool = False,
) -> GoldRate:
    """Run the self-check on benchmark ``name`` (see module docstring)."""

    rate = GoldRate(name, symbolic_ok=0 if math_verify_only else None)
    start = time.monotonic()
    for example in load_benchmark(name, data_dir=data_dir):
        rate.total += 1
        gold = example.answer
        if math_verify_only and symbolic_match(_raw_gold(example), gold):
            rate.symbolic_ok += 1
        if math_reward(f"... so the answer is \\boxed{{{gold}}}", gold, timeout=timeout) == 1.0:
            rate.normalised_ok += 1
        else:
            rate.normalised_failures.append(example.id)
        raw = _raw_gold(example)
        if math_reward(f"... so the answer is \\boxed{{{raw}}}", gold, timeout=timeout) == 1.0:
            rate.raw_ok += 1
        else:
            rate.raw_failures.append(example.id)
        if _INTEGER.fullmatch(gold):
            rate.integer_golds += 1
            for neighbour in (int(gold) + 1, int(gold) - 1):
                completion = f"... so the answer is \\boxed{{{neighbour}}}"
                if math_reward(completion, gold, timeout=timeout) != 0.0:
                    rate.off_by_one_accepted += 1
                    rate.off_by_one_failures.append(example.id)
    rate.seconds = time.monotonic() - start
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--benchmarks", default=",".join(PAPER_MATH))
    parser.add_argument(
        "--math-verify-only",
        action="store_true",
        help="also count raw golds that math-verify alone (no string match) accepts",
    )
    args = parser.parse_args(argv)
    print("| benchmark | golds | normalised gold -> 1.0 | raw gold -> 1.0 | integer golds "
          "| gold±1 accepted | math-verify alone | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    worst = 1.0
    for name in args.benchmarks.split(","):
        rate = measure(name, data_dir=args.data_dir, math_verify_only=args.math_verify_only)
        symbolic = "-" if rate.symbolic_ok is None else f"{rate.symbolic_ok}/{rate.total}"
        worst = min(worst, rate.normalised_rate, rate.raw_rate)
        print(
            f"| {name} | {rate.total} | {rate.normalised_ok} ({100 * rate.normalised_rate:.1f}%) "
            f"| {rate.raw_ok} ({100 * rate.raw_rate:.1f}%) | {rate.integer_golds} "
            f"| {rate.off_by_one_accepted} | {symbolic} | {rate.seconds:.0f} |"
        )
        for label, ids in (
            ("normalised failures", rate.normalised_failures),
            ("raw failures", rate.raw_failures),
            ("off-by-one accepted", rate.off_by_one_failures),
        ):
            if ids:
                print(f"  {name} {label}: {', '.join(ids)}", file=sys.stderr)
    return 0 if worst >= 0.995 else 1


if __name__ == "__main__":
    sys.exit(main())
