"""Math verifier: boxed extraction, gold normalisation, math-verify comparison, time bounds."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gmts.rewards import extract_boxed, format_reward, math_reward, normalize_answer
from gmts.rewards.math_verifier import _POOL, MathVerifierPool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is \boxed{5}.", "5"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\left(3, \frac{\pi}{2}\right)}", r"\left(3, \frac{\pi}{2}\right)"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed 5 is it", "5"),
        (r"$\boxed 7$", "7"),
        (r"\fbox{x+1}", "x+1"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not close the box
        (r"\boxed{ 3 }", "3"),
        (r"\boxed{}", ""),
        (r"\boxed{1} and a truncated \boxed{\frac{2}{", "1"),  # last complete box wins
        (r"\boxedfoo{3}", None),  # another command
        ("no box here", None),
        (r"\boxed", None),
        (r"\boxed{", None),
        ("", None),
    ],
)
def test_extract_boxed_hand_cases(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def _reference_last_boxed(text: str) -> str | None:
    """Slow oracle: try every `\\boxed{` from the end, match braces by counting."""
    position = len(text)
    while True:
        position = text.rfind("\\boxed{", 0, position)
        if position < 0:
            return None
        depth, start = 0, position + len("\\boxed")
        for index in range(start, len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + 1 : index].strip()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["\\boxed{", "{", "}", "a", "1", " ", "x^2"]), max_size=30))
def test_extract_boxed_matches_slow_reference(pieces: list[str]) -> None:
    # no backslash other than the command and no brace-less boxes: the oracle's domain
    text = "".join(pieces)
    assert extract_boxed(text) == _reference_last_boxed(text)


def test_extract_boxed_is_linear_on_pathological_text() -> None:
    start = time.monotonic()
    assert extract_boxed("\\boxed{" * 20000) is None
    assert extract_boxed("{" * 100000 + "\\boxed{1}") == "1"
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("bad", [None, 3, b"\\boxed{1}", ["\\boxed{1}"]])
def test_never_raises_on_non_text(bad: object) -> None:
    assert extract_boxed(bad) is None  # type: ignore[arg-type]
    assert format_reward(bad) == 0.0  # type: ignore[arg-type]
    assert math_reward(bad, "1") == 0.0  # type: ignore[arg-type]


def test_format_reward() -> None:
    assert format_reward(r"thus \boxed{42}") == 1.0
    assert format_reward(r"thus \boxed{}") == 0.0
    assert format_reward("thus 42") == 0.0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (27.0, "27"),
        ("27.0", "27"),
        ("025", "25"),
        ("-007", "-7"),
        ("0", "0"),
        (r"$\frac{1}{2}$", r"\frac{1}{2}"),
        (r"$2,-1,-18$", "2,-1,-18"),
        (r"$100$,$\frac{1}{100}$", r"100,\frac{1}{100}"),
        ("  5. ", "5"),
        (r"\$18.90", "18.90"),
        ("1.5", "1.5"),
        (None, ""),
    ],
)
def test_normalize_answer(raw: object, expected: str) -> None:
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (r"\boxed{\frac12}", "0.5"),
        (r"\boxed{0.5}", r"$\frac{1}{2}$"),
        (r"\boxed{27}", 27.0),
        (r"\boxed{25}", "025"),
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
        (r"\boxed{(x+1)^2}", "x^2+2x+1"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
        (r"\boxed{\text{(C)}}", r"\text{(C)}"),
        (r"\boxed{3, 5, 7}", "3, 5, 7"),
        (r"\boxed{[-2,7]}", r"x \in [-2,7]"),
    ],
)
def test_equivalent_answers_score_one(completion: str, gold: object) -> None:
    assert math_reward("Reasoning... " + completion, gold) == 1.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("completion", "gold"),
    [
        (r"\boxed{26}", 27.0),
        (r"\boxed{28}", "27"),
        (r"\boxed{0.51}", r"\frac12"),
        (r"\boxed{x^2+1}", "(x+1)^2"),
        (r"\boxed{}", "0"),
        ("27", "27"),  # no box: no answer
        (r"\boxed{27}", ""),  # no gold: never a match
    ],
)
def test_wrong_answers_score_zero(completion: str, gold: object) -> None:
    assert math_reward(completion, gold) == 0.0  # type: ignore[arg-type]


def test_missing_math_verify_is_a_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import gmts.rewards.math_verifier as verifier

    monkeypatch.setattr(verifier, "_math_verify_installed", lambda: False)
    with pytest.raises(ImportError, match="gmts\\[rewards\\]"):
        math_reward(r"\boxed{1}", "1")


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="timeout"):
        math_reward(r"\boxed{1}", "1", timeout=0)
    with pytest.raises(ValueError, match="isolation"):
        math_reward(r"\boxed{1}", "1", isolation="thread")


@pytest.mark.parametrize(
    "hostile",
    [
        r"\boxed{9^{9^{9^{9}}}}",
        r"\boxed{10^{10^{10}}}",
        r"\boxed{(10^{8})!}",
        r"\boxed{" + "(" * 500 + "1" + ")" * 500 + "}",
        r"\boxed{\frac{\frac{\frac{\frac{\frac{1}{2}}{3}}{4}}{5}}{" + "x^" * 200 + "2}",
        "\\boxed{" + "\\sqrt{" * 300 + "2" + "}" * 300 + "}",
    ],
)
def test_pathological_latex_is_time_bounded(hostile: str) -> None:
    # a warm worker first: a worker killed by the previous case restarts in the next call, and
    # start-up is not part of the bound
    assert math_reward(r"\boxed{1}", "1", timeout=120) == 1.0
    start = time.monotonic()
    assert math_reward(hostile, "3", timeout=1.0) == 0.0
    assert time.monotonic() - start < 1.0 + 1.0  # slack for killing and reaping on a busy box


@pytest.mark.slow  # starts two more workers: ~10 s each on a loaded 2-core machine
def test_math_reward_works_from_threads() -> None:
    results: list[float] = []

    def call() -> None:
        results.append(math_reward(r"\boxed{x^2+2x+1}", "(x+1)^2", timeout=60))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1.0, 1.0, 1.0]


@pytest.mark.slow  # imports SymPy into the test process (~5 s)
def test_inline_isolation_matches_process_isolation() -> None:
    cases = [(r"\boxed{\frac12}", "0.5"), (r"\boxed{3}", "4"), (r"\boxed{2\sqrt2}", r"\sqrt8")]
    for completion, gold in cases:
        inline = math_reward(completion, gold, timeout=30, isolation="inline")
        assert inline == math_reward(completion, gold, timeout=30)


@pytest.mark.slow  # imports SymPy into the test process (~5 s)
def test_inline_isolation_bounds_time_in_the_main_thread() -> None:
    start = time.monotonic()
    assert math_reward(r"\boxed{9^{9^{9^{9}}}}", "3", timeout=1.0, isolation="inline") == 0.0
    assert time.monotonic() - start < 1.0 + 0.5


def test_stalled_worker_is_killed_at_the_deadline() -> None:
    # last in this file: it costs the pool its warm worker.
    # A SIGSTOPped worker stands in for one stuck in C code that no alarm can interrupt.
    assert math_reward(r"\boxed{1}", "1", timeout=120) == 1.0
    worker = _POOL._idle[-1]
    kills = _POOL.kills
    os.kill(worker.process.pid, signal.SIGSTOP)
    start = time.monotonic()
    assert math_reward(r"\boxed{1/2}", "0.5", timeout=1.0) == 0.0
    assert time.monotonic() - start < 1.0 + 1.0
    assert _POOL.kills == kills + 1 and worker.process.poll() is not None
    assert worker not in _POOL._idle


@pytest.mark.slow  # starts a fresh worker (~10 s)
def test_pool_replaces_a_killed_worker() -> None:
    pool = MathVerifierPool()
    try:
        assert pool.check("1/2", "0.5", 60.0) is True
        (worker,) = pool._idle
        worker.kill()
        assert pool.check("1/2", "0.5", 60.0) is True
        assert pool._idle and pool._idle[0] is not worker
    finally:
        pool.close()


@pytest.mark.slow  # starts a fresh worker (~10 s)
def test_pool_caps_its_worker_processes() -> None:
    pool = MathVerifierPool(max_workers=1)
    results: list[bool] = []
    try:
        threads = [
            threading.Thread(target=lambda: results.append(pool.check("1/2", "0.5", 60.0)))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [True] * 4
        assert len(pool._idle) == 1  # four threads, one process
    finally:
        pool.close()
    with pytest.raises(ValueError, match="max_workers"):
        MathVerifierPool(max_workers=0)


def test_answers_too_long_to_parse_compare_as_strings() -> None:
    long_answer = "x+" * 1000 + "1"
    assert math_reward(r"\boxed{" + long_answer + "}", long_answer) == 1.0
    assert math_reward(r"\boxed{" + long_answer + "}", long_answer + "+1") == 0.0
    assert math_reward(r"\boxed{" + long_answer + "}", "1") == 0.0
