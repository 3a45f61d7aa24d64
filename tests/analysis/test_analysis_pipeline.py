"""analyze_rollout on a real (tiny) model against independent recomputations; the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from gmts.analysis.collect import analyze_rollout  # noqa: E402
from gmts.analysis.gradnorms import token_gradient_norms  # noqa: E402
from gmts.cli import main  # noqa: E402
from gmts.embedded.tasks import get_task  # noqa: E402
from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model  # noqa: E402
from gmts.embedded.tokenizer import build_char_tokenizer  # noqa: E402
from gmts.sampling.rollout import generate_rollouts  # noqa: E402

SMALL = TinyModelConfig(num_layers=1, hidden_size=32, num_heads=2, mlp_ratio=2, seed=3)


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_char_tokenizer()
    return build_tiny_model(tokenizer, SMALL).eval(), tokenizer


def test_analyze_rollout_matches_independent_recomputation(tiny):
    model, tokenizer = tiny
    task = get_task("addition")
    problems = [task.make_problem(12, 7), task.make_problem(305, 99)]
    rollout = generate_rollouts(model, tokenizer, problems, num_samples=3, max_new_tokens=6, seed=1)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    a = analyze_rollout(model, tokenizer, rollout, rewards)
    mask = rollout.response_mask
    assert a.response_mask.equal(mask)

    # log-probs / entropy from ONE padded forward with the sampler's position ids
    with torch.no_grad():
        logits = (
            model(
                input_ids=rollout.input_ids,
                attention_mask=rollout.attention_mask,
                position_ids=rollout.position_ids,
            )
            .logits[:, rollout.prompt_length - 1 : -1]
            .float()
        )  # (B, T, V)
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, rollout.response_ids[..., None])[..., 0]
    entropy = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(a.logprob[mask], lp[mask], atol=1e-5)
    assert torch.allclose(a.entropy[mask], entropy[mask], atol=1e-5)
    assert torch.allclose(a.prob + a.eps, mask.float(), atol=1e-6)

    # true norms == the per-token backward loop; ||grad l|| = |A| * ||grad log pi|| on-policy
    ref = token_gradient_norms(
        model, rollout.input_ids, rollout.attention_mask, mask, method="loop"
    )
    rel = ((a.grad_logprob_norm - ref).abs() / ref.clamp_min(1e-12))[mask]
    assert rel.max() <= 1e-5
    adv = a.advantages[:, None].expand_as(a.omega)
    assert torch.allclose(a.omega[mask], adv[mask])
    assert torch.allclose(a.grad_objective_norm, a.omega.abs() * a.grad_logprob_norm)
    assert torch.allclose(a.scores["gmts"][mask], (a.entropy * adv).abs()[mask])
    assert a.scores["oracle"] is a.grad_objective_norm
    assert [len(t) for t in a.token_text] == mask.sum(1).tolist()
    assert "".join(a.token_text[0]).startswith(rollout.completions[0])
    assert not model.training


def test_analyze_rollout_validates_rewards(tiny):
    model, tokenizer = tiny
    task = get_task("addition")
    rollout = generate_rollouts(
        model, tokenizer, [task.make_problem(1, 2)], num_samples=2, max_new_tokens=3, seed=0
    )
    with pytest.raises(ValueError, match="rewards"):
        analyze_rollout(model, tokenizer, rollout, torch.zeros(3))


def test_cli_writes_report_figures_and_html(tiny, tmp_path: Path, capsys):
    model, tokenizer = tiny
    model_dir = tmp_path / "run" / "checkpoints" / "step_000002" / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir.parent / "trainer_state.pt").write_bytes(b"")  # a complete checkpoint's marker
    out = tmp_path / "out"
    code = main(
        [
            "analyze",
            "--run",
            str(tmp_path / "run"),
            "--questions",
            "2",
            "--samples",
            "2",
            "--out",
            str(out),
            "--html",
            "--seed",
            "3",
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["answers"] == 4 and report["meta"]["model"] == str(model_dir)
    lines = (out / "tokens.jsonl").read_text().splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert len(first["tokens"]) == len(first["grad_objective_norm"]) == len(first["entropy"])
    for name in ("within_answer.png", "across_answers.png", "eps.png", "overlap.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "tokens.html").read_text().count("class='tok'") == report["meta"]["tokens"]
    printed = capsys.readouterr()
    assert "Jaccard" in printed.out
    # the dtype it ran in, the flag that changes it, and this machine's bf16 reading
    assert f"gmts analyze: {model_dir} in float32 (--dtype; bf16 " in printed.err
    assert "read: cpu flag " in printed.err


def test_cli_rejects_bad_arguments(tmp_path: Path, capsys):
    assert main(["analyze", "--model", str(tmp_path), "--questions", "0"]) == 2
    assert "--questions" in capsys.readouterr().err
    assert main(["analyze", "--model", str(tmp_path)]) == 2
    assert "config.json" in capsys.readouterr().err
    assert main(["analyze", "--run", str(tmp_path)]) == 2
    assert main(["analyze", "--model", str(tmp_path), "--task", "nope"]) == 2


def test_analyze_rollout_reports_the_fallback_to_the_loop(tiny, unvmappable):
    model, tokenizer = tiny
    task = get_task("addition")
    rollout = generate_rollouts(
        model, tokenizer, [task.make_problem(41, 5)], num_samples=2, max_new_tokens=4, seed=2
    )
    rewards = torch.tensor([1.0, 0.0])
    with pytest.warns(RuntimeWarning, match="falling back"):
        slow = analyze_rollout(unvmappable(model), tokenizer, rollout, rewards)
    fast = analyze_rollout(model, tokenizer, rollout, rewards)
    assert slow.meta["gradient_method"] == ["loop"] and fast.meta["gradient_method"] == ["batched"]
    assert any("falling back" in m for m in slow.meta["warnings"])
    m = rollout.response_mask
    rel = (
        slow.grad_logprob_norm - fast.grad_logprob_norm
    ).abs() / fast.grad_logprob_norm.clamp_min(1e-12)
    assert rel[m].max() <= 1e-5


def test_cli_default_threads(tiny):
    from gmts.cli.analyze import _default_threads

    model, _ = tiny
    assert _default_threads(model, torch.device("cpu")) == 1  # small model: one thread
    assert _default_threads(model, torch.device("cuda")) is None  # GPU: leave torch alone
