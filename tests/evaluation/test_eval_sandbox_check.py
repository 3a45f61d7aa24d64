"""``gmts eval`` on a code benchmark checks the sandbox before loading data or a model."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import gmts.data.benchmarks as datasets
import gmts.eval.backends as backends
from gmts.cli import main
from gmts.eval.harness import EvalConfig, evaluate
from gmts.rewards import SandboxUnavailableError
from gmts.rewards.sandbox import _environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _text_sampler import TextSampler  # noqa: E402

BWRAP_OK = shutil.which("bwrap") is not None and _environment().bwrap_status()[0]


class _ReachedLoading(Exception):
    """The CLI got past its checks and started on the data files."""


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list:
    """Record and stop at the first data-file or model load."""
    calls: list = []

    def stop(*args, **kwargs):
        calls.append(args)
        raise _ReachedLoading

    monkeypatch.setattr(datasets, "read_benchmark", stop)  # what every benchmark load goes through
    monkeypatch.setattr(backends, "make_backend", stop)
    return calls


@pytest.fixture
def model_dir(tmp_path):
    """A folder that passes the model-path check (config.json); never loaded here."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path / "model"


def _eval(model_dir, tmp_path, *extra: str) -> int:
    return main(["eval", "--model", str(model_dir), "--out", str(tmp_path / "res.json"), *extra])


@pytest.mark.parametrize("benchmarks", ["humaneval", "mbpp", "math500,mbpp"])
def test_code_benchmark_without_bwrap_fails_before_loading(
    benchmarks: str, no_bwrap: None, loads: list, model_dir, tmp_path, capsys
) -> None:
    code = _eval(model_dir, tmp_path, "--benchmarks", benchmarks)
    err = capsys.readouterr().err
    assert code == 2 and loads == []
    assert err.startswith("gmts eval: error: gmts.rewards: refusing to run model-written code")
    assert "--sandbox subprocess" in err and "GMTS_SANDBOX=subprocess" in err
    assert not (tmp_path / "res.partial.jsonl").exists()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_explicit_weak_sandbox_gets_past_the_check(
    how: str, no_bwrap: None, loads: list, model_dir, tmp_path, monkeypatch
) -> None:
    extra = ["--benchmarks", "humaneval"]
    if how == "option":
        extra += ["--sandbox", "subprocess"]
    else:
        monkeypatch.setenv("GMTS_SANDBOX", "subprocess")
    weak = pytest.warns(RuntimeWarning, match="WEAK 'subprocess' sandbox")
    with weak, pytest.raises(_ReachedLoading):
        _eval(model_dir, tmp_path, *extra)


def test_benchmarks_without_code_need_no_sandbox(
    no_bwrap: None, loads: list, model_dir, tmp_path
) -> None:
    with pytest.raises(_ReachedLoading):
        _eval(model_dir, tmp_path, "--benchmarks", "math500,csqa")


def test_bad_sandbox_option_is_an_argparse_error(model_dir, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        _eval(model_dir, tmp_path, "--benchmarks", "humaneval", "--sandbox", "auto")
    assert "invalid choice: 'auto'" in capsys.readouterr().err


@pytest.mark.skipif(not BWRAP_OK, reason="bubblewrap is not usable here")
def test_code_benchmark_with_bwrap_gets_past_the_check(
    loads: list, model_dir, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("GMTS_SANDBOX", raising=False)
    with pytest.raises(_ReachedLoading):
        _eval(model_dir, tmp_path, "--benchmarks", "humaneval")


def test_evaluate_refuses_before_generating(no_bwrap: None, loads: list) -> None:
    class Backend(TextSampler):
        name = "never-called"
        calls: list = []

        def complete(self, prompts, **kwargs):
            self.calls.append(prompts)
            return [["x"] for _ in prompts]

    backend = Backend()
    with pytest.raises(SandboxUnavailableError):
        evaluate(backend, "math500,humaneval", EvalConfig(), progress=False)
    assert backend.calls == [] and loads == []
    with pytest.raises(ValueError, match="sandbox"):
        EvalConfig(sandbox="auto")
