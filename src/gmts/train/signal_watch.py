"""No silent zero-signal run: a warning when the first steps carry no learning signal, and one
when most answers were cut at the budget.

A group whose answers all got the same reward has advantage 0 for every answer, so GRPO learns
nothing from it and DAPO's dynamic sampling drops it. When that holds for every group of the
first ``ZERO_SIGNAL_STEPS`` steps (a reward of 0 for every answer is the common case: a model
that cannot write what the reward reads), :class:`ZeroSignalWatch` warns once, with a sampled
answer and what the reward expects, instead of letting the run train on nothing.

An answer that reaches ``rollout.max_response_length`` without its end token was cut: its
reward is usually 0 and its tokens are the start of an answer, not one. When more than
:data:`gmts.models.defaults.TRUNCATED_WARN_FRACTION` of the first step's answers were cut, :class:`TruncationWatch`
warns once, with the count and the key that raises the budget.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from gmts.models.defaults import truncation_message
from gmts.train.collect import AnswerSample, CollectedBatch

ZERO_SIGNAL_STEPS = 3
"""Steps without a single group of differing rewards before the warning."""
SHOWN_CHARS = 200
"""A sample's prompt, answer and gold are cut to this many characters in the warning."""


class ZeroSignalWarning(UserWarning):
    """The first steps of a run had no group with differing rewards."""


class TruncationWarning(UserWarning):
    """Most answers of a run's first step were cut at the generation budget."""


@dataclass
class TruncationWatch:
    """Warns once when most answers of the first step it sees were cut at the budget.

    Attributes:
        budget: new tokens per answer. key: the setting that raises it.
    """

    budget: int
    key: str = "rollout.max_response_length"
    done: bool = False

    def observe(self, collected: CollectedBatch) -> str | None:
        """The first step's answers: the warning (also issued as a :class:`TruncationWarning`)
        when most were cut, else None; later steps: None."""
        if self.done:
            return None
        self.done = True
        stats = collected.stats
        message = truncation_message(
            int(stats.truncated), int(stats.answers), self.budget, self.key
        )
        if message is not None:
            warnings.warn(message, TruncationWarning, stacklevel=2)
        return message


def _shown(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "...")


@dataclass
class ZeroSignalWatch:
    """Watches the first ``steps`` steps of a run and warns once if none had a signal.

    Attributes:
        reward: how the reward was chosen, e.g. "data.reward=math".
        expects: the reward's one-line description of what a completion must hold.
        dynamic_sampling: whether groups without a signal are dropped (rollout.dynamic_sampling).
        steps: steps to watch (the run's first ones; fewer for a shorter run).
    """

    reward: str
    expects: str
    dynamic_sampling: bool
    steps: int = ZERO_SIGNAL_STEPS
    seen: int = 0
    answers: float = 0.0
    reward_sum: float = 0.0
    sample: AnswerSample | None = None
    done: bool = False

    def observe(self, collected: CollectedBatch) -> str | None:
        """Record one step; the warning's text once when the watched steps had no signal
        (it is also issued as a :class:`ZeroSignalWarning`), else None."""
        if self.done:
            return None
        stats = collected.stats
        if stats.varied_groups > 0:  # a signal: nothing to warn about, ever
            self.done = True
            return None
        self.seen += 1
        self.answers += stats.answers
        self.reward_sum += stats.raw_reward_sum
        self.sample = self.sample or collected.sample
        if self.seen < self.steps:
            return None
        self.done = True
        message = self.message()
        warnings.warn(message, ZeroSignalWarning, stacklevel=2)
        return message

    def message(self) -> str:
        """The warning: what happened, what the reward expects, one sampled answer."""
        mean = self.reward_sum / max(self.answers, 1.0)
        what = (
            f"every answer got reward 0 ({int(self.answers)} answers)"
            if self.reward_sum == 0
            else f"every group's answers got one same reward (mean {mean:.3f})"
        )
        dropped = (
            " Dynamic sampling dropped every group (each was topped up at advantage 0)."
            if self.dynamic_sampling
            else ""
        )
        lines = [
            f"no learning signal in the first {self.seen} step(s): {what}, so every advantage "
            f"is 0 and nothing is learned.{dropped}",
            f"  the reward ({self.reward}) expects: {self.expects or '(no description)'}",
        ]
        if self.sample is not None:
            lines += [
                "  a sampled answer:",
                f"    prompt:     {_shown(self.sample.prompt)}",
                f"    completion: {_shown(self.sample.completion)}",
                f"    gold:       {_shown(self.sample.answer)}",
            ]
        lines.append(
            "  Check that the model can write what the reward reads (model.path, data.template, "
            "data.reward; a reward of your own: --plugin MODULE data.reward=NAME); "
            "docs/training.md, 'Your own data'."
        )
        return "\n".join(lines)
