"""``gmts eval`` and ``gmts analyze`` on the real pretrained model (SmolLM2-135M-Instruct, by
its name ``smollm2-135m-instruct``): eval on a GSM8K slice (2 questions x 2 answers, 32 new
tokens), analyze on the model's own sampled answers to addition-2digit through its chat template
(2 questions x 2 answers, 8 new tokens) with the exact per-token gradient norms over all 134.5M
parameters."""

from __future__ import annotations

import json
import math

import pytest

from gmts.cli import main

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"


def test_eval_on_a_gsm8k_slice(tmp_path, shared_data, real_model):
    out = tmp_path / "gsm8k.json"
    argv = ["eval", "--model", MODEL, "--benchmarks", "gsm8k", "--limit", "2", "--n", "2"]
    argv += ["--max-new-tokens", "32", "--data-dir", str(shared_data), "--out", str(out)]
    assert main([*argv, "--no-progress", "--threads", "1"]) == 0
    results = json.loads(out.read_text())
    assert results["settings"]["model"] == real_model  # the name resolved to the converted folder
    (rows,) = results["results"].values()
    assert [r["id"] for r in rows] == ["gsm8k-test-0", "gsm8k-test-1"]
    rewards = []
    for row in rows:
        assert len(row["completions"]) == len(row["rewards"]) == len(row["extracted"]) == 2
        assert all(isinstance(c, str) and c.strip() for c in row["completions"])  # prose
        assert all(r in (0.0, 1.0) for r in row["rewards"])
        rewards += row["rewards"]
    summary = results["summary"]["benchmarks"]["gsm8k"]
    assert (summary["num_questions"], summary["samples_per_question"]) == (2, 2)
    assert summary["score"] == pytest.approx(sum(rewards) / len(rewards))


def test_analyze_on_its_own_answers(tmp_path, real_model):
    """Every response token gets a positive finite true gradient norm, and its logit-gradient
    norm ||e_y - pi|| lies in [1 - p, sqrt(2) (1 - p)] (p the token's probability)."""
    out = tmp_path / "analyze"
    argv = ["analyze", "--model", MODEL, "--dataset", "addition-2digit", "--temperature", "0.7"]
    argv += ["-K", "2", "-G", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--out", str(out), "--device", "cpu", "--threads", "1"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["model"] == real_model
    assert report["meta"]["task"] == "addition-2digit"  # its questions, through the chat template
    assert report["meta"]["answers"] == 4 and report["meta"]["groups"] == 2
    assert {"within_answer", "per_group", "eps", "overlap"} <= report.keys()
    records = [json.loads(line) for line in (out / "tokens.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert sum(len(r["tokens"]) for r in records) == report["meta"]["tokens"] > 0
    for r in records:
        n = len(r["tokens"])
        assert 1 <= n <= 8
        for key in ("entropy", "prob", "eps", "logit_grad_norm", "grad_logprob_norm"):
            assert len(r[key]) == n, key
        for p, eps, lgn, g, h in zip(
            r["prob"], r["eps"], r["logit_grad_norm"], r["grad_logprob_norm"], r["entropy"]
        ):
            assert 0.0 < p <= 1.0 and eps == pytest.approx(1.0 - p, abs=1e-6)
            assert 0.0 < g < math.inf  # the exact per-token norm over all parameters
            assert h >= -1e-6
            assert (1 - p) - 1e-5 <= lgn <= math.sqrt(2) * (1 - p) + 1e-5, (p, lgn)
    assert list(out.glob("*.png")), "no figure written"
