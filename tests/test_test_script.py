"""scripts/test.sh (CI) runs every test module that skips in the main environment.

A module that skips as a whole without verl or vLLM runs only where scripts/test.sh names it
on the .venv-verl or .venv-vllm pytest line; one left off that line never runs in CI (this is
how tests/integrations/test_verl_loss_modes.py went unrun). Each such module must be named
there, or lie under a folder that is.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# module-level skips: pytest.importorskip("verl...") / ("vllm"), or a pytestmark skipif that
# asks vllm_installed() (tests/vllm/_vllm_tiny.py)
NEEDS = {
    "verl": re.compile(r'^pytest\.importorskip\(\s*"verl[."]', re.M),
    "vllm": re.compile(
        r'^pytest\.importorskip\(\s*"vllm"|^pytestmark\s*=.*skipif\(\s*not vllm_installed\(\)',
        re.M,
    ),
}


def _pytest_paths(venv: str) -> list[Path]:
    """The paths on scripts/test.sh's pytest command run with ``venv``'s python."""
    text = (REPO / "scripts" / "test.sh").read_text().replace("\\\n", " ")
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip().startswith(f"{venv}/bin/python -m pytest")
    ]
    assert len(lines) == 1, (venv, lines)
    words = shlex.split(lines[0])
    return [REPO / w for w in words if w.startswith("tests/")]


def _modules_needing(package: str) -> list[Path]:
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if NEEDS[package].search(path.read_text()):
            found.append(path)
    return found


@pytest.mark.parametrize("package,venv", [("verl", ".venv-verl"), ("vllm", ".venv-vllm")])
def test_every_module_that_skips_without_the_engine_runs_in_its_environment(package, venv):
    listed = _pytest_paths(venv)
    for path in listed:
        assert path.exists(), f"scripts/test.sh names {path.relative_to(REPO)}, which is missing"
    modules = _modules_needing(package)
    assert modules, f"no test module skips without {package}: the pattern is stale"
    missing = [
        str(m.relative_to(REPO))
        for m in modules
        if not any(m == p or p in m.parents for p in listed)
    ]
    assert not missing, f"scripts/test.sh's {venv} line does not run {missing}"
