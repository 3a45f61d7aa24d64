"""Worker side of `gmts.rewards.math_verifier`: serve math comparisons over JSON lines.

Started by `gmts.rewards.math_verifier.MathVerifierPool` as ``python .../_math_server.py``. It
loads ``math_answer.py`` by file path so that the gmts package (and torch) is not imported.
Protocol: one request line ``{"pred": str, "gold": str, "budget": float}`` -> one answer line
``{"match": bool}``; the first line written is ``ready``. Exits at end of input.
"""

import importlib.util
import json
import logging
import os
import sys
from pathlib import Path

# address-space cap (SymPy blow-ups end as MemoryError instead of swapping the machine)
MEMORY_BYTES = 4 * 1024**3
WARM_UP = (
    ("x^2+2x+1", "(x+1)^2"),
    ("0.5", "\\frac{1}{2}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("[0,0.5)", "[0,\\frac12)"),
    ("\\{2,1\\}", "\\{1,2\\}"),
    ("[-2,7]", "x \\in [-2,7]"),
    ("\\begin{pmatrix}0.5\\\\2\\end{pmatrix}", "\\begin{pmatrix}1/2\\\\2\\end{pmatrix}"),
    ("2x", "y=2x"),
    ("east", "\\text{east}"),
    ("(1,2),(3,4)", "(3,4),(1,2)"),
)


def main() -> int:
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]  # do not shadow stdlib modules with this package's file names
    protocol_out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from libraries must not corrupt the protocol stream
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    logging.disable(logging.WARNING)  # math-verify logs every parse failure and timeout
    spec = importlib.util.spec_from_file_location("_gmts_math_answer", here / "math_answer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # SymPy imports much of itself lazily on first use (simplify, sets, matrices): do that now,
    # with no alarm running, so that a deadline never interrupts an import half-way
    for predicted, gold in WARM_UP:
        module.answers_match(predicted, gold)
    protocol_out.write("ready\n")
    for line in sys.stdin:
        try:
            request = json.loads(line)
            match = module.check_with_deadline(
                str(request["pred"]), str(request["gold"]), float(request["budget"])
            )
        except BaseException:  # noqa: BLE001 - answer every request; never die on input
            match = False
        protocol_out.write(json.dumps({"match": bool(match)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
