"""GMTSGRPOTrainer against TRL's own GRPOTrainer on a tiny offline model (CPU)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from gmts.core import SelectionConfig  # noqa: E402
from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model  # noqa: E402
from gmts.embedded.tokenizer import build_char_tokenizer  # noqa: E402
from gmts.integrations.trl import (  # noqa: E402
    GMTSGRPOConfig,
    GMTSGRPOTrainer,
    check_trl_args,
    gmts_args,
)
from gmts.integrations.trl_loss import TRLLossOptions  # noqa: E402


def _length_reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 model and the char tokenizer saved locally (no hub)."""
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        TinyModelConfig(architecture="qwen2", hidden_size=32, num_heads=2, num_layers=1),
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _dataset() -> Dataset:
    return Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5*6=", "7-2="] * 2])


def _common(**overrides):
    kwargs = dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    kwargs.update(overrides)
    return kwargs


def _build(trainer_cls, args, model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=_length_reward,
        args=args,
        train_dataset=_dataset(),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train() otherwise
    return trainer


def _inputs(seed: int, beta: float) -> dict[str, torch.Tensor]:
    """A micro-batch in TRL's layout: left-padded prompts, right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    B, P, T, V = 6, 4, 7, 16
    prompt_ids = torch.randint(0, V, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    prompt_mask[3, :1] = 0
    completion_ids = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=g),
        # stale old policy: ratios spread around 1, some clipped
        "old_per_token_logps": -2.8 + 0.3 * torch.randn(B, T, generator=g),
        "num_items_in_batch": completion_mask.sum().float(),
    }
    if beta:
        inputs["ref_per_token_logps"] = -2.8 + 0.3 * torch.randn(B, T, generator=g)
    return inputs


def _loss_and_grads(trainer, inputs):
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize(
    "loss_type,beta,bias_kl",
    [("dapo", 0.0, True), ("grpo", 0.04, True), ("bnpo", 0.04, False), ("dr_grpo", 0.0, True)],
)
def test_entropy_selection_equals_trl_top_entropy_quantile(model_dir, loss_type, beta, bias_kl):
    """The "trl" preset with score=entropy == TRL's own top_entropy_quantile (no ties, one
    micro-batch), loss and gradients, for every supported loss_type."""
    rho = 0.2
    common = _common(loss_type=loss_type, beta=beta, use_bias_correction_kl=bias_kl)
    trl_trainer = _build(GRPOTrainer, GRPOConfig(**common, top_entropy_quantile=rho), model_dir)
    preset = SelectionConfig.preset("trl", score="entropy", ratio=rho)
    gmts_trainer = _build(GMTSGRPOTrainer, GMTSGRPOConfig(**common, **gmts_args(preset)), model_dir)
    for seed in (0, 1):
        inputs = _inputs(seed, beta)
        ref_loss, ref_grads = _loss_and_grads(trl_trainer, inputs)
        loss, grads = _loss_and_grads(gmts_trainer, inputs)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-7)
        assert ref_grads.keys() == grads.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-4, atol=1e-7)
        # exact count: 21 valid... k = ceil(0.2 * N), global over the micro-batch
        n_valid = int(inputs["completion_mask"].sum())
        logged = gmts_trainer._metrics["train"]
        assert logged["gmts/selected_tokens"][-1] == math.ceil(rho * n_valid)
        assert logged["gmts/valid_tokens"][-1] == n_valid


def test_paper_normalisation_divides_by_selected_count(model_dir):
    """normalize=selected (eq. 2) is the all-normalised token-mean scaled by N / S."""
    rho = 0.4
    common = _common(loss_type="bnpo", beta=0.0)
    base = dict(gmts_score="gmts", gmts_ratio=rho, gmts_kl_tokens="all")
    all_t = _build(
        GMTSGRPOTrainer, GMTSGRPOConfig(**common, **base, gmts_normalize="all"), model_dir
    )
    sel_t = _build(
        GMTSGRPOTrainer, GMTSGRPOConfig(**common, **base, gmts_normalize="selected"), model_dir
    )
    inputs = _inputs(3, 0.0)
    loss_all, _ = _loss_and_grads(all_t, inputs)
    loss_sel, _ = _loss_and_grads(sel_t, inputs)
    n = int(inputs["completion_mask"].sum())
    k = math.ceil(rho * n)
    torch.testing.assert_close(loss_sel, loss_all * n / k, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (dict(top_entropy_quantile=0.2), "top_entropy_quantile"),
        (
            dict(
                loss_type="vespo",
                use_vllm=True,
                vllm_importance_sampling_correction=True,
                vllm_importance_sampling_mode="token_truncate",
                vllm_importance_sampling_clip_min=1.5,
            ),
            "excludes 1.*padding included.*gmts_vespo_trl_padding=True",
        ),
        (
            dict(
                loss_type="vespo",
                use_vllm=True,
                vllm_importance_sampling_correction=True,
                vllm_importance_sampling_mode="token_mask",
                vllm_importance_sampling_clip_max=0.9,
            ),
            "excludes 1.*masked to 0",
        ),
        (dict(loss_type="dapo", gmts_vespo_trl_padding=True), "loss_type='vespo' only"),
        (dict(gmts_scope="group"), "gmts_scope"),
        (dict(gmts_normalize="per-group"), "per-group"),
        (dict(gradient_accumulation_steps=2, steps_per_generation=3), "steps_per_generation"),
    ],
)
def test_inexpressible_trl_options_raise_at_construction(overrides, needle):
    args = GMTSGRPOConfig(**_common(**overrides))
    with pytest.raises(ValueError, match=needle):
        check_trl_args(args)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(loss_type=loss_type)
        for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "sapo", "vespo")
    ]
    + [
        dict(loss_type="cispo", epsilon_high=5.0),
        dict(loss_type="cispo"),  # TRL's default epsilon_high = epsilon = 0.2: a cap below 1
        dict(loss_type="vespo", importance_sampling_level="sequence", beta=0.04),
        dict(loss_type="grpo", importance_sampling_level="sequence"),
        dict(delta=1.5),
        dict(delta=1.0),
        dict(off_policy_mask_threshold=0.5),
        dict(entropy_coef=0.01),
        dict(use_adaptive_entropy=True),
        dict(beta=0.04, use_bias_correction_kl=True),
        dict(use_vllm=True),  # TRL's defaults: correction on, mode sequence_mask
        *[  # VESPO with a token IS range that excludes 1: TRL's loss reproduced on request
            dict(
                loss_type="vespo",
                use_vllm=True,
                vllm_importance_sampling_mode=mode,
                vllm_importance_sampling_clip_min=1.5,
                gmts_vespo_trl_padding=True,
            )
            for mode in ("token_truncate", "token_mask")
        ],
        *[
            dict(use_vllm=True, vllm_importance_sampling_mode=mode)
            for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
        ],
    ],
)
def test_trl_options_are_accepted(overrides):
    """Every TRL 1.16 loss option that has an exact core objective (TRL's defaults with
    use_vllm among them: vllm_importance_sampling_correction=True, mode sequence_mask)."""
    args = GMTSGRPOConfig(**_common(**overrides))
    if args.use_vllm:  # the case accepts TRL's IS correction, which TRL switches on by default
        assert args.vllm_importance_sampling_correction is True
        mode = overrides.get("vllm_importance_sampling_mode", "sequence_mask")
        assert args.vllm_importance_sampling_mode == mode
        assert TRLLossOptions.from_args(args).vllm_is_mode == mode  # the loss applies it
    assert check_trl_args(args) is None  # raises ValueError listing problems otherwise


def test_liger_layer_kernels_are_allowed():
    """TRL 1.16 applies only liger's layer kernels (it refuses the fused linear
    cross-entropy itself) and still computes the loss in ``_compute_loss``, which GMTS
    replaces; so use_liger_kernel needs no rejection (grpo_trainer.py, __init__ and
    compute_loss)."""
    args = GMTSGRPOConfig(**_common(use_liger_kernel=True))
    assert args.use_liger_kernel is True
    assert check_trl_args(args) is None  # raises ValueError listing problems otherwise
    with pytest.raises(ValueError, match="gmts_scope"):  # the same check refuses others
        check_trl_args(GMTSGRPOConfig(**_common(use_liger_kernel=True, gmts_scope="group")))


def test_bad_gmts_fields_and_plain_config_are_rejected():
    with pytest.raises(ValueError, match="gmts_"):
        GMTSGRPOConfig(**_common(gmts_ratio=1.5))
    with pytest.raises(ValueError, match="unit"):
        GMTSGRPOConfig(**_common(gmts_unit="step"))
    with pytest.raises(ValueError, match="GMTSGRPOConfig"):
        check_trl_args(GRPOConfig(**_common()))


@pytest.mark.slow
def test_tiny_model_trains_with_gmts_and_logs_selection_metrics(model_dir):
    args = GMTSGRPOConfig(
        **_common(loss_type="dapo", beta=0.04, learning_rate=1e-2, max_steps=3),
        gmts_score="gmts",
        gmts_ratio=0.2,
    )
    trainer = _build(GMTSGRPOTrainer, args, model_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "no parameter changed after training"
    logs = [entry for entry in trainer.state.log_history if "gmts/selected_fraction" in entry]
    assert len(logs) == 3
    for entry in logs:
        assert entry["gmts/selected_tokens"] == math.ceil(0.2 * entry["gmts/valid_tokens"])
        assert 0 < entry["gmts/selected_fraction"] <= 0.2 + 1 / entry["gmts/valid_tokens"]
        assert math.isfinite(entry["gmts/score_threshold"])
        assert 0.0 <= entry["gmts/clip_fraction_selected"] <= 1.0


@pytest.mark.slow
def test_trl_two_processes_select_globally(model_dir, tmp_path, free_port):
    """torchrun, 2 CPU processes, 2 accumulated micro-batches: k = ceil(ratio * N), N summed
    over both processes and both micro-batches of each optimizer step. Then the "trl" preset
    with loss_type bnpo equals TRL's own top_entropy_quantile loss and gradients on each
    process, with per-process token counts that differ (TRL divides by the local count)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("trl_two_process_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port),
        str(worker),
        model_dir,
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["num_processes"] == 2 for r in ranks)
    records = [r["records"] for r in ranks]
    assert len(records[0]) == len(records[1]) == 6  # 3 steps x 2 micro-batches
    for step in range(3):
        micro = [rec[2 * step : 2 * step + 2] for rec in records]  # [rank][micro-batch]
        n_step = sum(m["local_valid_tokens"] for rank in micro for m in rank)
        k_step = sum(m["local_selected_tokens"] for rank in micro for m in rank)
        for rank in micro:
            for m in rank:
                assert m["unit_valid_tokens"] == n_step  # one unit: both ranks, both micro-batches
                assert m["unit_selected_tokens"] == k_step
        assert k_step == math.ceil(0.3 * n_step)
    # DDP kept both replicas identical, and training moved them
    assert ranks[0]["checksum_after"] == pytest.approx(ranks[1]["checksum_after"], rel=1e-9)
    assert ranks[0]["checksum_after"] != ranks[0]["checksum_before"]
    bnpo = [r["bnpo"] for r in ranks]
    assert bnpo[0]["local_tokens"] != bnpo[1]["local_tokens"]
    for b in bnpo:
        assert b["loss_diff"] <= 1e-6 * max(abs(b["trl_loss"]), 1.0)
        assert b["grad_diff"] <= 1e-5 * b["grad_scale"]
    # TRL's own get_high_entropy_mask over both processes == the "trl" preset, at every rho,
    # distinct and tied entropies; TRL's loss == ours on each rank (float64 inputs)
    sweeps = [r["quantile_sweep"] for r in ranks]
    assert len(sweeps[0]) == len(sweeps[1]) == 2 * 2 * 6
    assert sweeps[0][0]["local_valid_tokens"] != sweeps[1][0]["local_valid_tokens"]
    for rank_records in sweeps:
        for rec in rank_records:
            assert rec["mask_equal"], rec
            assert rec["loss_diff"] <= 1e-12 and rec["grad_diff"] <= 1e-12, rec
            assert rec["grad_scale"] > 0
    for a, b in zip(*sweeps, strict=True):  # one threshold over both ranks' N tokens
        n = a["local_valid_tokens"] + b["local_valid_tokens"]
        position = (1 - a["rho"]) * (n - 1)  # torch.quantile's interpolation position
        if not a["ties"] and abs(position - round(position)) > 1e-4:
            kept = a["local_selected_tokens"] + b["local_selected_tokens"]
            assert kept == n - math.ceil(position), a  # distinct scores at or above it


TRL_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "trl").glob("*.yaml"))


@pytest.mark.parametrize("config", TRL_CONFIGS, ids=[c.stem for c in TRL_CONFIGS])
def test_shipped_trl_configs_parse_into_a_valid_gmts_config(config):
    from trl import TrlParser

    from gmts.integrations.trl_cli import GMTSScriptArguments

    parser = TrlParser((GMTSScriptArguments, GMTSGRPOConfig))
    cpu = ["--bf16", "false", "--use_vllm", "false", "--use_cpu", "true"]
    script, args = parser.parse_args_and_config(
        args=["--config", str(config), "--train_file", "x.jsonl", *cpu]
    )
    check_trl_args(args)
    assert isinstance(args.learning_rate, float)
    assert (args.epsilon, args.epsilon_high, args.num_generations) == (0.2, 0.28, 16)
    assert args.gmts_selection_config().ratio == 0.2
    assert script.model_name_or_path.startswith("Qwen/")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only case")
def test_cli_with_bf16_on_a_cpu_says_in_one_line_what_to_change(capsys):
    from gmts.integrations.trl_cli import BF16_ON_CPU, main

    config = str(TRL_CONFIGS[0])  # bf16: true, as every shipped TRL config
    assert main(["--config", config, "--train_file", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"gmts.integrations.trl_cli: error: {BF16_ON_CPU}"
    assert "--use_cpu true --bf16 false" in BF16_ON_CPU


def test_cli_dataset_and_reward(tmp_path):
    from gmts.integrations.trl_cli import GMTSScriptArguments, build_dataset, build_reward

    rows = [{"problem": "What is 1+2?", "answer": "3"}, {"problem": "2*5?", "answer": "10"}]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    script = GMTSScriptArguments(model_name_or_path="m", train_file=str(path))
    chat = build_dataset(script)
    assert chat[0]["prompt"][0]["role"] == "system" and "boxed" in chat[0]["prompt"][0]["content"]
    assert chat[0]["prompt"][1]["content"].startswith("What is 1+2?")
    plain = build_dataset(script, chat=False)
    assert isinstance(plain[1]["prompt"], str) and "2*5?" in plain[1]["prompt"]
    reward = build_reward("math")
    done = [
        [{"role": "assistant", "content": "so \\boxed{3}"}],
        [{"role": "assistant", "content": "11"}],
    ]
    assert reward(done, answer=["3", "10"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="column"):
        build_dataset(GMTSScriptArguments(train_file=str(path), question_column="question"))


def _accumulated_loss_and_grads(trainer, micro_batches):
    """Run one optimizer step's micro-batches the way TRL does (buffered slices, _step)."""
    model = trainer.model
    model.train()
    model.zero_grad()
    trainer.current_gradient_accumulation_steps = len(micro_batches)
    trainer._buffered_inputs = micro_batches
    total = torch.zeros(())
    for step, batch in enumerate(micro_batches):
        trainer._step = step
        loss = trainer._compute_loss(model, batch)
        loss.backward()
        total = total + loss.detach()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads


@pytest.mark.parametrize("normalize", ["selected", "all"])
def test_step_selection_unit_with_accumulation_equals_one_big_micro_batch(model_dir, normalize):
    """gmts_unit='mini-batch': 2 accumulated micro-batches == 1 micro-batch of both."""
    rho = 0.3
    gmts = dict(gmts_score="gmts", gmts_ratio=rho, gmts_normalize=normalize, gmts_kl_tokens="all")
    common = _common(loss_type="dapo", beta=0.04)
    big = _build(GMTSGRPOTrainer, GMTSGRPOConfig(**common, **gmts), model_dir)
    acc_args = GMTSGRPOConfig(**common, **gmts, gradient_accumulation_steps=2)
    assert acc_args.gmts_unit == "mini-batch" and acc_args.steps_per_generation == 2
    acc = _build(GMTSGRPOTrainer, acc_args, model_dir)
    inputs = _inputs(4, 0.04)
    halves = [
        {k: v[rows] if v.dim() > 0 else v for k, v in inputs.items()}
        for rows in (slice(0, 3), slice(3, 6))
    ]
    want_loss, want_grads = _accumulated_loss_and_grads(big, [inputs])
    loss, grads = _accumulated_loss_and_grads(acc, halves)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-7)
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], rtol=1e-4, atol=1e-7)
    n_valid = int(inputs["completion_mask"].sum())
    logged = acc._metrics["train"]
    assert logged["gmts/unit_selected_tokens"][-1] == math.ceil(rho * n_valid)
    assert logged["gmts/unit_valid_tokens"][-1] == n_valid


def test_micro_batch_selection_unit_selects_per_micro_batch(model_dir):
    """The cheaper unit: each accumulated micro-batch gets its own k = ceil(rho N_micro)."""
    rho = 0.3
    args = GMTSGRPOConfig(
        **_common(loss_type="dapo", beta=0.0),
        gmts_score="gmts",
        gmts_ratio=rho,
        gradient_accumulation_steps=2,
        gmts_unit="micro-batch",
    )
    trainer = _build(GMTSGRPOTrainer, args, model_dir)
    inputs = _inputs(5, 0.0)
    halves = [
        {k: v[rows] if v.dim() > 0 else v for k, v in inputs.items()}
        for rows in (slice(0, 3), slice(3, 6))
    ]
    _accumulated_loss_and_grads(trainer, halves)
    n_last = int(halves[1]["completion_mask"].sum())
    assert trainer._metrics["train"]["gmts/unit_selected_tokens"][-1] == math.ceil(rho * n_last)


@pytest.mark.parametrize("score,window_forwards", [("gmts", 2), ("entropy", 2), ("random", 0)])
def test_the_step_units_extra_forward_runs_only_for_scores_that_read_the_model(
    model_dir, score, window_forwards
):
    """gmts_unit='mini-batch' over 2 accumulated micro-batches: the window's no-grad forward
    (one per micro-batch, once per optimizer step) runs for scores that read entropies or the
    current policy, which TRL keeps nowhere; random reads the masks only: no extra forward,
    and the window still selects k = ceil(rho N) over both micro-batches."""
    rho = 0.3
    args = GMTSGRPOConfig(
        **_common(loss_type="dapo", beta=0.0),
        gmts_score=score,
        gmts_ratio=rho,
        gradient_accumulation_steps=2,
    )
    trainer = _build(GMTSGRPOTrainer, args, model_dir)
    calls = []
    forward = trainer._get_per_token_logps_and_entropies

    def counting(*a, **k):
        calls.append(torch.is_grad_enabled())
        return forward(*a, **k)

    trainer._get_per_token_logps_and_entropies = counting
    inputs = _inputs(6, 0.0)
    halves = [
        {k: v[rows] if v.dim() > 0 else v for k, v in inputs.items()}
        for rows in (slice(0, 3), slice(3, 6))
    ]
    _accumulated_loss_and_grads(trainer, halves)
    assert calls.count(True) == 2  # the two training forwards
    assert calls.count(False) == window_forwards
    n_valid = int(inputs["completion_mask"].sum())
    logged = trainer._metrics["train"]
    assert logged["gmts/unit_valid_tokens"][-1] == n_valid
    assert logged["gmts/unit_selected_tokens"][-1] <= math.ceil(rho * n_valid)


def test_a_score_trl_cannot_feed_is_refused_when_configured():
    with pytest.raises(ValueError, match="gmts_score='logit-grad' reads logit_grad_norm"):
        check_trl_args(GMTSGRPOConfig(**_common(gmts_score="logit-grad")))


@pytest.mark.slow
def test_training_with_accumulation_selects_over_the_optimizer_step(model_dir):
    args = GMTSGRPOConfig(
        **_common(loss_type="grpo", beta=0.0, learning_rate=1e-2, max_steps=2),
        gradient_accumulation_steps=2,
        gmts_score="gmts",
        gmts_ratio=0.2,
    )
    trainer = _build(GMTSGRPOTrainer, args, model_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    last = [e for e in trainer.state.log_history if "gmts/unit_valid_tokens" in e][-1]
    assert last["gmts/unit_selected_tokens"] == math.ceil(0.2 * last["gmts/unit_valid_tokens"])
    # the step spans 2 micro-batches
    assert last["gmts/unit_valid_tokens"] > last["gmts/valid_tokens"]


@pytest.mark.slow
def test_cli_trains_the_tiny_model_end_to_end(model_dir, tmp_path):
    from gmts.integrations.trl_cli import main

    data = tmp_path / "train.jsonl"
    rows = [{"problem": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(2)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "run"
    argv = [
        "--model_name_or_path", model_dir, "--train_file", str(data), "--template", "plain",
        "--reward", "math", "--output_dir", str(out), "--use_cpu", "true", "--bf16", "false",
        "--gradient_checkpointing", "false", "--report_to", "none", "--max_steps", "1",
        "--per_device_train_batch_size", "4", "--num_generations", "4",
        "--max_completion_length", "6", "--save_strategy", "no", "--gmts_score", "entropy",
    ]  # fmt: skip
    assert main(argv) == 0
    assert (out / "config.json").is_file()


@pytest.mark.slow
def test_trl_peft_config_trains_only_lora_adapters_with_gmts(model_dir):
    """TRL's own LoRA path (``peft_config``) through TRL's train(): GMTS selects on the
    PeftModel's forward (over the 2 accumulated micro-batches of each optimizer step, which
    takes the extra no-grad pass), only adapter parameters change, and the KL reference is
    TRL's (the base with the adapters disabled: no reference model is built)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoTokenizer

    args = GMTSGRPOConfig(
        **_common(loss_type="dapo", beta=0.04, learning_rate=1e-2, max_steps=2),
        gradient_accumulation_steps=2,
        gmts_score="gmts",
        gmts_ratio=0.2,
    )
    trainer = GMTSGRPOTrainer(
        model=model_dir,
        reward_funcs=_length_reward,
        args=args,
        train_dataset=_dataset(),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )
    assert isinstance(trainer.model, peft.PeftModel)
    assert trainer.ref_model is None  # TRL: with peft the reference is the adapters-off base
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable  # the base is untouched
    assert any("lora_B" in n for n in changed)
    logs = [entry for entry in trainer.state.log_history if "gmts/unit_valid_tokens" in entry]
    assert len(logs) == 2
    for entry in logs:  # one selection over the step's 2 micro-batches
        assert entry["gmts/unit_selected_tokens"] == math.ceil(
            0.2 * entry["gmts/unit_valid_tokens"]
        )
        assert entry["gmts/unit_valid_tokens"] > entry["gmts/valid_tokens"]
        assert math.isfinite(entry["kl"])
