"""``gmts eval`` end to end on tiny random models: MATH-500, the built-in task, resume, errors."""

from __future__ import annotations

import json

import pytest

from gmts.cli import main


def _run(argv, capsys):
    rc = main(["eval", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_math500_end_to_end(tiny_chat_model_dir, shared_data, tmp_path, capsys):
    out = tmp_path / "res.json"
    rc, stdout, stderr = _run(
        [
            "--model", str(tiny_chat_model_dir), "--benchmarks", "math500",
            "--limit", "2", "--n", "2", "--max-new-tokens", "4", "--batch-size", "4",
            "--data-dir", str(shared_data), "--out", str(out), "--name", "tiny",
            "--device", "cpu", "--no-progress",
        ],
        capsys,
    )  # fmt: skip
    assert rc == 0, stderr
    lines = stdout.strip().splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["Model", "MATH-500", "Avg."]
    assert lines[2].startswith("| tiny ")
    assert lines[-1] == "(average@2 in %)"
    data = json.loads(out.read_text())
    assert data["format"] == "gmts-eval-results/1"
    summary = data["summary"]["benchmarks"]["math500"]
    assert summary["metric"] == "average@2" and summary["num_questions"] == 2
    records = data["results"]["math500"]
    first = json.loads((shared_data / "math" / "math500_test.jsonl").open().readline())
    assert records[0]["question"] == first["problem"]
    assert records[0]["answer"] == first["answer"]
    for rec in records:
        assert len(rec["completions"]) == len(rec["rewards"]) == len(rec["extracted"]) == 2
        assert all(r in (0.0, 1.0) for r in rec["rewards"])
    # random weights: whatever it wrote, the table agrees with the records
    mean = sum(sum(r["rewards"]) / 2 for r in records) / 2
    assert summary["score"] == pytest.approx(mean)
    assert (tmp_path / "res.partial.jsonl").is_file()


def test_builtin_task_end_to_end_and_resume(tiny_task_model_dir, tmp_path, capsys, monkeypatch):
    import gmts.sampling.rollout as rollout

    rows_generated = []
    real = rollout.generate_rollouts

    def counting(model, tokenizer, problems, **kwargs):
        rows_generated.append(len(problems))
        return real(model, tokenizer, problems, **kwargs)

    monkeypatch.setattr(rollout, "generate_rollouts", counting)
    common = [
        "--model", str(tiny_task_model_dir), "--benchmarks", "builtin:addition",
        "--n", "4", "--batch-size", "8", "--device", "cpu", "--no-progress",
    ]  # fmt: skip

    # part of the run, then the rest: the first 2 questions are not generated again
    part = tmp_path / "part.json"
    rc, _, err = _run([*common, "--limit", "2", "--out", str(part)], capsys)
    assert rc == 0, err
    assert sum(rows_generated) == 2
    # the loading line names the dtype, why (--dtype auto), and this machine's bf16 reading
    assert "(hf backend, float32 (auto: bfloat16 on a GPU, float32 on a CPU), --dtype to " in err
    assert "; bf16 " in err and "read: cpu flag " in err
    rows_generated.clear()
    rc, resumed_table, err = _run([*common, "--limit", "5", "--out", str(part)], capsys)
    assert rc == 0, err
    assert sum(rows_generated) == 3

    one_shot = tmp_path / "one.json"
    rc, one_shot_table, err = _run([*common, "--limit", "5", "--out", str(one_shot)], capsys)
    assert rc == 0, err
    # chunks of 2 questions: the resumed run's chunk {q2, q3} and {q4} are one-shot chunks too
    assert resumed_table.splitlines()[2:] == one_shot_table.splitlines()[2:]
    a = json.loads(part.read_text())["results"]["builtin:addition"]
    b = json.loads(one_shot.read_text())["results"]["builtin:addition"]
    assert a == b
    assert [r["question"] for r in a][:1] != [""]

    # --table prints one row per results file
    rc, table, _ = _run(["--table", str(part), str(one_shot)], capsys)
    assert rc == 0 and len(table.strip().splitlines()) == 5


def test_missing_model_is_one_line(tmp_path, capsys):
    rc, out, err = _run(["--model", str(tmp_path / "nope"), "--benchmarks", "math500"], capsys)
    assert rc == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert "model path does not exist" in err


def test_unknown_benchmark_fails_before_loading(tiny_chat_model_dir, capsys, monkeypatch):
    import gmts.eval.backends as backends

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(backends, "make_backend", no_load)
    rc, _, err = _run(["--model", str(tiny_chat_model_dir), "--benchmarks", "math500,foo"], capsys)
    assert rc == 2
    assert "unknown benchmark(s) 'foo'" in err and "math500" in err and "builtin:addition" in err


def test_vllm_missing_is_clear(tiny_chat_model_dir, capsys, monkeypatch, tmp_path):
    import gmts.sampling.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    rc, _, err = _run(
        ["--model", str(tiny_chat_model_dir), "--benchmarks", "builtin:addition",
         "--backend", "vllm", "--out", str(tmp_path / "r.json")],
        capsys,
    )  # fmt: skip
    assert rc == 2 and "--backend vllm needs the vllm package" in err and "--backend hf" in err


def test_bad_numbers_rejected(tiny_chat_model_dir, capsys):
    rc, _, err = _run(["--model", str(tiny_chat_model_dir), "--n", "0"], capsys)
    assert rc == 2 and "n must be >= 1" in err


def test_resume_with_other_settings_refused_before_loading(
    tiny_task_model_dir, tmp_path, capsys, monkeypatch
):
    import gmts.eval.backends as backends
    from gmts.eval.harness import EvalConfig, partial_results_path, store_settings
    from gmts.eval.results_store import ResultsStore

    out = tmp_path / "r.json"
    settings = store_settings(str(tiny_task_model_dir.resolve()), "hf", EvalConfig(n=2, limit=1))
    ResultsStore(partial_results_path(out), settings)  # as a killed `--n 2` run leaves it
    monkeypatch.setattr(backends, "make_backend", lambda *a, **k: pytest.fail("model loaded"))
    rc, _, err = _run(
        ["--model", str(tiny_task_model_dir), "--benchmarks", "builtin:addition", "--limit", "1",
         "--n", "3", "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert rc == 2 and "differs in: n" in err and "--fresh" in err


@pytest.mark.slow
def test_warm_started_demo_model_matches_its_own_evaluation(tmp_path, capsys):
    """The embedded warm start (cached after the first build) evaluated by ``gmts eval``.

    Greedy pass@1 on the 200 held-out questions must equal the greedy accuracy the warm start
    measured with ``evaluate_task`` (same problems, argmax decoding, one batch; up to 2 of 200
    argmax flips when the cached model was scored with another thread count); the sampled
    average@16 must agree with its average@16 up to sampling noise.
    """
    from gmts.embedded.warmstart import warm_start

    model_dir = warm_start("addition", progress=False)
    info = json.loads((model_dir / "warmstart.json").read_text())
    out = tmp_path / "warm.json"
    rc, _, err = _run(
        ["--model", str(model_dir), "--benchmarks", "builtin:addition", "--temperature", "0",
         "--batch-size", "256", "--device", "cpu", "--no-progress", "--out", str(out)],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    summary = json.loads(out.read_text())["summary"]["benchmarks"]["builtin:addition"]
    assert summary["metric"] == "pass@1" and summary["num_questions"] == 200
    # exact on the same thread count; a cache built with another count may flip an argmax
    assert summary["score"] == pytest.approx(info["greedy_accuracy"], abs=0.011)

    out16 = tmp_path / "warm16.json"
    rc, table, err = _run(
        ["--model", str(model_dir), "--benchmarks", "builtin:addition", "--n", "16",
         "--batch-size", "1024", "--device", "cpu", "--no-progress", "--out", str(out16)],
        capsys,
    )  # fmt: skip
    assert rc == 0, err
    score = json.loads(out16.read_text())["summary"]["benchmarks"]["builtin:addition"]["score"]
    assert abs(score - info["average_at_n"]) < 0.08
    assert "builtin:addition" in table


def test_missing_data_dir_files_fail_before_loading(tiny_chat_model_dir, tmp_path, capsys):
    empty = tmp_path / "data"
    empty.mkdir()
    rc, _, err = _run(
        ["--model", str(tiny_chat_model_dir), "--benchmarks", "math500", "--data-dir", str(empty)],
        capsys,
    )
    assert rc == 2 and "file not found" in err and err.count("\n") == 1


def test_keep_finished_rows_reaches_the_hf_sampler(
    tiny_task_model_dir, tmp_path, capsys, monkeypatch
):
    """``--keep-finished-rows`` reaches generate_rollouts as ``drop_finished_rows=False`` (off:
    True) with the same table; the vllm backend, which batches its rows itself, refuses it
    before anything loads."""
    import gmts.sampling.rollout as rollout

    seen = []
    real = rollout.generate_rollouts

    def recording(model, tokenizer, problems, **kwargs):
        seen.append(kwargs["drop_finished_rows"])
        return real(model, tokenizer, problems, **kwargs)

    monkeypatch.setattr(rollout, "generate_rollouts", recording)
    common = [
        "--model", str(tiny_task_model_dir), "--benchmarks", "builtin:addition", "--limit", "2",
        "--n", "4", "--device", "cpu", "--no-progress", "--fresh",
    ]  # fmt: skip
    tables = []
    for extra in ([], ["--keep-finished-rows"]):
        rc, table, err = _run([*common, *extra, "--out", str(tmp_path / "r.json")], capsys)
        assert rc == 0, err
        tables.append(table)
    assert seen == [True, False]
    assert tables[0] == tables[1]
    rc, _, err = _run([*common, "--backend", "vllm", "--keep-finished-rows"], capsys)
    assert rc == 2 and "--keep-finished-rows is a setting of the hf backend" in err


def test_make_backend_keeps_rows_only_with_hf(tiny_chat_model_dir):
    from gmts.eval.backends import BackendOptions, make_backend

    options = BackendOptions(tiny_chat_model_dir, device="cpu", drop_finished_rows=False)
    assert make_backend("hf", options).drop_finished_rows is False
    with pytest.raises(ValueError, match="batches its rows itself"):
        make_backend("vllm", options)
