"""Math answer normalisation and the in-process math-verify comparison.

`normalize_answer` turns a gold answer as benchmarks store it (``"$\\frac{1}{2}$"``,
``27.0``, ``"025"``, ``"$a$,$b$"``) into one LaTeX string. `answers_match` compares a model's
boxed answer with a gold answer using ``math_verify`` (imported lazily). `answers_match` has no
time bound of its own: `gmts.rewards.math_reward` calls it inside a worker process that is killed
when it runs too long (see `gmts.rewards.math_verifier`).
"""

from __future__ import annotations

import logging
import re
import signal
from functools import lru_cache
from typing import Any

_INTEGER_WITH_ZERO_FRACTION = re.compile(r"[+-]?\d+\.0*")
_LEADING_ZEROS = re.compile(r"0+\d+")
# longest answer we hand to the LaTeX parser; longer text is compared as a string only
MAX_ANSWER_CHARS = 1000


def normalize_answer(answer: Any) -> str:
    """One LaTeX string for a gold (or predicted) answer.

    - numbers: ``27.0`` -> ``"27"`` (AMC stores floats), ``"025"`` -> ``"25"`` (AIME);
    - ``$`` math delimiters are removed everywhere (OlympiadBench's ``"$a$,$b$"`` lists become
      ``"a,b"``), as is an escaped currency sign ``\\$``;
    - surrounding whitespace and one trailing period are stripped.
    Never raises: ``None`` gives ``""``.
    """
    if answer is None:
        return ""
    if isinstance(answer, float) and answer.is_integer():
        answer = int(answer)
    text = str(answer).strip()
    text = text.replace("\\$", "").replace("$", "").strip()
    if text.endswith(".") and not text.endswith("\\."):
        text = text[:-1].rstrip()
    if _INTEGER_WITH_ZERO_FRACTION.fullmatch(text):
        text = text.split(".")[0]
    sign = text[0] if text[:1] in ("+", "-") else ""
    if _LEADING_ZEROS.fullmatch(text[len(sign) :]):
        text = sign + (text[len(sign) :].lstrip("0") or "0")
    return text


def _squash(text: str) -> str:
    return "".join(text.split())


def _drop_timeout_disabled_notice(record: logging.LogRecord) -> bool:
    # we disable math-verify's signal timeouts on purpose (see gmts.rewards.math_verifier)
    return not str(record.msg).startswith("Timeout is disabled")


@lru_cache(maxsize=1)
def _quiet_math_verify() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_drop_timeout_disabled_notice)


@lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple:
    """math-verify parse of an already normalised answer, wrapped in a box (cached)."""
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return ()
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    _quiet_math_verify()
    parsed = parse(
        "\\boxed{" + answer + "}",
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=None,  # our worker process bounds the time (signal-free)
    )
    return tuple(parsed)


def strings_match(predicted: str, gold: str) -> bool:
    """Whether two answers are equal after `normalize_answer`, up to whitespace (no parsing)."""
    predicted_norm, gold_norm = normalize_answer(predicted), normalize_answer(gold)
    return bool(predicted_norm) and _squash(predicted_norm) == _squash(gold_norm)


def answers_match(predicted: str, gold: str) -> bool:
    """Whether a predicted final answer equals a gold answer (both raw strings, un-normalised).

    True when the normalised strings are equal up to whitespace, or math-verify judges the
    parsed expressions equal. Empty answers never match. No time bound (see module docstring).
    """
    predicted_norm = normalize_answer(predicted)
    gold_norm = normalize_answer(gold)
    if not predicted_norm or not gold_norm:
        return False
    if _squash(predicted_norm) == _squash(gold_norm):
        return True
    return _verify(predicted_norm, gold_norm)


def symbolic_match(predicted: str, gold: str) -> bool:
    """math-verify's judgement alone (no exact-string shortcut) of two raw answers. No time
    bound (see module docstring)."""
    return _verify(normalize_answer(predicted), normalize_answer(gold))


def _verify(predicted_norm: str, gold_norm: str) -> bool:
    gold_parsed = _parse(gold_norm)
    predicted_parsed = _parse(predicted_norm)
    if not gold_parsed or not predicted_parsed:
        return False
    from math_verify import verify

    return bool(verify(list(gold_parsed), list(predicted_parsed), timeout_seconds=None))


class _Deadline(BaseException):
    """Raised by the alarm; a BaseException so library ``except Exception`` clauses miss it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Deadline()


def check_with_deadline(predicted: str, gold: str, budget_s: float) -> bool:
    """`answers_match` under a ``setitimer`` alarm of ``budget_s`` seconds (main thread only).

    False when the alarm fires or anything goes wrong. Restores the previous SIGALRM handler.
    The alarm cannot interrupt a long C call (a huge integer power); only a process kill can.
    """
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(budget_s, 1e-3))
    try:
        return answers_match(predicted, gold)
    except (_Deadline, Exception):  # noqa: BLE001 - a verifier never raises on model output
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
