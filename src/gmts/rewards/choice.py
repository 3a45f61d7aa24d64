"""Verifiers for multiple-choice (CommonsenseQA, letters A-E) and yes/no (CSQA2) answers.

Where the answer is read from, first found wins:
1. the last complete ``\\boxed{...}`` (``\\boxed{C}``, ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``,
   ``\\boxed{C) bank}``, ``\\boxed{yes}``);
2. the last "answer is X" / "answer: X" phrase (``The answer is (C)``, ``**Answer:** C``,
   ``answer is: yes``), case-insensitive for the word "answer";
3. yes/no only: a completion that is nothing but the word (``Yes.``).
Nothing else is guessed: a letter or yes/no somewhere in free text is not an answer.
"""

from __future__ import annotations

import re

from gmts.rewards.boxed import extract_boxed

# wrappers a model puts around a short answer inside a box
_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*")
_ANSWER_PHRASE = re.compile(
    r"answer\s*(?:is|:)\s*:?\s*(?:\*\*)?\s*[\(\[]?\s*([A-Za-z]+)", flags=re.IGNORECASE
)
_YES_NO = {"yes": "yes", "no": "no", "true": "yes", "false": "no"}


def _strip_wrappers(text: str) -> str:
    """``\\text{(C)}`` -> ``(C)``: drop text commands and braces, keep the rest."""
    return _WRAPPER.sub("", text).replace("{", "").replace("}", "").strip()


def _leading_word(text: str) -> str | None:
    """First alphabetic run of ``text`` after optional brackets and markup, else None."""
    match = re.match(r"[\s\(\[\*]*([A-Za-z]+)", text)
    return match.group(1) if match else None


def extract_choice(completion: str, choices: str = "ABCDE") -> str | None:
    """The option letter the completion commits to (upper case), or None.

    A candidate must be exactly one letter out of ``choices`` (``\\boxed{Cat}`` is not C).
    """
    if not isinstance(completion, str):
        return None
    boxed = extract_boxed(completion)
    candidates = []
    if boxed:
        candidates.append(_leading_word(_strip_wrappers(boxed)))
    else:
        phrases = _ANSWER_PHRASE.findall(completion)
        if phrases:
            candidates.append(phrases[-1])
    for word in candidates:
        # a lower-case single letter only counts inside a box ("answer is a dog" is not A)
        if (
            word
            and len(word) == 1
            and word.upper() in choices.upper()
            and (word.isupper() or boxed)
        ):
            return word.upper()
    return None


def choice_reward(completion: str, answer_letter: str, *, choices: str = "ABCDE") -> float:
    """1.0 if the completion's chosen letter (see `extract_choice`) is ``answer_letter``."""
    if not isinstance(answer_letter, str) or len(answer_letter.strip()) != 1:
        raise ValueError(f"answer_letter must be a single letter, got {answer_letter!r}")
    gold = answer_letter.strip().upper()
    if gold not in choices.upper():
        raise ValueError(f"answer_letter {answer_letter!r} is not one of choices {choices!r}")
    return 1.0 if extract_choice(completion, choices) == gold else 0.0


def _as_yes_no(word: str | None) -> str | None:
    return _YES_NO.get(word.lower()) if word else None


def extract_yes_no(completion: str) -> str | None:
    """``"yes"`` / ``"no"`` the completion commits to (true/false count as yes/no), or None."""
    if not isinstance(completion, str):
        return None
    boxed = extract_boxed(completion)
    if boxed is not None:
        return _as_yes_no(_leading_word(_strip_wrappers(boxed)))
    phrases = _ANSWER_PHRASE.findall(completion)
    if phrases:
        return _as_yes_no(phrases[-1])
    whole = completion.strip().strip(".!*").strip()
    return _as_yes_no(whole) if re.fullmatch(r"[A-Za-z]+", whole) else None


def yes_no_reward(completion: str, answer: str | bool) -> float:
    """1.0 if the completion's yes/no (see `extract_yes_no`) equals the gold ``answer``."""
    gold = _as_yes_no(str(answer).strip()) if isinstance(answer, (str, bool)) else None
    if gold is None:
        raise ValueError(f"answer must be 'yes' or 'no' (or a bool), got {answer!r}")
    return 1.0 if extract_yes_no(completion) == gold else 0.0
