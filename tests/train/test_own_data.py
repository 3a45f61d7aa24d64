"""A user's own data: held-out evaluation on data.eval_dataset, the tokenizer's alphabet checked
before training, and the warning when the first steps carry no learning signal."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from gmts.train.collect import AnswerSample, CollectedBatch, RolloutStats
from gmts.train.config import load_config
from gmts.train.signal_watch import ZeroSignalWarning, ZeroSignalWatch
from gmts.train.trainer import Trainer

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _sums(a: int, b: int) -> list[dict]:
    return [{"q": f"{x}+{y}=", "a": str(x + y)} for x in range(a, b) for y in (3, 4)]


def _dataset_run(tiny_dir: Path, run: Path, train: Path, *overrides: str):
    return _tiny.small_config(
        tiny_dir,
        run,
        f"data.dataset={train}",
        "data.question_field=q",
        "data.answer_field=a",
        "data.template=null",
        "rollout.max_response_length=4",
        *overrides,
    )


def test_eval_dataset_reports_held_out_average_at_k(tiny_dir: Path, tmp_path: Path) -> None:
    """The first data.eval_questions questions of the eval file, k samples each, before
    training, every data.eval_every steps and after: eval.jsonl rows as the task's. A reward
    that reads only the gold makes the expected numbers known exactly."""
    train = _jsonl(tmp_path / "train.jsonl", _sums(10, 30))
    held = _jsonl(tmp_path / "held.jsonl", [{"q": "1+2=", "a": "3"}, {"q": "2+2=", "a": "4"},
                                            {"q": "5+8=", "a": "13"}, {"q": "1+1=", "a": "2"}])  # fmt: skip
    cfg = _dataset_run(
        tiny_dir, tmp_path / "run", train, f"data.eval_dataset={held}",
        "data.eval_questions=3", "data.eval_samples=2", "data.eval_every=1",
    )  # fmt: skip

    def gold_ends_in_3(completion: str, answer: str) -> float:
        return 1.0 if answer.endswith("3") else 0.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ZeroSignalWarning)  # this reward has no signal
        result = Trainer(cfg, reward_fn=gold_ends_in_3).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2]
    for row in rows:  # questions 1+2=, 2+2=, 5+8=: two of three golds end in 3
        assert row == {"step": row["step"], "average@2": 2 / 3, "pass@2": 2 / 3, "questions": 3.0}
    assert result.eval_after == {"average@2": 2 / 3, "pass@2": 2 / 3, "questions": 3.0}


def test_eval_temperature_reaches_the_held_out_sampler(tiny_dir: Path, tmp_path: Path) -> None:
    """data.eval_temperature=0 samples the held-out questions greedily (every one of a
    question's k answers the same); the default 1.0 samples (a random tiny model's answers
    differ)."""
    train = _jsonl(tmp_path / "train.jsonl", _sums(10, 14))
    held = _jsonl(tmp_path / "held.jsonl", [{"q": f"{i}+1=", "a": str(i + 1)} for i in range(3)])
    answers_by_temperature = {}
    for temperature in (0.0, 1.0):
        seen: dict[str, set[str]] = {}

        def record(completion: str, answer: str, seen: dict[str, set[str]] = seen) -> float:
            seen.setdefault(answer, set()).add(completion)
            return 0.0

        cfg = _dataset_run(
            tiny_dir, tmp_path / f"run{temperature}", train, f"data.eval_dataset={held}",
            "data.eval_questions=3", "data.eval_samples=6", f"data.eval_temperature={temperature}",
        )  # fmt: skip
        Trainer(cfg, reward_fn=record).evaluate()
        answers_by_temperature[temperature] = seen
    assert sorted(answers_by_temperature[0.0]) == ["1", "2", "3"]
    assert all(len(c) == 1 for c in answers_by_temperature[0.0].values())
    assert any(len(c) > 1 for c in answers_by_temperature[1.0].values())
    with pytest.raises(ValueError, match="data.eval_temperature: must be >= 0"):
        load_config(None, ["data.eval_temperature=-0.5"])


def test_eval_dataset_errors_name_the_key(tiny_dir: Path, tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "train.jsonl", _sums(10, 12))
    with pytest.raises(ValueError, match="data.eval_dataset: needs data.dataset"):
        load_config(None, ["data.eval_dataset=x.jsonl"])
    cfg = _dataset_run(tiny_dir, tmp_path / "r", train, "data.eval_dataset=/no/such.jsonl")
    with pytest.raises(ValueError, match="data.eval_dataset: '/no/such.jsonl' is neither"):
        Trainer(cfg, reward_fn=_tiny.partial_credit)


def test_characters_the_tokenizer_cannot_encode_fail_before_the_model_loads(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gmts.train.policy as policy_module

    def no_weights(**_):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(policy_module, "load_policy", no_weights)
    words = _jsonl(tmp_path / "words.jsonl", [{"q": "What is 2+2?", "a": "4"}])
    with pytest.raises(ValueError) as caught:
        Trainer(_dataset_run(tiny_dir, tmp_path / "r1", words), reward_fn=_tiny.partial_credit)
    message = str(caught.value)
    assert message.startswith("data.dataset: the model's tokenizer cannot encode")
    assert "'0123456789+-*=>'" in message and "\n" not in message
    assert "' ?Wahist'" in message  # exactly the characters it cannot encode, sorted
    # the math template's instruction is text too: plain digits do not help with it
    digits = _jsonl(tmp_path / "digits.jsonl", _sums(10, 12))
    cfg = _dataset_run(tiny_dir, tmp_path / "r2", digits, "data.template=math")
    with pytest.raises(ValueError, match="cannot encode"):
        Trainer(cfg, reward_fn=_tiny.partial_credit)
    # an answer the model could never write
    boxed = _jsonl(tmp_path / "boxed.jsonl", [{"q": "2+2=", "a": "\\boxed{4}"}])
    with pytest.raises(ValueError, match=r"'\\\\bdeox\{\}'"):
        Trainer(_dataset_run(tiny_dir, tmp_path / "r3", boxed), reward_fn=_tiny.partial_credit)
    held = _jsonl(tmp_path / "held.jsonl", [{"q": "two plus two", "a": "4"}])
    cfg = _dataset_run(
        tiny_dir, tmp_path / "r4", digits, f"data.eval_dataset={held}", "data.eval_questions=2"
    )
    with pytest.raises(ValueError, match="data.eval_dataset: the model's tokenizer"):
        Trainer(cfg, reward_fn=_tiny.partial_credit)


# --------------------------------------------------------------------------- zero signal


def _step(varied: float, reward_sum: float, answers: float = 8.0) -> CollectedBatch:
    stats = RolloutStats(
        answers=answers, reward_sum=reward_sum, raw_reward_sum=reward_sum, rewarded=0.0,
        length_sum=0.0, truncated=0.0, reward_errors=0.0, generated_groups=2.0,
        varied_groups=varied, topped_up_groups=0.0, response_tokens=0.0,
    )  # fmt: skip
    return CollectedBatch(None, stats, 1, AnswerSample("2+2=", "5", "4"))  # type: ignore[arg-type]


def test_zero_signal_watch_warns_once_after_the_watched_steps() -> None:
    watch = ZeroSignalWatch("data.reward=exact", "the answer itself", dynamic_sampling=False)
    assert watch.observe(_step(0, 0.0)) is None and watch.observe(_step(0, 0.0)) is None
    with pytest.warns(ZeroSignalWarning) as caught:
        message = watch.observe(_step(0, 0.0))
    assert len(caught) == 1 and message == str(caught[0].message)
    assert "every answer got reward 0 (24 answers)" in message
    assert "the reward (data.reward=exact) expects: the answer itself" in message
    assert "completion: '5'" in message and "gold:       '4'" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert watch.observe(_step(0, 0.0)) is None  # once


def test_zero_signal_watch_constant_rewards_and_a_signal() -> None:
    watch = ZeroSignalWatch("r", "x", dynamic_sampling=True, steps=1)
    with pytest.warns(ZeroSignalWarning, match="one same reward \\(mean 1.000\\)"):
        message = watch.observe(_step(0, 8.0))
    assert "Dynamic sampling dropped every group" in message
    quiet = ZeroSignalWatch("r", "x", dynamic_sampling=False, steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quiet.observe(_step(0, 0.0)) is None
        assert quiet.observe(_step(1, 1.0)) is None  # one group with a signal: never
        assert quiet.observe(_step(0, 0.0)) is None


def test_a_dataset_run_without_signal_warns_with_the_rewards_description(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """The tiny model cannot write \\boxed{} (its tokenizer has no letters): the format
    reward is 0 for every answer, and the run says so after its first steps."""
    from gmts.rewards.registry import reward_description

    train = _jsonl(tmp_path / "train.jsonl", _sums(10, 20))
    cfg = _dataset_run(tiny_dir, tmp_path / "run", train, "data.reward=format", "algorithm=grpo")
    with pytest.warns(ZeroSignalWarning) as caught:
        Trainer(cfg).run()
    (warning,) = [w for w in caught if w.category is ZeroSignalWarning]  # (answers cut too)
    message = str(warning.message)
    assert "no learning signal in the first 2 step(s)" in message  # optim.steps=2
    assert f"expects: {reward_description('format')}" in message and "\\boxed" in message
    assert "prompt:     '1" in message  # a question of the file


def test_a_run_with_signal_does_not_warn(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = _tiny.small_config(tiny_dir, tmp_path / "run", "algorithm=grpo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = Trainer(cfg, reward_fn=_tiny.partial_credit).run()
    # the run had a signal (rewards differed within a group, so some tokens were selected) ...
    assert result.steps == cfg.optim.steps
    assert any(row["select/fraction"] > 0 for row in result.history)
    # ... and the watch said nothing
    assert not [w for w in caught if issubclass(w.category, ZeroSignalWarning)]


def test_every_registered_reward_says_what_it_expects() -> None:
    from gmts.rewards.registry import available_rewards, reward_description

    for name in available_rewards():
        assert reward_description(name), name


def test_the_embedded_model_checks_the_data_before_its_warm_start_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building the warm start takes minutes on first use: unreadable data fails first."""
    import gmts.embedded.warmstart as warmstart

    def never(*_, **__):
        raise AssertionError("the warm start was built before the data was checked")

    monkeypatch.setattr(warmstart, "warm_start", never)
    words = _jsonl(tmp_path / "words.jsonl", [{"problem": "What is 2+2?", "answer": "4"}])
    cfg = load_config(None, [f"data.dataset={words}", f"logging.output_dir={tmp_path / 'r'}"])
    with pytest.raises(ValueError, match="data.dataset: the model's tokenizer cannot encode"):
        Trainer(cfg)
