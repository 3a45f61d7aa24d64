"""Hostile programs against the code sandbox: each scores 0 and leaves the machine as it was.

Every hostile program is written so that it would run to completion (and so score 1.0) if its
attack worked; containment makes it fail. Tests marked ``bwrap`` need bubblewrap; the weaker
("subprocess") backend, chosen explicitly here, is run on the attacks it is documented to stop.
That the default refuses to run anything without bubblewrap: test_rewards_sandbox_policy.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from gmts.rewards.sandbox import _environment, code_reward, run_sandboxed

# the fallback's warning is the subject of test_rewards_sandbox_policy.py, not of these tests
pytestmark = pytest.mark.filterwarnings("ignore:.*WEAK 'subprocess' sandbox:RuntimeWarning")
BWRAP_OK = shutil.which("bwrap") is not None and _environment().bwrap_status()[0]
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason="bubblewrap is not usable here")
IS_ROOT = os.geteuid() == 0
# the sandbox runs as uid 65534 outside too (root caller, interpreter readable by 65534)
DROPS_PRIVILEGES = _environment().run_as()[0] is not None
BACKENDS = [pytest.param("bwrap", marks=needs_bwrap), "subprocess"]


def _processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (a pid scan of /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _wait_until_gone(marker: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = _processes_with(marker)
        if not left:
            return []
        time.sleep(0.1)
    return _processes_with(marker)


def test_bwrap_is_available_when_required() -> None:
    # CI sets GMTS_REQUIRE_BWRAP=1 so that a runner without working bubblewrap fails loudly
    # instead of skipping every bwrap test
    if os.environ.get("GMTS_REQUIRE_BWRAP") != "1":
        pytest.skip("GMTS_REQUIRE_BWRAP is not set")
    works, reason = _environment().bwrap_status()
    assert works, f"bubblewrap is required but unusable: {reason}"


# ----------------------------------------------------------------------------- positive controls


@pytest.mark.parametrize("backend", BACKENDS)
def test_correct_program_passes_and_wrong_fails(backend: str) -> None:
    program = "def add(a, b):\n    return a + b\n"
    assert code_reward(program, "assert add(2, 3) == 5", backend=backend) == 1.0
    assert code_reward(program, "assert add(2, 3) == 6", backend=backend) == 0.0
    assert code_reward("def add(a, b) return", "assert add(1, 1) == 2", backend=backend) == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("escape", ["import sys; sys.exit(0)", "import os; os._exit(0)", "exit()"])
def test_exiting_early_with_status_zero_does_not_pass(backend: str, escape: str) -> None:
    # the tests after the program would fail; exiting before them must not count as a pass
    result = run_sandboxed(escape + "\nassert False\n", backend=backend)
    assert result.returncode == 0 and not result.passed


@pytest.mark.parametrize("backend", BACKENDS)
def test_result_record_holds_output_tails(backend: str) -> None:
    result = run_sandboxed(
        "print('hello')\nimport sys\nprint('oops', file=sys.stderr)", backend=backend
    )
    assert result.passed and not result.timed_out and result.returncode == 0
    assert result.stdout == "hello\n" and result.stderr == "oops\n"
    assert result.backend == backend


def test_bad_arguments_raise_before_running() -> None:
    with pytest.raises(ValueError, match="timeout"):
        run_sandboxed("pass", timeout=0)
    with pytest.raises(ValueError, match="backend"):
        run_sandboxed("pass", backend="docker")
    with pytest.raises(ValueError, match="memory_mb"):
        run_sandboxed("pass", memory_mb=1)
    with pytest.raises(ValueError, match="tests"):
        code_reward("pass", None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- hostile programs


@pytest.mark.parametrize("backend", BACKENDS)
def test_infinite_loop_is_killed_at_the_timeout(backend: str) -> None:
    start = time.monotonic()
    result = run_sandboxed("while True:\n    pass\n", timeout=1.5, backend=backend)
    assert result.timed_out and not result.passed
    assert time.monotonic() - start < 1.5 + 5.0  # killed, not waited for


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_bomb_stops_at_the_process_limit(backend: str) -> None:
    if IS_ROOT and not DROPS_PRIVILEGES:
        pytest.skip("the sandbox runs as root here, for whom RLIMIT_NPROC is not enforced")
    if backend == "subprocess" and not DROPS_PRIVILEGES:
        pytest.skip("the fallback's process limit is shared with this user's other processes")
    marker = f"gmts-forkbomb-{uuid.uuid4().hex}"
    # bounded: even in a broken sandbox this makes at most 200 sleeping processes
    program = f"""
import os, sys, time
for _ in range(200):
    pid = os.fork()  # raises BlockingIOError once RLIMIT_NPROC is reached
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", "{marker}"])
"""
    result = run_sandboxed(program, timeout=10, max_processes=16, backend=backend)
    assert not result.passed
    assert "BlockingIOError" in result.stderr or "Resource temporarily unavailable" in result.stderr
    assert _wait_until_gone(marker) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_hog_gets_memory_error(backend: str) -> None:
    program = "hog = bytearray(2 * 1024**3)\nhog[::4096] = b'x' * len(hog[::4096])\n"
    result = run_sandboxed(program, memory_mb=256, backend=backend)
    assert not result.passed and "MemoryError" in result.stderr


@needs_bwrap
def test_network_connection_to_a_local_listener_fails() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    connections: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            connections.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    program = f"""
import socket
sock = socket.create_connection(("127.0.0.1", {port}), timeout=3)
sock.sendall(b"escaped")
"""
    try:
        assert code_reward(program, "", backend="bwrap") == 0.0
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert connections == []


def test_fallback_does_not_isolate_the_network() -> None:
    # a documented weakness of the fallback (docs/rewards.md): keep the docs honest
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        assert code_reward(program, "", backend="subprocess") == 1.0
    finally:
        listener.close()


@needs_bwrap
def test_writes_outside_the_sandbox_do_not_appear(tmp_path: Path) -> None:
    open_dir = Path(tempfile.mkdtemp(prefix="gmts-world-writable-"))
    try:
        os.chmod(open_dir, 0o777)  # even a folder anyone may write to stays untouched
        targets = [tmp_path / "escaped.txt", open_dir / "escaped.txt"]
        program = "".join(f"open({str(t)!r}, 'w').write('escaped')\n" for t in targets)
        assert code_reward(program, "", backend="bwrap") == 0.0
        # and the program cannot create the path first either
        program = "import os\n" + "".join(
            f"os.makedirs({str(t.parent)!r}, exist_ok=True)\nopen({str(t)!r}, 'w').write('x')\n"
            for t in targets
        )
        run_sandboxed(program, backend="bwrap")
        assert not any(t.exists() for t in targets)
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_writes_to_the_repository_and_test_folder_fail(backend: str, tmp_path: Path) -> None:
    if backend == "subprocess" and not DROPS_PRIVILEGES:
        pytest.skip("the fallback runs as this user, who may write these folders")
    repo_file = Path(__file__).resolve().parents[2] / f"escaped-{uuid.uuid4().hex}.txt"
    target = tmp_path / "escaped.txt"
    for path in (repo_file, target):
        assert code_reward(f"open({str(path)!r}, 'w').write('x')\n", "", backend=backend) == 0.0
        assert not path.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_parent_environment_is_not_readable(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "subprocess" and not DROPS_PRIVILEGES:
        pytest.skip("the fallback runs as this user, who may read /proc/<parent>/environ")
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("GMTS_TEST_SECRET", secret)
    program = f"""
import os
found = any("{secret[:6]}" in value for value in os.environ.values())
for pid in [os.getppid(), 1, {os.getpid()}] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    try:
        found = found or b"{secret[:6]}" in open(f"/proc/{{pid}}/environ", "rb").read()
    except OSError:
        pass
if not found:
    raise SystemExit("secret not found")
print("found the secret")
"""
    result = run_sandboxed(program, backend=backend)
    assert not result.passed and "found the secret" not in result.stdout
    assert "GMTS_TEST_SECRET" not in result.stdout + result.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_killing_the_parent_fails(backend: str) -> None:
    if backend == "subprocess" and not DROPS_PRIVILEGES:
        pytest.skip("the fallback runs as this user, who may signal this process")
    program = f"""
import os, signal
os.kill(os.getppid(), signal.SIGKILL)
os.kill({os.getpid()}, signal.SIGKILL)  # this test process
"""
    assert code_reward(program, "", backend=backend) == 0.0
    assert code_reward("pass", "", backend=backend) == 1.0  # the sandbox machinery still works


@pytest.mark.parametrize("backend", BACKENDS)
def test_child_left_running_after_the_timeout_is_killed(backend: str) -> None:
    marker = f"gmts-orphan-{uuid.uuid4().hex}"
    # the fallback only kills the process group: its child stays in it; bwrap gets a harder case
    new_session = backend == "bwrap"
    program = f"""
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{marker}"],
                 start_new_session={new_session})
while True:
    pass
"""
    result = run_sandboxed(program, timeout=2, backend=backend)
    assert result.timed_out and not result.passed
    assert _wait_until_gone(marker) == []


@needs_bwrap
def test_daemon_left_behind_by_a_finished_program_is_killed() -> None:
    marker = f"gmts-daemon-{uuid.uuid4().hex}"
    program = f"""
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{marker}"],
                 start_new_session=True)
"""
    assert run_sandboxed(program, backend="bwrap").passed
    assert _wait_until_gone(marker) == []


@needs_bwrap
def test_sandbox_is_unprivileged_and_isolated() -> None:
    program = """
import os, socket
assert os.getuid() == 65534 and os.getgid() == 65534
assert os.getcwd() == "/tmp" and os.listdir("/tmp") == []
assert sorted(os.environ) == ["HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED"]
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
assert max(pids) < 10, pids  # a fresh pid namespace
assert [name for _, name in socket.if_nameindex()] == ["lo"]
"""
    result = run_sandboxed(program, backend="bwrap")
    assert result.passed, result.stderr
