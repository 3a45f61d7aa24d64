"""The trainer on a tiny model: every algorithm x selection learns something and selects what
was asked; micro-batch accumulation is exact; bad steps and bad rewards are handled."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gmts.train import checkpoint as ckpt
from gmts.train.metrics_log import read_metrics
from gmts.train.trainer import Trainer, train
from gmts.train.update import select_minibatch, update_minibatch

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


TINY_DEMO = (  # the demo tests' recipe changes: 2 steps of a tiny batch, evaluated every step
    "optim.steps=2",
    "data.eval_every=1",
    "rollout.questions_per_batch=2",
    "rollout.group_size=2",
    "optim.micro_batch_size=4",
    "data.eval_questions=4",
    "data.eval_samples=2",
)


@pytest.mark.parametrize("algorithm", ["grpo", "dapo"])
@pytest.mark.parametrize(("score", "ratio"), [("none", 1.0), ("entropy", 0.2), ("gmts", 0.3)])
def test_each_algorithm_and_selection_updates_and_selects_the_ratio(
    tiny_dir, tmp_path, algorithm, score, ratio
):
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        f"algorithm={algorithm}",
        f"selection.score={score}",
        f"selection.ratio={ratio}",
        "optim.mini_batch_questions=2",  # two optimizer steps per rollout batch
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    before = _tiny.params_vector(trainer.model)
    result = trainer.run()
    after = _tiny.params_vector(trainer.model)
    assert not torch.equal(before, after)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["update/skipped_nonfinite"] == 0
        # exactly ceil(ratio * N) per mini-batch: at most one token above the ratio
        tokens_per_mb = row["response/tokens"] / 2
        assert ratio <= row["select/fraction"] <= ratio + 1.0 / tokens_per_mb + 1e-9
        if algorithm == "grpo":
            assert "update/kl_mean" in row
    assert len(result.history) == 2
    assert (tmp_path / "run" / "config.yaml").is_file()


def _fixed_batch(model_dir: Path):
    """A rollout batch of the tiny model with statistics, for update-level tests."""
    from gmts.models.loading import load_model, load_tokenizer

    cfg = _tiny.small_config(model_dir, model_dir.parent / "unused")
    model, tokenizer = load_model(str(model_dir)), load_tokenizer(str(model_dir))
    batch = _tiny.rollout_batch(model, tokenizer, problem_seed=0, sample_seed=3)
    return model, batch, cfg


def _select_and_update(model, optimizer, batch, objective, selection, micro):
    """What Trainer.train_step does with one mini-batch: current scores, one selection, one
    update (returns the result and the selection)."""
    from gmts.core.loss import LossConfig
    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import Replicate
    from gmts.train.scoring import TokenScorer

    scorer, info = TokenScorer(), DistInfo()
    current = scorer.no_grad(model, batch, micro_batch_size=micro)
    chosen = select_minibatch(
        batch, current, selection, objective, micro_batch_size=micro, info=info, step=0
    )
    selected = chosen.selected
    result = update_minibatch(
        model,
        optimizer,
        batch,
        chosen,
        scorer=scorer,
        loss=LossConfig.of(objective, selection),
        micro_batch_size=micro,
        grad_clip=1.0,
        strategy=Replicate(info, Precision(), torch.device("cpu")),
    )
    return result, selected


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_accumulation_equals_one_pass(tiny_dir, aggregation):
    import dataclasses

    from gmts.core.config import SelectionConfig

    results = []
    for micro in (16, 4, 1):
        model, batch, cfg = _fixed_batch(tiny_dir)
        # perturb the policy so that r != 1 and clipping is exercised
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        objective = dataclasses.replace(cfg.objective, aggregation=aggregation)
        selection = SelectionConfig(score="gmts", ratio=0.3)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        result, selected = _select_and_update(model, opt, batch, objective, selection, micro)
        results.append((_tiny.params_vector(model), selected, result.loss))
    ref_params, ref_sel, ref_loss = results[0]
    for params, sel, loss in results[1:]:
        assert torch.equal(sel, ref_sel)
        assert torch.allclose(params, ref_params, atol=1e-6, rtol=0)
        assert loss == pytest.approx(ref_loss, abs=1e-6)


def test_non_finite_loss_skips_the_step(tiny_dir, tmp_path, monkeypatch):
    import gmts.train.update as update_mod

    real = update_mod.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(update_mod, "policy_loss", nan_loss)
    cfg = _tiny.small_config(tiny_dir, tmp_path / "run", "optim.steps=1")
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    before = _tiny.params_vector(trainer.model)
    trainer.run()
    assert torch.equal(before, _tiny.params_vector(trainer.model))
    (row,) = read_metrics(tmp_path / "run")
    assert row["update/skipped_nonfinite"] == 1 and row["update/skipped_total"] == 1


def test_fresh_run_replaces_an_earlier_runs_metrics_only_with_overwrite(tiny_dir, tmp_path):
    """Without --resume, rows left in the directory by an earlier run are kept (the run is
    refused) or, with --overwrite, removed: never appended to."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "eval.jsonl"):
        (run / name).write_text("".join(f'{{"step": {s}, "old": 1}}\n' for s in (0, 1, 2, 3)))
    cfg = _tiny.small_config(tiny_dir, run, "optim.steps=1")
    with pytest.raises(ValueError, match="already holds a run"):
        Trainer(cfg, reward_fn=_tiny.partial_credit)
    assert len(read_metrics(run)) == 4
    Trainer(cfg, overwrite=True, reward_fn=_tiny.partial_credit).run()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1]
    assert "old" not in rows[0]
    assert read_metrics(run, "eval.jsonl") == []  # data.eval_questions=0: no evaluation rows


def test_raising_reward_counts_errors_and_continues(tiny_dir, tmp_path):
    calls = {"n": 0}

    def flaky(completion: str, answer: str) -> float:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise RuntimeError("verifier crashed")
        return _tiny.partial_credit(completion, answer)

    cfg = _tiny.small_config(tiny_dir, tmp_path / "run", "algorithm=grpo")
    result = train(cfg, reward_fn=flaky)
    assert len(result.history) == 2
    assert sum(r["reward/errors"] for r in result.history) == calls["n"] // 3 > 0


def test_checkpoints_are_atomic_and_pruned(tiny_dir, tmp_path):
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        "optim.steps=3",
        "checkpoint.every=1",
        "checkpoint.keep=2",
        "checkpoint.save_final=true",
    )
    train(cfg, reward_fn=_tiny.partial_credit)
    found = ckpt.list_checkpoints(tmp_path / "run")
    assert [s for s, _ in found] == [2, 3]
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp-*"))
    state = ckpt.load_trainer_state(found[-1][1])
    assert state["step"] == 3 and {"optimizer", "scheduler", "rng", "source"} <= set(state)
    assert (found[-1][1] / "model" / "config.json").is_file()


def test_plot_several_runs(tmp_path, capsys):
    from gmts.cli import main

    for name, base in (("a", 0.1), ("b", 0.3)):
        d = tmp_path / name
        d.mkdir()
        with open(d / "metrics.jsonl", "w") as fh:
            for step in range(1, 6):
                fh.write(json.dumps({"step": step, "reward/mean": base + 0.1 * step}) + "\n")
    out = tmp_path / "curves.png"
    assert (
        main(
            [
                "plot",
                str(tmp_path / "a"),
                str(tmp_path / "b"),
                "--out",
                str(out),
                "--metrics",
                "reward/mean",
            ]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_dataset_training_with_template_and_position(tiny_dir, tmp_path):
    """A dataset file as training data: prompts rendered by a template, too-long prompts
    dropped, the data position saved in checkpoints."""
    rows = [{"q": f"{a}+{b}=", "a": f"{a + b}"} for a in range(10, 30) for b in (3, 4)]
    rows.append({"q": "9" * 200, "a": "0"})  # longer than max_prompt_length: dropped
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        f"data.dataset={data}",
        "algorithm=grpo",  # no dynamic sampling: exactly 4 questions per step
        "data.question_field=q",
        "data.answer_field=a",
        "data.template=null",
        "rollout.max_prompt_length=32",
        "rollout.max_response_length=6",
        "checkpoint.save_final=true",
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    assert trainer.source.skipped_too_long == 1 and len(trainer.source.problems) == 40
    trainer.run()
    state = ckpt.load_trainer_state(ckpt.latest_checkpoint(tmp_path / "run"))
    assert state["source"] == {"epoch": 0, "position": 8}  # 2 steps x 4 questions
    with pytest.raises(ValueError, match="neither a file nor a benchmark"):
        Trainer(_tiny.small_config(tiny_dir, tmp_path / "r2", "data.dataset=/no/such.jsonl"))


def test_update_in_one_pass_equals_scoring_then_updating(tiny_dir):
    """With one micro-batch and the rollout policy, the loss's own forward pass supplies the
    old log-probs (``update_minibatch(forward=...)``, as ``Trainer.train_step`` runs it): same
    old statistics, selection, loss, token sums and update as a separate no-grad pass followed
    by select_minibatch + update_minibatch."""
    from gmts.core.config import SelectionConfig
    from gmts.core.loss import LossConfig
    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import Replicate
    from gmts.train.batch import TrainBatch
    from gmts.train.scoring import TokenScorer

    selection = SelectionConfig(score="gmts", ratio=0.2)
    model, scored, cfg = _fixed_batch(tiny_dir)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    two_pass, selected = _select_and_update(model, opt, scored, cfg.objective, selection, 16)
    two_pass_params = _tiny.params_vector(model)

    model, scored, cfg = _fixed_batch(tiny_dir)
    rollout = TrainBatch(*(getattr(scored, f) for f in TrainBatch.__dataclass_fields__))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scorer, info = TokenScorer(), DistInfo()
    forward = scorer(model, rollout)  # with gradients: the old statistics and the loss's
    batch = rollout.scored(forward, None)
    chosen = select_minibatch(
        batch, batch.old, selection, cfg.objective, micro_batch_size=16, info=info, step=0
    )
    selected_one = chosen.selected
    one_pass = update_minibatch(
        model,
        opt,
        batch,
        chosen,
        scorer=scorer,
        loss=LossConfig.of(cfg.objective, selection),
        micro_batch_size=16,
        grad_clip=1.0,
        strategy=Replicate(info, Precision(), torch.device("cpu")),
        forward=forward,
    )
    assert torch.allclose(batch.old_logprobs, scored.old_logprobs, atol=1e-6, rtol=0)
    assert torch.equal(selected_one, selected)
    assert 0 < int(selected.sum()) < int(scored.response_mask.sum())
    assert torch.allclose(_tiny.params_vector(model), two_pass_params, atol=1e-6, rtol=0)
    assert one_pass.loss == pytest.approx(two_pass.loss, abs=1e-6)
    assert one_pass.sums.metrics() == pytest.approx(two_pass.sums.metrics(), abs=1e-6)


def test_reward_errors_and_overlong_penalty_by_hand():
    import math

    from gmts.train.collect import overlong_penalty
    from gmts.train.sources import score_rewards

    def reward(completion: str, answer: str) -> float:
        if completion == "boom":
            raise RuntimeError("verifier crashed")
        return math.nan if completion == "nan" else float(completion == answer)

    values, errors = score_rewards(reward, ["1", "boom", "2", "nan"], ["1", "1", "1", "1"])
    assert values.tolist() == [1.0, 0.0, 0.0, 0.0] and errors == 2
    # L_max 10, buffer 4: no penalty up to 6 tokens, then linear to -0.5 at 10
    lengths = torch.tensor([3, 6, 7, 8, 10])
    got = overlong_penalty(lengths, max_new_tokens=10, buffer=4, penalty=0.5)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]))
    assert overlong_penalty(lengths, 10, 0, 1.0).abs().sum() == 0


def test_bfloat16_with_gradient_checkpointing_runs(tiny_dir, tmp_path):
    cfg = _tiny.small_config(
        tiny_dir,
        tmp_path / "run",
        "model.dtype=bfloat16",
        "model.gradient_checkpointing=true",
        "optim.steps=1",
        "optim.micro_batch_size=4",
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    # mixed precision: float32 master weights, AdamW state and gradients; bf16 compute
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    before = _tiny.params_vector(trainer.model)
    trainer.run()
    assert not torch.equal(before, _tiny.params_vector(trainer.model))
    moments = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    (row,) = read_metrics(tmp_path / "run")
    assert row["update/skipped_nonfinite"] == 0


def _fake_warm_start(tiny_dir: Path, tmp_path: Path, monkeypatch) -> list[int]:
    """gmts demo's warm start replaced by a copy of the tiny model (with a warmstart.json);
    gives the list the seeds asked for are appended to."""
    import shutil

    import gmts.embedded.warmstart as warmstart

    warm = Path(shutil.copytree(tiny_dir, tmp_path / "warm"))
    (warm / warmstart.INFO_FILE).write_text(
        json.dumps(
            {
                "greedy_accuracy": 0.25,
                "steps_done": 7,
                "check_accuracy": 0.4,
                "settings": {"config": {"stop_at_greedy": 0.35}},
            }
        )
    )
    seeds_warmed: list[int] = []
    monkeypatch.setattr(
        warmstart, "warm_start", lambda *a, **k: seeds_warmed.append(k["seed"]) or warm
    )
    return seeds_warmed


def test_demo_plumbing_and_table(tiny_dir, tmp_path, monkeypatch, capsys):
    """gmts demo's driver on a tiny budget (the warm start replaced by the tiny model), two RL
    seeds: one shared step-0 evaluation per seed, the intermediate ones, a curve per run, the
    paired table, the plot, and the CLI's JSON (with one seed: the one-seed table)."""
    import argparse

    from gmts.cli import demo
    from gmts.demo.comparisons import compare
    from gmts.demo.pool import run_demo
    from gmts.demo.settings import METHODS, DemoSettings
    from gmts.demo.tables import format_table

    seeds_warmed = _fake_warm_start(tiny_dir, tmp_path, monkeypatch)
    tiny = TINY_DEMO
    # one process: the monkeypatched warm start is this process's (test_demo_jobs: several)
    settings = DemoSettings(overrides=tiny, output_dir=str(tmp_path / "demo"), seeds=2, jobs=1)
    result = run_demo(settings, progress=False)
    # the 6 runs each build a Trainer, which prints its memory plan: the demo shows one
    assert capsys.readouterr().err.count("memory plan") == 1
    labels = ["all tokens", "ETS top 20%", "GMTS top 20%"]
    assert result.seeds == [0, 1] and result.methods == labels
    assert seeds_warmed == [0, 1] and sorted(result.warm_starts) == [0, 1]  # one per seed
    assert [(r.seed, r.method) for r in result.rows] == [(s, m) for s in (0, 1) for m in labels]
    assert result.rows[0].selected_fraction == 1.0
    # at most ceil(20%) of each tiny batch; ETS at least that, GMTS fewer where its scores are
    # 0 (the paper preset never selects a zero-gradient token: with 2 tiny groups of equal
    # rewards every advantage, so every GMTS score, is 0)
    for row in result.rows:
        if row.method != "all tokens":
            assert 0.0 <= row.selected_fraction < 0.5
            if row.method.startswith("ETS"):
                assert row.selected_fraction >= 0.2
    for row in result.rows:
        score = METHODS[row.method.split()[0] if row.method != "all tokens" else row.method]
        run_dir = tmp_path / "demo" / f"seed{row.seed}" / score
        assert row.run_dir == str(run_dir) and len(read_metrics(run_dir)) == 2
        assert read_metrics(run_dir)[0]["step"] == 1
        assert sorted(row.curve) == [0, 1, 2]  # before, every step, after
        first_of_seed = next(r for r in result.rows if r.seed == row.seed)
        assert row.curve[0] == first_of_seed.curve[0]  # one evaluation of the warm start
        a0, a1, a2 = (a for _, a in row.average(2))
        assert row.area_mean(2) == pytest.approx((a0 + 2 * a1 + a2) / 4)
    assert [(c.a, c.b, c.mean.n) for c in compare(result)] == [
        ("GMTS top 20%", "ETS top 20%", 2),
        ("GMTS top 20%", "all tokens", 2),
        ("ETS top 20%", "all tokens", 2),
    ]
    table = format_table(result)
    assert "seeds 0-1 (2), each from its warm start" in table and "mean±std over 2 seeds" in table
    assert "GMTS top 20% - ETS top 20%" in table and "ahead on" in table
    assert "warm start of seed 1: 7 supervised steps (stopped at 40.0% greedy on the check" in table
    result.warm_starts[1] = {**result.warm_starts[1], "check_accuracy": 0.3}  # out of steps
    assert "did NOT reach its 35% check target: 30.0%" in format_table(result)
    assert (tmp_path / "demo" / "curves.png").stat().st_size > 0
    assert f"xdg-open {tmp_path / 'demo' / 'curves.png'}" in table

    # the command: one seed prints the exact one-seed table; --json keeps it with the machine
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    out = tmp_path / "one" / "demo.json"
    args = parser.parse_args(
        [*tiny, "--seeds=1", "--methods=GMTS", "--no-progress", "--jobs=1"]
        + [f"--output-dir={tmp_path / 'one'}"]
        + [f"--json={out}"]
    )
    assert demo.run(args) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["table"].strip() in printed and "one seed" in record["table"]
    assert "warm start: 7 supervised steps" in record["table"]
    assert record["benchmark"] == "demo" and record["comparisons"] == []
    assert record["machine"]["torch_cpu_capability"] and record["threads"] == 1
    assert [r["method"] for r in record["result"]["rows"]] == ["GMTS top 20%"]
    with pytest.raises(ValueError, match="optim.nope"):
        run_demo(DemoSettings(overrides=("optim.nope=1",)), progress=False)
    with pytest.raises(ValueError, match="methods"):
        DemoSettings(methods=("GRPO",))
    with pytest.raises(ValueError, match="seeds"):
        DemoSettings(seeds=0)
    with pytest.raises(ValueError, match="jobs"):
        DemoSettings(jobs=0)


def _start_and_its_trainers_evaluation(
    overrides, tmp_path, seed: int, monkeypatch
) -> tuple[dict, dict, Any]:
    """(``start_seed``'s evaluation of ``seed``'s start with the recipe's ``overrides``, made
    with every Trainer failing the test; ``Trainer(cfg).evaluate()`` of the last method's run
    from that start; the recipe's data settings)."""
    import gmts.train.trainer as trainer_module
    from gmts.demo.jobs import method_config, start_seed
    from gmts.demo.settings import DemoSettings, demo_recipe

    def no_trainer(*args, **kwargs):
        raise AssertionError("the demo built a Trainer to evaluate a start")

    settings = DemoSettings(overrides=overrides, output_dir=str(tmp_path / "demo"), jobs=1)
    base = demo_recipe(settings.overrides)
    with monkeypatch.context() as patched:
        patched.setattr(trainer_module, "Trainer", no_trainer)
        start = start_seed(base, settings, seed, progress=False)
    method = settings.methods[-1]
    cfg = method_config(base, method, start.model_path, settings.output_dir, False, seed)
    return start.before, Trainer(cfg, overwrite=True).evaluate(), base.data


@pytest.mark.parametrize("model", ["embedded", "folder"])
def test_demo_evaluates_a_start_as_its_runs_trainer_would(tiny_dir, tmp_path, monkeypatch, model):
    """A seed's step 0 (evaluated once for all its methods, without a Trainer) is exactly what
    each run's own ``Trainer.evaluate()`` gives before step 1: the embedded recipe (its warm
    start replaced by the tiny model) and a model.path folder, seed 3 (not the recipe's). The
    task's reward is made graded (partial credit), so that the tiny random model scores above 0
    and a different sampling seed, temperature or model would show."""
    from gmts.embedded.tasks import Task

    monkeypatch.setattr(Task, "reward", lambda self, c, a: _tiny.partial_credit(c, a))
    overrides = (*TINY_DEMO, "data.eval_questions=8", "data.eval_samples=3")
    if model == "embedded":
        _fake_warm_start(tiny_dir, tmp_path, monkeypatch)
    else:
        overrides += (f"model.path={tiny_dir}",)
    before, trainers, d = _start_and_its_trainers_evaluation(overrides, tmp_path, 3, monkeypatch)
    assert before == trainers
    assert 0 < before[f"average@{d.eval_samples}"] < 1  # two zeros would show nothing
    assert before["questions"] == d.eval_questions == 8


@pytest.mark.slow
def test_demo_evaluates_the_real_warm_start_as_its_runs_trainer_would(tmp_path, monkeypatch):
    """The same with the real embedded warm start of seed 0 (cached in $GMTS_CACHE; 1-2 min to
    build on first use) and the task's own exact-match reward."""
    overrides = (*TINY_DEMO, "data.eval_questions=16", "data.eval_samples=4")
    before, trainers, d = _start_and_its_trainers_evaluation(overrides, tmp_path, 0, monkeypatch)
    assert before == trainers
    assert 0 < before[f"average@{d.eval_samples}"] < 1  # two zeros would show nothing
    assert before["questions"] == d.eval_questions == 16


@pytest.mark.slow
def test_demo_jobs_do_not_change_the_table(tiny_dir, tmp_path):
    """Two processes (spawned workers) give exactly the runs that one process gives."""
    from gmts.demo.comparisons import compare
    from gmts.demo.pool import run_demo
    from gmts.demo.settings import DemoSettings

    tiny = (f"model.path={tiny_dir}", *TINY_DEMO)
    results = [
        run_demo(
            DemoSettings(overrides=tiny, output_dir=str(tmp_path / f"jobs{j}"), seeds=2, jobs=j),
            progress=False,
        )
        for j in (1, 2)
    ]
    one, two = ([(r.seed, r.method, r.curve, r.selected_fraction) for r in x.rows] for x in results)
    assert one == two and len(one) == 6
    for seed in (0, 1):  # every step of every run, wall-clock fields aside
        for score in ("none", "entropy", "gmts"):
            a, b = (
                [
                    {k: v for k, v in r.items() if not k.startswith("time/")}
                    for r in read_metrics(tmp_path / f"jobs{j}" / f"seed{seed}" / score)
                ]
                for j in (1, 2)
            )
            assert a == b and len(a) == 2, (seed, score)
    assert compare(results[0]) == compare(results[1])  # the paired differences


def test_demo_recipe_is_the_one_config_file():
    """configs/demo.yaml is the packaged recipe itself (a link), not a second copy."""
    from gmts.demo.settings import DEMO_CONFIG, demo_recipe

    shipped = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert shipped.resolve() == DEMO_CONFIG.resolve()
    cfg = demo_recipe(["optim.lr=3e-4"])
    assert cfg.optim.lr == 3e-4 and cfg.model.path == "embedded"


def test_benchmark_setup_builds_on_the_demo_recipe(tmp_path, monkeypatch):
    """benchmarks/tiny_setup.py changes only what a benchmark varies; the rest is demo.yaml."""
    from gmts.demo.settings import demo_recipe

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tiny_setup.py"
    # register=True puts it in sys.modules for its dataclasses; the setitem has the test undo it
    monkeypatch.setitem(sys.modules, "tiny_setup", None)
    tiny_setup = load_module(path, "tiny_setup", register=True)
    recipe = demo_recipe()
    cfg = tiny_setup.train_config("m", tmp_path, score="gmts", steps=3)
    assert (cfg.algorithm, cfg.optim.lr, cfg.selection.ratio) == (
        recipe.algorithm,
        recipe.optim.lr,
        recipe.selection.ratio,
    )
    assert (cfg.rollout.questions_per_batch, cfg.rollout.group_size) == (
        recipe.rollout.questions_per_batch,
        recipe.rollout.group_size,
    )
    assert cfg.rollout.max_sampling_rounds == recipe.rollout.max_sampling_rounds
    assert (cfg.selection.score, cfg.optim.steps, cfg.model.path) == ("gmts", 3, "m")
    assert recipe.data.task == tiny_setup.TASK
    other = tiny_setup.train_config("m", tmp_path, algorithm="grpo", lr=1e-3, ratio=0.5)
    assert (other.algorithm, other.optim.lr, other.selection.ratio) == ("grpo", 1e-3, 0.5)
    assert other.rollout.dynamic_sampling is False  # GRPO's default, not the recipe's DAPO one
