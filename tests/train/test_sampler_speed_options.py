"""The hf engine's speed settings, ``rollout.draw``, ``rollout.prepack_weights`` and
``rollout.drop_finished_rows``: the draws against the probabilities they sample from, the
settings reaching the sampler, their errors before any model loads, and the memory plan's count of the prepacked copy against the
linear weights of a real model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from gmts.sampling.draws import DRAWS
from gmts.sampling.packed_linear import can_prepack
from gmts.train.config import load_config

from file_modules import load_module

HERE = Path(__file__).resolve().parent
_tiny = load_module(HERE / "_tiny.py", "_tiny")


@pytest.mark.parametrize("name", DRAWS.names())
def test_each_draw_samples_the_given_probabilities(name):
    """20,000 draws from rows with zeros, a dominant token and a flat tail: every frequency
    within 5 standard errors of its probability, and no token of probability 0 ever drawn."""
    probs = torch.tensor(
        [
            [0.1, 0.0, 0.6, 0.3, 0.0],
            [0.0, 0.0, 0.0, 0.0, 1.0],
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.999, 0.0, 0.0, 0.0, 0.001],
        ]
    )
    n = 20_000
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(probs)
    for _ in range(n):
        tokens = DRAWS.get(name)(probs, gen, torch.arange(4), 4)
        assert tokens.shape == (4,) and tokens.dtype == torch.long
        counts[torch.arange(4), tokens] += 1
    freq = counts / n
    assert torch.all(counts[probs == 0] == 0)
    tolerance = 5 * torch.sqrt(probs * (1 - probs) / n) + 1e-12
    assert torch.all((freq - probs).abs() <= tolerance), (freq, probs)


def test_inverse_cdf_picks_the_token_whose_interval_holds_the_uniform():
    """Against a plain loop: with the same generator state, the token is the first whose
    running sum of probabilities exceeds u times the row's total."""
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(6, 300, generator=gen) * 4, dim=-1)
    state = gen.get_state()
    got = DRAWS.get("inverse_cdf")(probs, gen, torch.arange(6), 6)
    gen.set_state(state)
    u = torch.rand((6, 1), dtype=torch.float64, generator=gen)
    for row in range(6):
        p = probs[row].tolist()
        target = u[row, 0].item() * math.fsum(p)
        running, want = 0.0, len(p) - 1
        for k, value in enumerate(p):
            running += value
            if running > target:
                want = k
                break
        assert got[row].item() == want


def test_multinomial_draw_is_torch_multinomial():
    """Over random shapes (SmolLM2's vocabulary among them), probabilities with zeros and
    several steps: the multinomial draw gives ``torch.multinomial``'s tokens and leaves the
    generator where ``torch.multinomial`` leaves it."""
    rng = torch.Generator().manual_seed(0)
    for case in range(40):
        rows = int(torch.randint(1, 33, (1,), generator=rng))
        vocab = 49_152 if case % 8 == 0 else int(torch.randint(1, 2_000, (1,), generator=rng))
        logits = torch.randn(rows, vocab, generator=rng) * float(torch.rand(1, generator=rng) * 8)
        probs = torch.softmax(logits, dim=-1)
        if case % 3 == 0:
            probs[:, ::3] = 0.0
            probs[:, -1] += 1e-3  # no row left all zeros
            probs /= probs.sum(dim=-1, keepdim=True)
        ours = torch.Generator().manual_seed(case)
        torch_gen = torch.Generator().manual_seed(case)
        for _ in range(3):
            want = torch.multinomial(probs, 1, generator=torch_gen).squeeze(1)
            got = DRAWS.get("multinomial")(probs, ours, torch.arange(rows), rows)
            assert torch.equal(got, want), (case, rows, vocab)
        assert torch.equal(ours.get_state(), torch_gen.get_state())


@pytest.mark.parametrize("name", DRAWS.names())
def test_a_draw_for_some_rows_is_their_part_of_the_full_draw(name):
    """Rows 1, 4 and 5 of a batch of 7: the tokens those rows get when the whole batch draws,
    and the generator consumed as by the whole batch (whatever the other rows hold)."""
    gen = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(7, 500, generator=gen) * 3, dim=-1)
    rows = torch.tensor([1, 4, 5])
    full_gen, part_gen = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    draw = DRAWS.get(name)
    for _ in range(4):
        full = draw(probs, full_gen, torch.arange(7), 7)
        part = draw(probs[rows], part_gen, rows, 7)
        assert torch.equal(part, full[rows])
    assert torch.equal(full_gen.get_state(), part_gen.get_state())


def test_multinomial_draw_refuses_what_torch_multinomial_refuses():
    gen = torch.Generator().manual_seed(0)
    draw = DRAWS.get("multinomial")
    for bad in (float("nan"), float("inf"), -0.1):
        probs = torch.tensor([[0.5, 0.5], [bad, 0.5]])
        with pytest.raises(RuntimeError, match="inf`, `nan` or element < 0"):
            draw(probs, gen, torch.arange(2), 2)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        draw(torch.tensor([[0.0, 0.0]]), gen, torch.arange(1), 1)


def test_draw_reaches_the_sampler_and_is_seeded(tmp_path):
    """``generate_rollouts(draw=...)`` through the trainer's hf engine: the same seed gives the
    same tokens, another draw other tokens; an unknown draw names the valid ones."""
    from gmts.sampling.rollout import generate_rollouts

    model, tokenizer, problems, _ = _tiny_roll(tmp_path)
    kwargs = dict(num_samples=4, max_new_tokens=8, temperature=1.0, seed=3)
    first = generate_rollouts(model, tokenizer, problems, draw="inverse_cdf", **kwargs)
    again = generate_rollouts(model, tokenizer, problems, draw="inverse_cdf", **kwargs)
    other = generate_rollouts(model, tokenizer, problems, **kwargs)
    assert torch.equal(first.response_ids, again.response_ids)
    assert not torch.equal(first.response_ids, other.response_ids)
    engine_roll = _engine_roll(tmp_path, model, tokenizer, problems, "rollout.draw=inverse_cdf")
    assert torch.equal(engine_roll.response_ids, first.response_ids)
    with pytest.raises(ValueError, match="inverse_cdf"):
        generate_rollouts(model, tokenizer, problems, draw="gumbel", **kwargs)


@pytest.mark.skipif(not can_prepack("cpu"), reason="this torch build has no oneDNN")
def test_prepack_reaches_the_sampler(tmp_path, monkeypatch):
    """``rollout.prepack_weights=true`` samples inside :func:`prepacked_linears` (counted) and
    gives the unpacked tokens."""
    import gmts.sampling.rollout as rollout

    model, tokenizer, problems, _ = _tiny_roll(tmp_path)
    packed_calls = []
    real = rollout.prepacked_linears

    def counting(module, rows):
        packed_calls.append(rows)
        return real(module, rows)

    monkeypatch.setattr(rollout, "prepacked_linears", counting)
    plain = _engine_roll(tmp_path, model, tokenizer, problems, num_samples=2)
    assert packed_calls == []
    packed = _engine_roll(
        tmp_path, model, tokenizer, problems, "rollout.prepack_weights=true", num_samples=2
    )
    assert packed_calls == [8]  # 4 problems x 2 answers at once
    assert torch.equal(packed.response_ids, plain.response_ids)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.draw=gumbel"], "expected one of"),
        (["rollout.engine=vllm", "rollout.draw=inverse_cdf"], "rollout.draw"),
        (["rollout.engine=vllm", "rollout.prepack_weights=true"], "rollout.prepack_weights"),
        (["rollout.engine=vllm", "rollout.drop_finished_rows=false"], "rollout.drop_finished_rows"),
    ],
)
def test_bad_settings_name_the_key(overrides, message):
    """A bad value, or an hf engine's setting off its default under rollout.engine=vllm (vLLM
    draws, holds its weights and batches its rows itself), is refused naming the key."""
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_drop_finished_rows_reaches_the_sampler(tmp_path, monkeypatch):
    """``rollout.drop_finished_rows`` through the trainer's hf engine reaches every chunk's
    loop (on by default, off when set false), and both give the same tokens."""
    import gmts.sampling.rollout as rollout

    model, tokenizer, problems, _ = _tiny_roll(tmp_path)
    seen = []
    real = rollout._sample_cache_loop

    def recording(*args, **kwargs):
        seen.append(kwargs["drop_rows"])
        return real(*args, **kwargs)

    monkeypatch.setattr(rollout, "_sample_cache_loop", recording)
    dropping = _engine_roll(tmp_path, model, tokenizer, problems)
    keeping = _engine_roll(tmp_path, model, tokenizer, problems, "rollout.drop_finished_rows=false")
    assert seen == [True, False]
    assert torch.equal(dropping.response_ids, keeping.response_ids)


def test_prepack_needs_a_float32_cpu_run():
    from gmts.train.rollout_engine import check_engine

    cfg = load_config(None, ["rollout.prepack_weights=true", "model.dtype=bfloat16"])
    with pytest.raises(ValueError, match="model.dtype=bfloat16"):
        check_engine(cfg, torch.device("cpu"))
    with pytest.raises(ValueError, match="device cuda"):
        check_engine(load_config(None, ["rollout.prepack_weights=true"]), torch.device("cuda"))
    if can_prepack("cpu"):
        check_engine(load_config(None, ["rollout.prepack_weights=true"]), torch.device("cpu"))


def test_memory_plan_counts_the_prepacked_linear_weights():
    """The rollout's "prepacked weights" part is 4 bytes per parameter of every ``nn.Linear``
    of a real (tied-embedding) llama; every other phase is unchanged."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gmts.scale.layout import PlanSettings
    from gmts.scale.memory_plan import plan_memory

    config = LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if type(m) is torch.nn.Linear)

    def plan(*overrides):
        cfg = load_config(None, list(overrides))
        settings = PlanSettings.from_config(
            cfg, world_size=1, prompt_length=8, response_length=8, gpu=False
        )
        return plan_memory(config, settings)

    packed, plain = plan("rollout.prepack_weights=true"), plan()
    # the decoder layers' norms are counted too: 2 vectors of the width per layer
    norms = 2 * config.num_hidden_layers * config.hidden_size
    assert packed.phases["rollout"]["prepacked weights"] == 4 * (linear + norms)
    assert "prepacked weights" not in plain.phases["rollout"]
    for phase in ("scoring", "update", "step"):
        assert packed.phases[phase] == plain.phases[phase]


def _tiny_roll(tmp_path: Path):
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts.embedded.tasks import get_task

    path = _tiny.save_tiny_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    problems = get_task("addition").sample(4, random.Random(0))
    return model, tokenizer, problems, path


def _engine_roll(tmp_path: Path, model, tokenizer, problems, *overrides: str, num_samples=4):
    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import make_strategy
    from gmts.train.rollout_engine import EngineInputs, make_engine

    cfg = load_config(None, list(overrides))
    strategy = make_strategy("replicate", DistInfo(), Precision(), torch.device("cpu"))
    engine = make_engine(
        EngineInputs(
            cfg=cfg,
            model=model,
            tokenizer=tokenizer,
            strategy=strategy,
            info=DistInfo(),
            device=torch.device("cpu"),
            model_path="unused",
            model_config=model.config,
            prompt_tokens=8,
            max_new_tokens=8,
        )
    )
    with engine.session():
        return engine.sample(
            problems,
            num_samples=num_samples,
            max_new_tokens=8,
            temperature=1.0,
            seed=3,
        )


@pytest.mark.skipif(not can_prepack("cpu"), reason="this torch build has no oneDNN")
def test_trainer_runs_with_both_settings_and_repeats_itself(tmp_path):
    """``Trainer.run`` (what ``gmts train`` calls) end to end with ``rollout.draw=inverse_cdf``
    and ``rollout.prepack_weights=true``: it trains (the weights move, no step skipped), and a
    second run with the same seed logs the same rewards and token counts; the linear layers'
    own forwards are back after every rollout."""
    from gmts.train.metrics_log import read_metrics
    from gmts.train.trainer import Trainer

    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    settings = ("rollout.draw=inverse_cdf", "rollout.prepack_weights=true")
    rows = []
    for run in ("a", "b"):
        cfg = _tiny.small_config(model_dir, tmp_path / run, *settings)
        trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
        before = _tiny.params_vector(trainer.model)
        trainer.run()
        assert not torch.equal(before, _tiny.params_vector(trainer.model))
        assert not any("forward" in vars(m) for m in trainer.model.modules())
        rows.append(read_metrics(tmp_path / run))
    assert [r["step"] for r in rows[0]] == [1, 2]
    for a, b in zip(*rows):
        assert a["update/skipped_nonfinite"] == 0
        assert (a["reward/mean"], a["response/tokens"]) == (b["reward/mean"], b["response/tokens"])
