"""The demo's methods compared seed by seed: each pair's paired differences of held-out
average@k (statistics in :mod:`gmts.demo.stats`)."""

from __future__ import annotations

from dataclasses import dataclass

from gmts.demo.records import DemoResult
from gmts.demo.stats import PairedDifference, paired_difference


@dataclass(frozen=True)
class Comparison:
    """Method ``a`` minus method ``b``, seed by seed, in points of held-out average@k: the
    ``mean`` over training (learning speed) and the ``final`` evaluation."""

    a: str
    b: str
    mean: PairedDifference
    final: PairedDifference


def compare(result: DemoResult) -> list[Comparison]:
    """Every pair of methods, a later one in table order minus an earlier one (the last method
    first: GMTS - ETS, GMTS - all tokens, ETS - all tokens), paired by seed; a seed that lacks
    one of the two runs is left out of that pair."""
    k = result.config.data.eval_samples
    methods = result.methods
    out = []
    for j in reversed(range(len(methods))):
        a = methods[j]
        for b in reversed(methods[:j]):
            runs_a = {r.seed: r for r in result.runs(a)}
            runs_b = {r.seed: r for r in result.runs(b)}
            pairs = [(runs_a[s], runs_b[s]) for s in sorted(set(runs_a) & set(runs_b))]
            if not pairs:
                continue
            out.append(
                Comparison(
                    a=a,
                    b=b,
                    mean=paired_difference(
                        [100 * x.area_mean(k) for x, _ in pairs],
                        [100 * y.area_mean(k) for _, y in pairs],
                    ),
                    final=paired_difference(
                        [100 * x.final(k) for x, _ in pairs], [100 * y.final(k) for _, y in pairs]
                    ),
                )
            )
    return out
