"""``gmts train`` with a reward that runs code checks the sandbox before loading anything."""

from __future__ import annotations

import shutil

import pytest

import gmts.train.policy as policy
import gmts.train.run_parts as run_parts
import gmts.train.trainer as trainer
from gmts.cli import main
from gmts.rewards import SandboxUnavailableError, code_reward
from gmts.rewards.sandbox import _environment
from gmts.train.config import load_config
from gmts.train.sources import score_rewards

BWRAP_OK = shutil.which("bwrap") is not None and _environment().bwrap_status()[0]
CODE = ["data.dataset=mbpp", "data.reward=code", "data.template=code"]


class _ReachedTrainer(Exception):
    """The CLI got past its checks and called the trainer."""


@pytest.fixture
def fake_train(monkeypatch: pytest.MonkeyPatch) -> list:
    """Replace the trainer: record the config and stop (no model is built)."""
    calls: list = []

    def fake(cfg, **options):
        calls.append(cfg)
        raise _ReachedTrainer

    monkeypatch.setattr(trainer, "train", fake)
    return calls


def test_code_reward_without_bwrap_fails_before_the_trainer(
    no_bwrap: None, fake_train: list, tmp_path, capsys
) -> None:
    code = main(["train", *CODE, f"logging.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and fake_train == []
    assert err.startswith("gmts train: error: gmts.rewards: refusing to run model-written code")
    assert "apt-get install bubblewrap" in err and "data.sandbox=subprocess" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["config key", "environment"])
def test_explicit_weak_sandbox_reaches_the_trainer(
    how: str, no_bwrap: None, fake_train: list, monkeypatch, tmp_path
) -> None:
    overrides = [*CODE, f"logging.output_dir={tmp_path / 'run'}"]
    if how == "config key":
        overrides.append("data.sandbox=subprocess")
    else:
        monkeypatch.setenv("GMTS_SANDBOX", "subprocess")
    weak = pytest.warns(RuntimeWarning, match="WEAK 'subprocess' sandbox")
    with weak, pytest.raises(_ReachedTrainer):
        main(["train", *overrides])
    expected = "subprocess" if how == "config key" else None
    assert [cfg.data.sandbox for cfg in fake_train] == [expected]


def test_rewards_that_run_no_code_need_no_sandbox(no_bwrap: None, fake_train: list) -> None:
    with pytest.raises(_ReachedTrainer):
        main(["train", "data.dataset=math12k", "data.reward=math"])
    with pytest.raises(_ReachedTrainer):  # data.reward applies to datasets only
        main(["train", "data.reward=code"])


@pytest.mark.skipif(not BWRAP_OK, reason="bubblewrap is not usable here")
def test_code_reward_with_bwrap_reaches_the_trainer(fake_train: list, monkeypatch) -> None:
    monkeypatch.delenv("GMTS_SANDBOX", raising=False)
    with pytest.raises(_ReachedTrainer):
        main(["train", *CODE])
    assert fake_train[0].data.sandbox is None


def test_trainer_itself_refuses_before_data_or_model(no_bwrap: None, monkeypatch) -> None:
    # the Python API (train(cfg)) fails closed too, before any dataset or model work
    def must_not_run(*args, **kwargs):
        raise AssertionError("data or model loading started")

    monkeypatch.setattr(run_parts, "load_examples", must_not_run)
    monkeypatch.setattr(policy, "resolve_model_path", must_not_run)  # model.path
    monkeypatch.setattr(run_parts, "load_tokenizer", must_not_run)
    monkeypatch.setattr(policy, "load_policy", must_not_run)  # the weights
    with pytest.raises(SandboxUnavailableError, match="data.sandbox=subprocess"):
        trainer.Trainer(load_config(None, CODE))


def test_sandbox_key_is_validated() -> None:
    assert load_config(None, ["data.sandbox=bwrap"]).data.sandbox == "bwrap"
    with pytest.raises(ValueError, match="data.sandbox"):
        load_config(None, ["data.sandbox=docker"])


def test_a_user_code_reward_without_sandbox_stops_the_run(no_bwrap: None) -> None:
    # reward errors normally score 0 and are counted; a missing sandbox must not become that
    def user_reward(completion: str, answer: str) -> float:
        return code_reward(completion, answer)

    with pytest.raises(SandboxUnavailableError):
        score_rewards(user_reward, ["x = 1"], ["assert x == 1"])
    assert score_rewards(lambda c, a: 1 / 0, ["x"], ["y"])[1] == 1  # other errors: counted
