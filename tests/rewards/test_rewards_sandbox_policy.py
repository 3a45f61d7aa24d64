"""The code sandbox fails closed: without working bubblewrap nothing runs unless the weaker
backend is chosen explicitly (argument, config key / CLI option, or GMTS_SANDBOX).

"Nothing ran" is shown with a marker file that the program would create in a world-writable
folder; the same program under an explicit opt-in does create it, so the check can fail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import gmts.rewards.sandbox as sandbox
from gmts.rewards import (
    SandboxUnavailableError,
    check_sandbox,
    code_reward,
    get_reward,
    run_sandboxed,
)

BWRAP_OK = shutil.which("bwrap") is not None and sandbox._environment().bwrap_status()[0]
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason="bubblewrap is not usable here")
OPT_INS = (
    "backend='subprocess'",  # function argument
    "get_reward('code', sandbox='subprocess')",
    "data.sandbox=subprocess",  # gmts train config key
    "--sandbox subprocess",  # gmts eval option
    "GMTS_SANDBOX=subprocess",  # environment variable
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A world-writable folder outside pytest's private tmp tree (the weak backend may run the
    program as uid 65534, which must be able to write the marker there)."""
    path = Path(tempfile.mkdtemp(prefix="gmts-sandbox-policy-"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fresh_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox's once-per-process probe and warning start over; GMTS_SANDBOX unset."""
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_ENVIRONMENT", None)


def _marker_program(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')\n"


def _weak_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, RuntimeWarning) and "WEAK 'subprocess'" in str(w.message)
    ]


# ----------------------------------------------------------------------------- refusal


def test_without_bwrap_every_entry_point_refuses_and_nothing_runs(
    no_bwrap: None, open_dir: Path
) -> None:
    marker = open_dir / "ran.txt"
    program = _marker_program(marker)
    with pytest.raises(SandboxUnavailableError) as refused:
        code_reward(program, "")
    message = str(refused.value)
    assert "bubblewrap is not available (no `bwrap` on PATH)" in message
    for install in ("apt-get install bubblewrap", "dnf install bubblewrap", "pacman -S bubblewrap"):
        assert install in message
    for opt_in in OPT_INS:
        assert opt_in in message
    assert isinstance(refused.value, RuntimeError)
    for attempt in (
        lambda: run_sandboxed(program),
        lambda: run_sandboxed(program, backend="bwrap"),
        lambda: code_reward(program, "", backend="bwrap"),
        lambda: code_reward(42, ""),  # type: ignore[arg-type]  # refused even when unrunnable
        lambda: get_reward("code")(f"```python\n{program}```", ""),
        check_sandbox,
    ):
        with pytest.raises(SandboxUnavailableError, match="refusing to run model-written code"):
            attempt()
    assert not marker.exists()
    # positive control: the same program, explicitly allowed the weak backend, leaves the marker
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert code_reward(program, "", backend="subprocess") == 1.0
    assert marker.read_text() == "ran"


def test_bwrap_that_fails_its_probe_is_refused_with_the_reason(
    no_bwrap: None, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a bwrap that exists but cannot create namespaces, as in a locked-down container
    fake = open_dir / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    fake.parent.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    marker = open_dir / "ran.txt"
    with pytest.raises(SandboxUnavailableError) as refused:
        code_reward(_marker_program(marker), "")
    message = str(refused.value)
    assert "installed but failed its test run" in message
    assert "setting up uid map: Permission denied" in message
    assert "user namespaces" in message and "GMTS_SANDBOX=subprocess" in message
    assert not marker.exists()


def test_unknown_backend_names_are_errors(fresh_sandbox: None, monkeypatch) -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        check_sandbox("auto")  # the old silent fallback is gone
    monkeypatch.setenv("GMTS_SANDBOX", "none")
    with pytest.raises(ValueError, match="GMTS_SANDBOX='none'"):
        check_sandbox()
    monkeypatch.setenv("GMTS_SANDBOX", "")  # empty: the default
    with pytest.warns(RuntimeWarning, match="WEAK 'subprocess' sandbox"):
        assert check_sandbox("subprocess") == "subprocess"


# ----------------------------------------------------------------------------- opt-ins


@pytest.mark.parametrize("how", ["argument", "reward lookup", "environment"])
def test_each_explicit_opt_in_runs_the_weak_backend_and_warns_once(
    how: str, no_bwrap: None, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the config key and the eval option feed the argument: tests/train, tests/evaluation)
    markers = [open_dir / "first.txt", open_dir / "second.txt"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "argument":
            rewards = [code_reward(_marker_program(m), "", backend="subprocess") for m in markers]
            source = "backend='subprocess'"
        elif how == "reward lookup":
            code = get_reward("code", sandbox="subprocess")
            rewards = [code(f"```python\n{_marker_program(m)}```", "") for m in markers]
            source = "backend='subprocess'"
        else:
            monkeypatch.setenv("GMTS_SANDBOX", "subprocess")
            rewards = [code_reward(_marker_program(m), "") for m in markers]
            assert run_sandboxed("pass").backend == "subprocess"
            source = "GMTS_SANDBOX=subprocess"
    assert rewards == [1.0, 1.0]
    assert all(m.read_text() == "ran" for m in markers)
    weak = _weak_warnings(caught)
    assert len(weak) == 1, weak  # once per process, however many programs run
    assert f"({source})" in weak[0] and "NO filesystem, network or process isolation" in weak[0]


def test_an_argument_wins_over_the_environment_variable(
    no_bwrap: None, open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GMTS_SANDBOX", "subprocess")
    marker = open_dir / "ran.txt"
    with pytest.raises(SandboxUnavailableError):
        code_reward(_marker_program(marker), "", backend="bwrap")
    assert not marker.exists()


# ----------------------------------------------------------------------------- with bubblewrap


@needs_bwrap
def test_with_bwrap_the_default_is_bwrap_and_silent(fresh_sandbox: None) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_sandbox() == "bwrap"
        result = run_sandboxed("print('hello')")
        assert get_reward("code")("```python\nx = 1\n```", "assert x == 1") == 1.0
    assert result.passed and result.backend == "bwrap"
    assert _weak_warnings(caught) == []


@needs_bwrap
def test_with_bwrap_the_weak_backend_is_still_opt_in_only(
    fresh_sandbox: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GMTS_SANDBOX", "subprocess")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_sandboxed("pass").backend == "subprocess"
        assert run_sandboxed("pass", backend="bwrap").backend == "bwrap"
    assert len(_weak_warnings(caught)) == 1
