"""Shared test setup: offline Hugging Face, paths to the shared benchmark data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Test files load helper files by path with ``from file_modules import load_module``
# (tests/file_modules.py); pytest's importlib import mode puts no test folder on sys.path.
# The tests folder is on sys.path only for this import: left there, its subfolders would
# import as namespace packages (tests/vllm as ``vllm`` where vLLM is not installed, so
# ``pytest.importorskip("vllm")`` would not skip). Later imports find the module in sys.modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import file_modules  # noqa: F401
finally:
    sys.path.pop(0)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GMTS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Folder of the real benchmark files (../shared/data); tests skip where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"benchmark data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine were
    measured 15-30x slower (contention). Tests that need more set it themselves."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for torchrun's rendezvous (no fixed ports: runs of
    the suite side by side must not collide)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A machine without bubblewrap: PATH is an empty folder, GMTS_SANDBOX is unset, and the
    code sandbox probes afresh (its once-per-process probe and warning start over)."""
    import gmts.rewards.sandbox as sandbox

    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty-path")))
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_ENVIRONMENT", None)


@pytest.fixture(scope="session")
def trusted_code_sandbox() -> str:
    """Sandbox backend for tests that run only trusted programs (canonical solutions, ours):
    bubblewrap where it works, and always with GMTS_REQUIRE_BWRAP=1 (CI), else the weaker
    backend, chosen explicitly as a user without bubblewrap would."""
    from gmts.rewards.sandbox import _environment

    if os.environ.get("GMTS_REQUIRE_BWRAP") == "1" or _environment().bwrap_status()[0]:
        return "bwrap"
    return "subprocess"


@pytest.fixture(scope="session")
def real_model() -> str:
    """The folder of the real pretrained model, smollm2-135m-instruct (gmts.models.named),
    converted once into $GMTS_CACHE (scripts/test.sh keeps one cache per checkout).

    Every environment the test script builds installs its package (scripts/setup.sh), so a
    missing package is a failure here, not a skip: the real-model tests must run in CI.
    """
    from gmts.models.loading import resolve_model_path

    return resolve_model_path("smollm2-135m-instruct")
