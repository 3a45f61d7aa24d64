"""Run untrusted Python (model-written code plus its tests) in a sandbox, failing closed.

Two backends; the default is ``"bwrap"`` and there is no silent fallback:

``"bwrap"`` (Linux with bubblewrap, the default): the program runs in fresh namespaces (user,
pid, net, ipc, uts, cgroup: ``--unshare-all``) with the host root bound read-only, a private
size-capped tmpfs on ``/tmp`` and ``/dev/shm``, a new ``/proc`` showing only the sandbox's
processes, an empty network namespace (no interfaces but a loopback of its own), a new session,
all capabilities dropped, uid/gid 65534 inside, and an environment cleared down to
``PATH``/``HOME``/``LANG``. When this process runs as root, bubblewrap itself is started as uid
65534 so the program is unprivileged outside the user namespace too (it cannot read root-only
files). The sandbox dies with its parent (``--die-with-parent``), and since the program is not
pid 1 of its namespace, all its descendants die with it. Where bubblewrap is missing or fails
its probe run, :func:`check_sandbox` (called by every run) raises
:class:`SandboxUnavailableError` and the program never runs.

``"subprocess"`` (explicit opt-in only, warned about once per process): a plain child process
in its own session with a temporary working directory and a cleared environment, as uid 65534
when this process is root. It has no filesystem, network or pid isolation; see docs/rewards.md
for what that means. Chosen by ``backend="subprocess"`` (``data.sandbox=subprocess`` for
``gmts train``, ``--sandbox subprocess`` for ``gmts eval``) or ``GMTS_SANDBOX=subprocess``.

Both: before any untrusted code runs, a small trusted runner sets resource limits (CPU seconds,
address space, file size, process count, open files, no core files) that the program cannot
raise again; the parent kills the whole process group (and thereby the pid namespace) at the
wall-clock timeout. The program and a random nonce come in through a file on stdin, output goes
to files capped by the file-size limit. A run *passes* only if the program returned normally,
exit status 0, and the runner printed the nonce after it: ``sys.exit(0)`` or ``os._exit(0)``
before the tests cannot fake a pass.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("bwrap", "subprocess")
"""Sandbox backends: ``"bwrap"`` (the default) and the weaker ``"subprocess"`` (opt-in only)."""
SANDBOX_ENV = "GMTS_SANDBOX"
"""Environment variable naming the backend when no argument does (unset: ``"bwrap"``)."""
_MIN_TMPFS_BYTES = 64 * 1024**2  # size of the sandbox's private /tmp and /dev/shm
SANDBOX_UID = 65534  # "nobody" on Debian and most distributions
_MINIMAL_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}

# The trusted part that runs inside the sandbox before the program (stdlib only).
# argv: cpu_seconds, address_space_bytes, file_size_bytes, max_processes, max_open_files
_RUNNER = r"""
import os, resource, sys
def _gmts_runner():
    data = sys.stdin.buffer.read()
    nonce, _, source = data.partition(b"\n")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    cpu, address_space, file_size, processes, open_files = (int(a) for a in sys.argv[1:6])
    limits = [
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (address_space, address_space)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_NPROC, (processes, processes)),
        (resource.RLIMIT_NOFILE, (open_files, open_files)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in limits:
        if value[0] >= 0:
            resource.setrlimit(which, value)
    marker = os.dup(1)
    del data, cpu, address_space, file_size, processes, open_files, limits
    sys.argv = ["program.py"]
    code = compile(source.decode("utf-8", "replace"), "program.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(marker, b"\n" + nonce + b"\n")
    os._exit(0)
_gmts_runner()
"""


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run.

    passed: ran to the end (exit 0, runner's nonce seen) within the time limit.
    timed_out: killed at the wall-clock timeout.
    returncode: exit status (negative: killed by that signal), None if never started.
    stdout, stderr: the last ``tail_chars`` characters of each stream (nonce removed).
    backend: "bwrap" or "subprocess".
    duration_s: wall-clock seconds of the run.
    """

    passed: bool
    timed_out: bool
    returncode: int | None
    stdout: str
    stderr: str
    backend: str
    duration_s: float


class SandboxUnavailableError(RuntimeError):
    """The bubblewrap sandbox is required (the default) but does not work here.

    Raised before the program starts: nothing ran. The message says why, how to install
    bubblewrap, and the three ways to opt in to the weaker ``"subprocess"`` backend.
    """


# ----------------------------------------------------------------------------- environment probes


def _world_accessible(path: str | os.PathLike) -> bool:
    """Whether a user with no special rights can traverse to and read/execute ``path``."""
    real = Path(os.path.realpath(path))
    try:
        for parent in reversed(real.parents):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(real).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        return bool(mode & stat.S_IXOTH and mode & stat.S_IROTH)
    return bool(mode & stat.S_IROTH)


def _python_usable_by_others(executable: str) -> bool:
    """The interpreter binary and its standard library can be read by an unprivileged uid."""
    if not _world_accessible(executable):
        return False
    if os.path.realpath(executable) == os.path.realpath(sys.executable):
        return _world_accessible(sys.base_prefix) and _world_accessible(os.__file__)
    return True  # a system interpreter: its prefix is a system directory


def _choose_python(drop_privileges: bool) -> str:
    """Interpreter for the sandbox: ours if the sandbox uid can run it, else a system python3."""
    if not drop_privileges or _python_usable_by_others(sys.executable):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(candidate) and _world_accessible(candidate):
            return candidate
    return ""


class _Environment:
    """What this machine offers, probed once per process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # bwrap_status -> _probe_bwrap -> run_as re-enter it
        self._bwrap: tuple[bool, str] | None = None
        self.bwrap_path = ""  # the binary the probe ran, used for every later run
        self._warned = False
        self._warned_root = False
        self.is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self.python_for_nobody = _choose_python(self.is_root)

    def run_as(self) -> tuple[int | None, str]:
        """(uid to start the sandbox as, or None for ours; interpreter path)."""
        if self.is_root and self.python_for_nobody:
            return SANDBOX_UID, self.python_for_nobody
        if self.is_root:
            with self._lock:
                warn, self._warned_root = not self._warned_root, True
            if warn:
                warnings.warn(
                    "gmts.rewards: no Python interpreter that uid 65534 can run was found, so the "
                    "code sandbox runs as root (mapped to 65534 inside bubblewrap): the process-count "
                    "limit is not enforced for root and root-only files are readable. Install a "
                    "system python3 (/usr/bin/python3) or run as a non-root user.",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return None, sys.executable

    def bwrap_status(self) -> tuple[bool, str]:
        """(bubblewrap works here, why not)."""
        with self._lock:
            if self._bwrap is None:
                self._bwrap = _probe_bwrap(self)
            return self._bwrap

    def warn_weak(self, source: str) -> None:
        """Warn, once per process, that untrusted code runs in the weak backend by choice."""
        with self._lock:
            if self._warned:
                return
            self._warned = True
        warnings.warn(
            f"gmts.rewards: running untrusted model-written code in the WEAK 'subprocess' sandbox "
            f"({source}). It sets resource limits, a temporary working directory and a clean "
            "environment, and NOTHING else: NO filesystem, network or process isolation. The "
            "program can write wherever its uid may (e.g. the host's /tmp), read the caller's "
            "files, connect to services on the host and the network, and leave processes "
            "running. Use it only on a machine you can afford to lose; install bubblewrap and "
            "drop the opt-in to get the real sandbox (docs/rewards.md).",
            RuntimeWarning,
            stacklevel=4,
        )


def _bwrap_supports_size(bwrap: str) -> bool:
    try:
        help_text = subprocess.run(
            [bwrap, "--help"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--size" in help_text


def _probe_bwrap(environment: _Environment) -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"not Linux ({sys.platform})"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, "no `bwrap` on PATH"
    environment.bwrap_path = bwrap
    uid, python = environment.run_as()
    command = _bwrap_command(bwrap, python, _bwrap_supports_size(bwrap), _MIN_TMPFS_BYTES)
    command += [python, "-I", "-c", "print('ok')"]
    try:
        probe = subprocess.run(
            command, capture_output=True, text=True, timeout=60, user=uid, group=uid,
            extra_groups=[] if uid is not None else None,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        return False, f"bwrap failed to start: {error}"
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        return False, f"bwrap test run failed: {probe.stderr.strip()[-300:]}"
    return True, ""


_ENVIRONMENT: _Environment | None = None
_ENVIRONMENT_LOCK = threading.Lock()


def _environment() -> _Environment:
    global _ENVIRONMENT
    with _ENVIRONMENT_LOCK:
        if _ENVIRONMENT is None:
            _ENVIRONMENT = _Environment()
        return _ENVIRONMENT


# ----------------------------------------------------------------------------- commands


def _hidden_dirs(python: str) -> list[str]:
    """Home directories to cover with an empty tmpfs, unless the interpreter lives in them."""
    keep_paths = [python]
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        keep_paths += [sys.prefix, sys.base_prefix]
    keep = [os.path.realpath(path) for path in keep_paths]
    hidden = []
    for folder in ("/root", "/home", os.path.expanduser("~")):
        real = os.path.realpath(folder)
        if real in hidden or not os.path.isdir(real) or real == "/":
            continue
        if any(path == real or path.startswith(real + os.sep) for path in keep):
            continue
        hidden.append(real)
    return hidden


def _bwrap_command(bwrap: str, python: str, sized_tmpfs: bool, tmpfs_bytes: int) -> list[str]:
    size = ["--size", str(tmpfs_bytes)] if sized_tmpfs else []
    command = [
        bwrap,
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        *size, "--tmpfs", "/tmp",
        *size, "--tmpfs", "/dev/shm",
    ]  # fmt: skip
    for folder in _hidden_dirs(python):
        command += ["--tmpfs", folder]
    command += [
        "--unshare-all",  # user, ipc, pid, net, uts, cgroup namespaces
        "--die-with-parent",
        "--new-session",
        "--cap-drop", "ALL",
        "--uid", str(SANDBOX_UID),
        "--gid", str(SANDBOX_UID),
        "--chdir", "/tmp",
        "--clearenv",
    ]  # fmt: skip
    for name, value in _MINIMAL_ENV.items():
        command += ["--setenv", name, value]
    return command


def _count_processes_of(uid: int) -> int | None:
    """Processes currently owned by ``uid`` (the fallback's RLIMIT_NPROC counts them all);
    None where there is no /proc to count them in."""
    if not os.path.isdir("/proc"):
        return None
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += 1
    return count


def _tail(path: Path, tail_chars: int, nonce: str = "") -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 4 * tail_chars - len(nonce) - 2))
        text = handle.read().decode("utf-8", errors="replace")
    if nonce:
        text = text.replace("\n" + nonce + "\n", "")
    return text[-tail_chars:] if tail_chars > 0 else ""


def _ends_with(path: Path, suffix: bytes) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() < len(suffix):
            return False
        handle.seek(-len(suffix), os.SEEK_END)
        return handle.read() == suffix


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


# ----------------------------------------------------------------------------- public API


def _requested_backend(backend: str | None) -> tuple[str, str]:
    """(backend, what chose it): the argument, else ``$GMTS_SANDBOX``, else ``"bwrap"``."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(
                f"backend must be one of {BACKENDS} (or None: ${SANDBOX_ENV}, else 'bwrap'), "
                f"got {backend!r}"
            )
        return backend, f"backend={backend!r}"
    value = os.environ.get(SANDBOX_ENV, "").strip()
    if not value:
        return "bwrap", "the default"
    if value not in BACKENDS:
        raise ValueError(
            f"environment variable {SANDBOX_ENV}={value!r}: expected one of {BACKENDS}, or unset "
            "it for the default (bwrap)"
        )
    return value, f"{SANDBOX_ENV}={value}"


def _unavailable_message(reason: str, installed: bool) -> str:
    if installed:
        why = f"bubblewrap is installed but failed its test run ({reason})."
        fix = (
            "bubblewrap needs unprivileged user namespaces, which a container's default seccomp "
            "profile (Docker) or a host setting (sysctl user.max_user_namespaces=0; "
            "kernel.apparmor_restrict_unprivileged_userns=1 on recent Ubuntu) can forbid: allow "
            "them."
        )
    else:
        why = f"bubblewrap is not available ({reason})."
        fix = (
            "install it: apt-get install bubblewrap (Debian/Ubuntu), dnf install bubblewrap "
            "(Fedora/RHEL), pacman -S bubblewrap (Arch)."
        )
    return (
        "gmts.rewards: refusing to run model-written code: the bubblewrap sandbox (the default "
        "backend) does not work on this machine, so nothing ran.\n"
        f"Why: {why}\n"
        f"Fix: {fix}\n"
        "Or accept the WEAKER 'subprocess' sandbox explicitly (resource limits only; NO "
        "filesystem, network or process isolation: the program can write the host's temp dirs, "
        "reach services on the host and leave processes behind), in one of three ways:\n"
        "  - function argument: code_reward(..., backend='subprocess'), run_sandboxed(..., "
        "backend='subprocess'), get_reward('code', sandbox='subprocess')\n"
        "  - config / command line: data.sandbox=subprocess for `gmts train`; --sandbox "
        "subprocess for `gmts eval`\n"
        f"  - environment variable: {SANDBOX_ENV}=subprocess\n"
        "See docs/rewards.md, 'The code sandbox'."
    )


def check_sandbox(backend: str | None = None) -> str:
    """The backend that code will run in, after checking that it can; call it before any
    expensive work (``gmts train`` and ``gmts eval`` do, before loading a model).

    Args:
        backend: ``"bwrap"`` or ``"subprocess"``; None reads ``$GMTS_SANDBOX`` and defaults to
            ``"bwrap"``. An argument wins over the environment variable.

    Returns:
        ``"bwrap"`` or ``"subprocess"``.

    Raises:
        SandboxUnavailableError: bubblewrap was chosen (or defaulted to) and is missing or fails
            its probe run here (probed once per process). The message says how to install it
            and how to opt in to the weaker backend instead.
        ValueError: an unknown backend name (argument or environment variable).

    Choosing ``"subprocess"`` warns once per process (a RuntimeWarning) about what it does not
    isolate.
    """
    chosen, source = _requested_backend(backend)
    environment = _environment()
    if chosen == "subprocess":
        environment.warn_weak(source)
        return chosen
    works, reason = environment.bwrap_status()
    if not works:
        installed = bool(environment.bwrap_path)  # found on PATH (Linux), then failed its probe
        raise SandboxUnavailableError(_unavailable_message(reason, installed))
    return chosen


def run_sandboxed(
    program: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 512,
    backend: str | None = None,
    max_processes: int = 32,
    max_file_mb: int = 16,
    tail_chars: int = 2000,
) -> SandboxResult:
    """Run Python source ``program`` in a sandbox and report what happened.

    Args:
        program: Python source (the candidate solution followed by its tests).
        timeout: wall-clock seconds before the whole sandbox is killed; the CPU-time limit is
            ``ceil(timeout) + 1`` seconds per process.
        memory_mb: address-space limit per process, in MiB.
        backend: "bwrap" or "subprocess" (the weaker backend: explicit opt-in, warned about
            once per process); None: ``$GMTS_SANDBOX``, else "bwrap". See `check_sandbox`:
            where bubblewrap does not work, SandboxUnavailableError is raised and nothing runs.
        max_processes: RLIMIT_NPROC for the sandboxed program (fork bombs stop there).
        max_file_mb: largest file the program may write (also caps its captured output).
        tail_chars: how much of stdout/stderr to keep in the result.
    """
    _check_limits(program, timeout, memory_mb, max_processes, max_file_mb)
    chosen = check_sandbox(backend)  # fails closed: raises before anything runs
    environment = _environment()
    uid, python = environment.run_as()
    file_bytes = max_file_mb * 1024**2
    runner_args = _runner_limits(chosen, uid, timeout, memory_mb, file_bytes, max_processes)
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="gmts-sandbox-") as private:
        private_dir = Path(private)
        workdir = _private_files(private_dir, nonce, program, uid)
        command, cwd, env = _command(chosen, environment, python, runner_args, workdir, file_bytes)
        start = time.monotonic()
        with (
            open(private_dir / "stdin", "rb") as stdin,
            open(private_dir / "stdout", "wb") as stdout,
            open(private_dir / "stderr", "wb") as stderr,
        ):
            try:
                process = subprocess.Popen(
                    command, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env,
                    start_new_session=True, user=uid, group=uid,
                    extra_groups=[] if uid is not None else None, close_fds=True,
                )  # fmt: skip
            except OSError as error:
                return SandboxResult(False, False, None, "", str(error), chosen, 0.0)
            timed_out = False
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(process)  # also reaps leftovers of a program that exited
                process.wait()
        duration = time.monotonic() - start
        nonce_seen = _ends_with(private_dir / "stdout", ("\n" + nonce + "\n").encode())
        stdout_tail = _tail(private_dir / "stdout", tail_chars, nonce)
        stderr_tail = _tail(private_dir / "stderr", tail_chars)
    passed = nonce_seen and not timed_out and process.returncode == 0
    return SandboxResult(
        passed=passed,
        timed_out=timed_out,
        returncode=process.returncode,
        stdout=stdout_tail,
        stderr=stderr_tail,
        backend=chosen,
        duration_s=duration,
    )


def _runner_limits(
    chosen: str, uid: int | None, timeout: float, memory_mb: int, file_bytes: int, processes: int
) -> list[str]:
    """The runner's resource limits, as its arguments: CPU seconds, address space, file size,
    processes, open files. Under "subprocess" RLIMIT_NPROC counts every process of the real
    uid, so the ones it already has are added (-1, left unset, where they cannot be counted)."""
    if chosen == "subprocess":
        # RLIMIT_NPROC counts every process of the real uid, not just the sandbox's
        existing = _count_processes_of(uid if uid is not None else os.getuid())
        processes = -1 if existing is None else processes + existing  # -1: leave it unset
    return [
        str(math.ceil(timeout) + 1),
        str(memory_mb * 1024**2),
        str(file_bytes),
        str(processes),
        "256",
    ]


def _private_files(private_dir: Path, nonce: str, program: str, uid: int | None) -> Path:
    """Write the runner's stdin (``nonce``, then ``program``) into ``private_dir`` and make the
    program's working folder ``work/`` (owned by the sandbox uid, which may enter nothing
    else); returns that folder."""
    (private_dir / "stdin").write_bytes(nonce.encode() + b"\n" + program.encode("utf-8"))
    workdir = private_dir / "work"
    workdir.mkdir()
    if uid is not None:
        os.chmod(private_dir, 0o711)  # the sandbox uid may enter work/, nothing else
        os.chown(workdir, uid, uid)
    return workdir


def _check_limits(
    program: str, timeout: float, memory_mb: int, max_processes: int, max_file_mb: int
) -> None:
    """Refuse a program that is not text and limits that could not hold, before anything runs."""
    if not isinstance(program, str):
        raise ValueError(f"program must be a str, got {type(program).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if memory_mb < 32:
        raise ValueError(
            f"memory_mb must be at least 32 (Python needs it to start), got {memory_mb}"
        )
    if max_processes < 1:
        raise ValueError(f"max_processes must be at least 1, got {max_processes}")
    if max_file_mb < 1:
        raise ValueError(f"max_file_mb must be at least 1, got {max_file_mb}")


def _command(
    chosen: str,
    environment: _Environment,
    python: str,
    runner_args: list[str],
    workdir: Path,
    file_bytes: int,
) -> tuple[list[str], str, dict[str, str]]:
    """(command, working directory, environment) that start the runner under ``chosen``: inside
    bubblewrap with a minimal environment, or as a plain process confined to ``workdir``."""
    python_command = [python, "-I", "-B", "-c", _RUNNER, *runner_args]
    if chosen == "bwrap":
        bwrap = environment.bwrap_path
        tmpfs_bytes = max(file_bytes, _MIN_TMPFS_BYTES)
        command = _bwrap_command(bwrap, python, _bwrap_supports_size_cached(bwrap), tmpfs_bytes)
        return command + python_command, "/", dict(_MINIMAL_ENV)
    env = dict(_MINIMAL_ENV, HOME=str(workdir), TMPDIR=str(workdir))
    return python_command, str(workdir), env


_SIZE_SUPPORT: dict[str, bool] = {}


def _bwrap_supports_size_cached(bwrap: str) -> bool:
    if bwrap not in _SIZE_SUPPORT:
        _SIZE_SUPPORT[bwrap] = _bwrap_supports_size(bwrap)
    return _SIZE_SUPPORT[bwrap]


def code_reward(
    program: str,
    tests: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 512,
    backend: str | None = None,
) -> float:
    """1.0 if ``program`` followed by ``tests`` runs to completion in the sandbox, else 0.0.

    ``tests`` is Python that raises (e.g. a failing ``assert``) when the program is wrong. See
    `run_sandboxed` for the limits and the backends (``backend=None``: ``$GMTS_SANDBOX``, else
    bubblewrap, which raises SandboxUnavailableError where it does not work) and
    `gmts.rewards.program` for HumanEval/MBPP assembly.
    """
    if not isinstance(tests, str):
        raise ValueError(f"tests must be a str, got {type(tests).__name__}")
    backend = check_sandbox(backend)  # refuse even for a program that would score 0 unrun
    if not isinstance(program, str):
        return 0.0
    result = run_sandboxed(
        program + "\n\n" + tests, timeout=timeout, memory_mb=memory_mb, backend=backend
    )
    return 1.0 if result.passed else 0.0
