"""Find the final answer a model wrote in ``\\boxed{...}`` (or ``\\fbox{...}``).

Pure string code: no regex backtracking over user text, linear in the text length, never
raises on arbitrary input. Used by the math verifier and the multiple-choice verifier.
"""

from __future__ import annotations

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _find_box_starts(text: str) -> list[tuple[int, int]]:
    """(start, end_of_command) of every ``\\boxed`` / ``\\fbox`` command, in text order."""
    starts: list[tuple[int, int]] = []
    for command in _BOX_COMMANDS:
        position = text.find(command)
        while position != -1:
            end = position + len(command)
            # `\boxedx` is another command name, not `\boxed` followed by x
            if end >= len(text) or not text[end].isalpha():
                starts.append((position, end))
            position = text.find(command, end)
    starts.sort()
    return starts


def _matching_braces(text: str) -> dict[int, int]:
    """Map each unescaped ``{`` that has a matching ``}`` to that ``}``'s index (one pass)."""
    matches: dict[int, int] = {}
    stack: list[int] = []
    backslashes = 0
    for index, char in enumerate(text):
        if char == "\\":
            backslashes += 1
            continue
        escaped = backslashes % 2 == 1
        backslashes = 0
        if escaped:
            continue
        if char == "{":
            stack.append(index)
        elif char == "}" and stack:
            matches[stack.pop()] = index
    return matches


def _read_argument(text: str, position: int, matches: dict[int, int]) -> str | None:
    """The argument of a box command whose name ends at ``position``, or None if malformed.

    ``{...}`` with balanced (nested) braces, or the ``\\boxed 5`` form: after optional
    spaces, the run of characters up to the next whitespace or ``$``.
    """
    length = len(text)
    index = position
    while index < length and text[index] in " \t":
        index += 1
    if index < length and text[index] == "{":
        close = matches.get(index)
        return None if close is None else text[index + 1 : close]  # None: truncated
    if index >= length:
        return None  # `\\boxed` at the very end has no argument
    end = index
    while end < length and not text[end].isspace() and text[end] != "$":
        end += 1
    return text[index:end] if end > index else None


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, else None.

    Handles nested braces (``\\boxed{\\frac{1}{2}}``), escaped braces (``\\{``) and the
    brace-less ``\\boxed 5`` form. A truncated last box (unbalanced braces) is skipped in
    favour of the last complete one. The content is returned stripped; an empty box gives "".
    Never raises: non-string input gives None.
    """
    if not isinstance(text, str):
        return None
    starts = _find_box_starts(text)
    if not starts:
        return None
    # braces before the first box cannot belong to any box's argument
    offset = starts[0][0]
    matches = {
        open_ + offset: close + offset for open_, close in _matching_braces(text[offset:]).items()
    }
    for _start, end in reversed(starts):
        argument = _read_argument(text, end, matches)
        if argument is not None:
            return argument.strip()
    return None


def format_reward(completion: str) -> float:
    """1.0 if the completion states a final answer in a non-empty ``\\boxed{...}``, else 0.0."""
    boxed = extract_boxed(completion)
    return 1.0 if boxed else 0.0
