"""README's fast test command works as written after the Quickstart: the command it names
before ``.venv/bin/python -m pytest`` installs pytest into that ``.venv``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parents[2]


def _extras(name: str, table: dict[str, list[str]]) -> set[str]:
    """Every requirement of extra ``name``, the extras it names (``gmts[a,b]``) followed."""
    out: set[str] = set()
    for requirement in table[name]:
        match = re.fullmatch(r"gmts\[([\w,]+)\]", requirement)
        if match:
            for inner in match.group(1).split(","):
                out |= _extras(inner, table)
        else:
            out.add(re.split(r"[<>=!\[ ;]", requirement, maxsplit=1)[0])
    return out


def _profile_extras(profile: str) -> str:
    """The extras ``scripts/setup.sh <profile>`` installs the checkout with."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    branch = script.split('\ncase "$profile" in\n  demo)', 1)[1]
    body = branch.split(f"\n  {profile})", 1)[1] if profile != "demo" else branch
    return re.search(r'install_checkout "\[([\w,]+)\]"', body).group(1)


def test_the_fast_test_command_is_preceded_by_the_setup_that_installs_pytest() -> None:
    readme = (ROOT / "README.md").read_text()
    bullet = readme.split("- Fast tests while working:", 1)[1].split("\n- ", 1)[0]
    setup = re.search(r"`bash scripts/setup.sh (\w+)`", bullet)
    assert setup, "README's fast test bullet names no setup command"
    assert bullet.index(setup.group(0)) < bullet.index("`.venv/bin/python -m pytest`")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    installed: set[str] = set()
    for extra in _profile_extras(setup.group(1)).split(","):
        installed |= _extras(extra, extras)
    assert "pytest" in installed, f"setup.sh {setup.group(1)} installs no pytest"
    # and the Quickstart's demo alone does not: the bullet must say why the setup is needed
    demo: set[str] = set()
    for extra in _profile_extras("demo").split(","):
        demo |= _extras(extra, extras)
    assert "pytest" not in demo and "scripts/demo.sh" in bullet
