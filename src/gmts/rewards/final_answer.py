"""Which part of a completion is its final answer: the rule each math reward and verifier reads.

Two rules, by name (``ANSWER_RULES``):

- ``"boxed"`` (the paper's strict format): the content of the last complete ``\\boxed{...}``;
  an answer without one has no final answer (scores 0).
- ``"boxed-or-last-number"`` (how instruction-tuned models write by default): the last box when
  there is one, else the last number in the text (``-12``, ``1,234``, ``0.5``, ``3/4``; thousands
  separators dropped). A model that boxes scores exactly as under ``"boxed"``; one that answers
  in prose ("59 + 63 = 122.") is read by its last number, the "flexible" rule of verl's GSM8K
  reward and the last-expression fallback of math-verify's own extraction.

Pure string code, linear in the text length; never raises on arbitrary text.
"""

from __future__ import annotations

import re

from gmts.rewards.boxed import extract_boxed

__all__ = ["ANSWER_RULES", "extract_final_answer", "last_number"]

ANSWER_RULES = ("boxed", "boxed-or-last-number")

# an optional sign, digits with optional thousands groups, then an optional decimal or fraction
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+|/\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (separators removed), None when it has none."""
    if not isinstance(text, str):
        return None
    found = None
    for found in _NUMBER.finditer(text):  # noqa: B007 - the loop keeps the last match
        pass
    return found.group(0).replace(",", "") if found else None


def extract_final_answer(completion: str, rule: str = "boxed-or-last-number") -> str | None:
    """The final answer of ``completion`` under ``rule`` (see the module docstring), or None."""
    if rule not in ANSWER_RULES:
        raise ValueError(f"answer rule must be one of {ANSWER_RULES}, got {rule!r}")
    boxed = extract_boxed(completion)
    if boxed is not None or rule == "boxed":
        return boxed
    return last_number(completion)
