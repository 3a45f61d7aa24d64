"""Built-in verifiable arithmetic tasks for the embedded (no download) default.

Every task writes its answer least-significant digit first (the order in which a carry is
computed), then ``>`` and the answer in the usual order as a short scratchpad, then the end
token ``$``: ``037+485=`` -> ``225>522$``. Operands are zero-padded to a fixed width so that every
prompt of a task has the same length. The reward is 1 only for an exact string match of the
completion (up to the end token) with the expected one: no ``int()`` parsing, so leading zeros,
spaces or a missing scratchpad earn nothing.

A fixed 10% of all prompts (chosen by a CRC32 hash of the prompt) is reserved for evaluation:
``Task.sample`` never returns them and ``Task.held_out`` returns only them.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from gmts._registry import Registry
from gmts.embedded.tokenizer import END_TOKEN

HELD_OUT_SEED = 1234
"""Default seed of ``Task.held_out``: the evaluation set every gmts command reports."""
_HELD_OUT_BUCKETS = 10  # 1 prompt in 10 is held out


@dataclass(frozen=True)
class Problem:
    """One question: the prompt the model continues and the exact expected completion.

    ``answer`` excludes the end token (``"225>522"`` for ``"037+485="``).
    """

    prompt: str
    answer: str


def is_held_out(prompt: str) -> bool:
    """True for the fixed 10% of prompts reserved for evaluation (stable across runs/platforms)."""
    return zlib.crc32(prompt.encode("utf-8")) % _HELD_OUT_BUCKETS == 0


def _format_answer(value: int) -> str:
    digits = str(value)
    return f"{digits[::-1]}>{digits}"


@dataclass(frozen=True)
class Task:
    """A two-operand arithmetic task ``a <op> b`` with a reversed-digit answer and scratchpad.

    Attributes:
        name: registry name.
        operator: "+" or "*".
        first_range / second_range: inclusive operand ranges.
        width: operands are zero-padded to this many digits (one prompt length per task).
        demo_noise: default probability that ``demonstration`` replaces each answer digit
            (used by the warm start; the calibrated 0.3 gives a warm avg@16 of about 0.3).
        description: one line for help texts and reports.
    """

    name: str
    operator: str
    first_range: tuple[int, int]
    second_range: tuple[int, int]
    width: int
    demo_noise: float = 0.3
    description: str = ""

    def __post_init__(self) -> None:
        if self.operator not in _OPERATIONS:
            raise ValueError(
                f"operator must be one of {sorted(_OPERATIONS)}, got {self.operator!r}"
            )
        for label, (low, high) in (
            ("first_range", self.first_range),
            ("second_range", self.second_range),
        ):
            if not 0 <= low <= high < 10**self.width:
                raise ValueError(
                    f"{label} {(low, high)} must lie in [0, 10**width) with low <= high"
                )
        if not 0.0 <= self.demo_noise <= 1.0:
            raise ValueError(f"demo_noise must be in [0, 1], got {self.demo_noise!r}")

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def prompt_length(self) -> int:
        """Characters (= tokens) in every prompt."""
        return 2 * self.width + 2

    @property
    def max_answer_length(self) -> int:
        """Characters in the longest expected completion (without the end token)."""
        largest = _OPERATIONS[self.operator](self.first_range[1], self.second_range[1])
        return 2 * len(str(largest)) + 1

    @property
    def max_new_tokens(self) -> int:
        """Generation budget: the longest answer plus the end token, and no more.

        With no slack, a completion cut off by the budget is longer than any expected answer, so
        it can never be rewarded even though its decoded text has no end token.
        """
        return self.max_answer_length + 1

    # ---- problems ----------------------------------------------------------------------------
    def make_problem(self, first: int, second: int) -> Problem:
        """The problem for operands ``first`` and ``second`` (no range check)."""
        prompt = f"{first:0{self.width}d}{self.operator}{second:0{self.width}d}="
        return Problem(prompt, _format_answer(_OPERATIONS[self.operator](first, second)))

    def _random_problem(self, rng: random.Random) -> Problem:
        return self.make_problem(rng.randint(*self.first_range), rng.randint(*self.second_range))

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` training problems drawn with replacement, never from the held-out set."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        problems: list[Problem] = []
        while len(problems) < n:
            problem = self._random_problem(rng)
            if not is_held_out(problem.prompt):
                problems.append(problem)
        return problems

    def held_out(self, n: int = 200, seed: int = HELD_OUT_SEED) -> list[Problem]:
        """``n`` distinct evaluation problems, all from the held-out 10% (deterministic in seed)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        space = (self.first_range[1] - self.first_range[0] + 1) * (
            self.second_range[1] - self.second_range[0] + 1
        )
        if n > space // (2 * _HELD_OUT_BUCKETS):
            raise ValueError(f"n={n} is too many held-out problems for task {self.name!r}")
        rng = random.Random(f"{self.name}/held-out/{seed}")
        seen: set[str] = set()
        problems: list[Problem] = []
        while len(problems) < n:
            problem = self._random_problem(rng)
            if is_held_out(problem.prompt) and problem.prompt not in seen:
                seen.add(problem.prompt)
                problems.append(problem)
        return problems

    # ---- reward and demonstrations -----------------------------------------------------------
    @property
    def reward_description(self) -> str:
        """What :meth:`reward` expects, in one line."""
        example = self.make_problem(self.first_range[0], self.second_range[0])
        return (
            "exactly the expected completion, the reversed digits, '>' and the digits "
            f"(e.g. {example.answer} for {example.prompt})"
        )

    def reward(self, completion: str, answer: str) -> float:
        """1.0 when ``completion`` up to its first end token equals ``answer`` exactly, else 0.0."""
        return 1.0 if completion.split(END_TOKEN, 1)[0] == answer else 0.0

    def demonstration(
        self, problem: Problem, rng: random.Random, noise: float | None = None
    ) -> str:
        """A supervised target for ``problem``: the completion text, end token excluded.

        Each digit of the reversed answer is replaced by a uniformly random digit with
        probability ``noise`` (``self.demo_noise`` when None); the scratchpad's second half is
        always the faithful reversal of the (possibly wrong) first half, so demonstrations teach
        the format exactly and the arithmetic noisily.
        """
        noise = self.demo_noise if noise is None else noise
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1], got {noise!r}")
        reversed_digits = problem.answer.split(">", 1)[0]
        noisy = "".join(
            str(rng.randrange(10)) if rng.random() < noise else digit for digit in reversed_digits
        )
        return f"{noisy}>{noisy[::-1]}"


_OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "*": lambda a, b: a * b,
}

_TASKS = Registry[Task]("task")


register_task = _TASKS.register
get_task = _TASKS.get
available_tasks = _TASKS.names


register_task(
    Task(
        "addition",
        "+",
        (10, 999),
        (10, 999),
        width=3,
        description="2-3 digit addition (the demo task): 037+485= -> 225>522$",
    )
)
# "addition-long" stops at 4 digits: with 4-5 digit operands the default warm-start recipe
# learned nothing in its step budget, and every task should work with the one recipe.
register_task(
    Task(
        "addition-long",
        "+",
        (100, 9999),
        (100, 9999),
        width=4,
        description="3-4 digit addition: longer answers and carries than the demo task",
    )
)
register_task(
    Task(
        "multiplication",
        "*",
        (10, 99),
        (2, 99),
        width=2,
        description="2-digit x 1-2 digit multiplication: 37*08= -> 692>296$ (hard: the warm "
        "start rarely gets it right, so RL must add ability, not only sharpen)",
    )
)
