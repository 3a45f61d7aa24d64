"""Character tokenizer, tiny model config and the built-in tasks (answers and rewards by hand)."""

from __future__ import annotations

import random

import pytest

from gmts.embedded.tasks import Problem, Task, available_tasks, get_task, is_held_out, register_task
from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
from gmts.embedded.tokenizer import END_TOKEN, build_char_tokenizer


def test_tokenizer_one_token_per_character_and_round_trip(tmp_path):
    from transformers import AutoTokenizer

    tok = build_char_tokenizer()
    text = "037+485=225>522$"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "037+485=225>522"
    assert tok.eos_token == END_TOKEN and tok.eos_token_id == tok.pad_token_id
    assert ids[-1] == tok.eos_token_id
    assert tok("x", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids, skip_special_tokens=True) == "037+485=225>522"
    assert (loaded.eos_token_id, loaded.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert len(loaded) == len(tok)


def test_tokenizer_rejects_bad_alphabets():
    with pytest.raises(ValueError, match="repeated"):
        build_char_tokenizer("0012")
    with pytest.raises(ValueError, match="reserved"):
        build_char_tokenizer("01$")


def test_tiny_model_default_size_and_validation():
    tok = build_char_tokenizer()
    model = build_tiny_model(tok)
    n_params = sum(p.numel() for p in model.parameters())
    assert 350_000 < n_params < 450_000  # the calibrated ~0.4M prototype
    assert model.config.vocab_size == len(tok)
    again = build_tiny_model(tok)
    assert all((a == b).all() for a, b in zip(model.parameters(), again.parameters()))
    with pytest.raises(ValueError, match="divisible"):
        TinyModelConfig(hidden_size=130, num_heads=4)
    with pytest.raises(ValueError, match="architecture"):
        TinyModelConfig(architecture="bert")
    with pytest.raises(ValueError, match="num_layers"):
        TinyModelConfig(num_layers=0)


def test_addition_problems_by_hand():
    task = get_task("addition")
    problem = task.make_problem(37, 485)
    assert problem == Problem("037+485=", "225>522")
    assert task.make_problem(992, 88).answer == "0801>1080"  # reversed sum keeps its zero
    assert task.make_problem(10, 10).answer == "02>20"
    assert task.max_new_tokens == len("8991>1998") + 1  # 999 + 999, plus the end token
    mult = get_task("multiplication")
    assert mult.make_problem(37, 8) == Problem("37*08=", "692>296")
    rng = random.Random(0)
    for name in available_tasks():
        t = get_task(name)
        problems = t.sample(50, rng)
        assert {len(p.prompt) for p in problems} == {t.prompt_length}
        assert max(len(p.answer) for p in problems) < t.max_new_tokens


def test_reward_is_exact_match_and_not_gameable():
    task = get_task("addition")
    answer = "225>522"
    assert task.reward("225>522", answer) == 1.0
    assert task.reward("225>522$", answer) == 1.0
    assert task.reward("225>522$999", answer) == 1.0  # text after the end token is ignored
    for attempt in [
        "0225>0522",  # leading zeros: int() would accept these
        "225>0522",
        "225> 522",
        " 225>522",
        "225>522 ",
        "225",  # missing scratchpad
        "522",
        "225>5222",
        "",
        "$225>522",
        "225>52",
    ]:
        assert task.reward(attempt, answer) == 0.0, attempt


def test_held_out_is_disjoint_from_training_and_deterministic():
    task = get_task("addition")
    held = task.held_out(200)
    assert len(held) == 200 and len({p.prompt for p in held}) == 200
    assert all(is_held_out(p.prompt) for p in held)
    assert held == task.held_out(200)
    assert held != task.held_out(200, seed=7)
    held_prompts = {p.prompt for p in held}
    train = task.sample(5000, random.Random(1))
    assert not any(is_held_out(p.prompt) for p in train)
    assert not held_prompts & {p.prompt for p in train}
    # about 10% of all prompts are held out
    everything = [task.make_problem(a, b).prompt for a in range(10, 120) for b in range(10, 120)]
    share = sum(map(is_held_out, everything)) / len(everything)
    assert 0.08 < share < 0.12


def test_demonstration_noise():
    task = get_task("addition")
    problem = task.make_problem(37, 485)
    rng = random.Random(0)
    assert task.demonstration(problem, rng, noise=0.0) == "225>522"
    noisy = [task.demonstration(problem, rng, noise=1.0) for _ in range(200)]
    for demo in noisy:  # always well-formed: scratchpad is the reversal of the reversed digits
        first, second = demo.split(">")
        assert len(first) == 3 and first[::-1] == second
    assert sum(d == "225>522" for d in noisy) < 10
    half = [task.demonstration(problem, rng, noise=0.3) == "225>522" for _ in range(2000)]
    # P(all 3 digits kept or re-drawn equal) = (0.7 + 0.3 * 0.1) ** 3 = 0.389
    assert abs(sum(half) / len(half) - 0.389) < 0.05
    with pytest.raises(ValueError, match="noise"):
        task.demonstration(problem, rng, noise=1.5)


def test_registry_errors():
    with pytest.raises(ValueError, match="valid tasks"):
        get_task("subtraction")
    with pytest.raises(ValueError, match="already registered"):
        register_task(get_task("addition"))
    assert {"addition", "addition-long", "multiplication"} <= set(available_tasks())
    with pytest.raises(ValueError, match="operator"):
        Task("bad", "/", (1, 9), (1, 9), width=1)


def test_tasks_module_stays_light():
    import subprocess
    import sys

    # the package may import what it likes; the task registry itself adds no transformers import
    code = (
        "import sys, gmts.data; before = 'transformers' in sys.modules; import gmts.embedded.tasks; "
        "print(before, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = out.stdout.split()
    assert after == before
