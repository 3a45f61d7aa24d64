"""Turn a model's markdown answer into a runnable program plus tests (HumanEval, MBPP).

`extract_code_block` finds the code; `humaneval_program` / `mbpp_program` assemble it with the
benchmark's tests. A ``problem`` is either an `Example` from `gmts.data.benchmarks.load_benchmark`
(fields in ``.meta``, test code in ``.answer``) or the benchmark's raw row (a dict).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*$", flags=re.MULTILINE)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}


def _code_blocks(markdown: str) -> list[tuple[str, str]]:
    """(language tag, code) of each fenced block, in order; an unclosed last block counts."""
    fences = list(_FENCE.finditer(markdown))
    blocks = []
    index = 0
    while index < len(fences):
        opening = fences[index]
        body_start = opening.end() + 1
        if index + 1 < len(fences):
            closing = fences[index + 1]
            blocks.append((opening.group(1).lower(), markdown[body_start : closing.start()]))
            index += 2
        else:  # truncated answer: the block runs to the end of the text
            blocks.append((opening.group(1).lower(), markdown[body_start:]))
            index += 1
    return blocks


def extract_code_block(markdown: str) -> str:
    """The last ```python block of ``markdown``; else the last ``` block of any language; else
    the whole text (a bare program). Never raises; non-string input gives ""."""
    if not isinstance(markdown, str):
        return ""
    blocks = _code_blocks(markdown)
    python_blocks = [code for tag, code in blocks if tag in _PYTHON_TAGS]
    if python_blocks:
        return python_blocks[-1].strip("\n")
    if blocks:
        return blocks[-1][1].strip("\n")
    return markdown


def _field(problem: Any, name: str) -> Any:
    meta = getattr(problem, "meta", None)
    if isinstance(meta, Mapping) and name in meta:
        return meta[name]
    if isinstance(problem, Mapping) and name in problem:
        return problem[name]
    raise ValueError(f"problem has no field {name!r} (pass an Example or a raw benchmark row)")


def _import_lines(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if line.startswith(("import ", "from ")))


def humaneval_tests(problem: Any) -> str:
    """HumanEval test code: the ``check`` function and the call on the entry point."""
    answer = getattr(problem, "answer", None)
    if isinstance(answer, str) and getattr(problem, "meta", None) is not None:
        return answer  # an Example's answer already is the assembled test code
    return f"{_field(problem, 'test')}\n\ncheck({_field(problem, 'entry_point')})\n"


def humaneval_program(completion: str, problem: Any) -> tuple[str, str]:
    """(program, tests) for a HumanEval problem.

    If the extracted code defines the entry point itself, the program is the prompt's imports
    plus that code; otherwise the code is taken as the function body continuing the prompt.
    """
    prompt = str(_field(problem, "prompt"))
    entry_point = str(_field(problem, "entry_point"))
    code = extract_code_block(completion)
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, flags=re.MULTILINE):
        program = _import_lines(prompt) + "\n\n" + code
    else:
        program = prompt + code
    return program, humaneval_tests(problem)


def mbpp_tests(problem: Any) -> str:
    """MBPP test code: the setup code, then the task's ``assert`` lines."""
    answer = getattr(problem, "answer", None)
    if isinstance(answer, str) and getattr(problem, "meta", None) is not None:
        return answer
    setup = str(_field(problem, "test_setup_code") or "")
    return setup + "\n" + "\n".join(_field(problem, "test_list")) + "\n"


def mbpp_program(completion: str, problem: Any) -> tuple[str, str]:
    """(program, tests) for an MBPP problem: the extracted code and the task's asserts."""
    return extract_code_block(completion), mbpp_tests(problem)
