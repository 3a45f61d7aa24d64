"""GMTS inside verl's engine-worker loss path, on CPU with verl installed (no Ray, no GPU).

Every input is built with verl's own functions along each trainer's code path
(``verl_batches``): jagged nested response fields with bf16 ``old_log_probs`` (the V1 trainer,
verl 0.9's default) and padded ones (the legacy trainer), split into mini-batches and
micro-batches by verl's own iterators.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is installed in .venv-verl only")
pytest.importorskip("verl.workers.utils.losses", reason="verl is installed in .venv-verl only")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # verl_batches (not a package)

import verl_batches as vb  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss, sft_loss, value_loss  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

from gmts.core import LossConfig, SelectionConfig, policy_loss, select_for_update  # noqa: E402
from gmts.integrations.verl import plugin  # noqa: E402
from gmts.integrations.verl.loss import (  # noqa: E402
    GMTSPolicyLoss,
    gmts_ppo_loss,
    objective_from_actor_config,
    padded_response_fields,
    prepare_selection,
)
from gmts.integrations.verl.settings import ENV_VAR, GMTSVerlSettings  # noqa: E402

LAYOUTS = sorted(vb.BUILDERS)  # "legacy", "v1"
FIELDS = ["response_mask", "old_log_probs", "advantages", "ref_log_prob"]


def _actor_config(**overrides) -> ActorConfig:
    kwargs = dict(
        strategy="fsdp",
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode="token-mean",
        use_kl_loss=True,
        kl_loss_coef=0.05,
        kl_loss_type="low_var_kl",
        entropy_coeff=0.0,
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
    )
    kwargs.update(overrides)
    return ActorConfig(**kwargs)


def _settings(**selection) -> GMTSVerlSettings:
    return GMTSVerlSettings(selection=SelectionConfig(**selection))


def _mini_batch(layout: str, seed: int, **answer_kw):
    """One actor mini-batch (all answers, shuffled by verl's iterator) with the engine's info."""
    answers = vb.make_answers(seed, **answer_kw)
    data = vb.BUILDERS[layout](answers)
    (mini,) = vb.mini_batches(data, len(answers), seed=seed)
    return answers, vb.engine_info(mini)


def _leaves(answers, requires_grad=True):
    logprobs = torch.cat(answers.current_logprobs).clone().requires_grad_(requires_grad)
    entropy = torch.cat(answers.current_entropy).clone().requires_grad_(requires_grad)
    return logprobs, entropy


def _select(mini, answers, settings, config):
    """prepare_selection with the current statistics the engine's extra pass would return."""
    logprobs = no_padding_2_padding(vb.model_output(answers, mini), mini)
    entropy = no_padding_2_padding(vb.model_output(answers, mini, "current_entropy"), mini)
    return prepare_selection(
        mini,
        settings,
        objective_from_actor_config(config),
        actor_config=config,
        logprobs=logprobs,
        entropy=entropy,
    )


def _loss_over_micro_batches(loss_fn, mini, answers, leaves, with_entropy, max_token_len=None):
    """Sum of the loss over verl's micro-batches (dynamic sizes reorder rows), and gradients."""
    for leaf in leaves:
        leaf.grad = None
    total = torch.zeros(())
    for micro in vb.micro_batches(mini, max_token_len=max_token_len):
        output = {"log_probs": vb.model_output(answers, micro, leaf=leaves[0])}
        if with_entropy:
            output["entropy"] = vb.model_output(answers, micro, "current_entropy", leaf=leaves[1])
        loss, metrics = loss_fn(output, micro)
        loss.backward()
        total = total + loss.detach()
    return total, [leaf.grad.clone() for leaf in leaves[: 2 if with_entropy else 1]], metrics


def test_builders_give_each_trainer_its_layout():
    """The premise of the tests below: V1 -> jagged nested, bf16 old log-probs; legacy -> padded."""
    answers = vb.make_answers(0)
    v1, legacy = vb.v1_actor_batch(answers), vb.legacy_actor_batch(answers)
    for key in FIELDS:
        assert v1[key].is_nested and not legacy[key].is_nested, key
    assert v1["old_log_probs"].dtype == torch.bfloat16
    assert legacy["old_log_probs"].dtype == torch.float32
    padded_v1 = padded_response_fields(v1, FIELDS)
    padded_legacy = padded_response_fields(legacy, FIELDS)
    for key in FIELDS:
        torch.testing.assert_close(
            padded_v1[key].float(), padded_legacy[key].float(), atol=1e-2, rtol=0
        )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "agg,normalize,entropy_coeff,use_kl",
    [
        ("token-mean", "selected", 0.0, True),
        ("token-mean", "selected", 0.01, False),
        ("seq-mean-token-mean", "all", 0.0, True),
        ("seq-mean-token-sum", "all", 0.01, True),
    ],
)
def test_ratio_one_equals_verl_ppo_loss(layout, agg, normalize, entropy_coeff, use_kl):
    """ratio=1.0: the GMTS loss is verl's ppo_loss (values and gradients, over micro-batches);
    zero scores selected too, so every valid token is (the paper preset skips them)."""
    config = _actor_config(loss_agg_mode=agg, entropy_coeff=entropy_coeff, use_kl_loss=use_kl)
    settings = _settings(score="gmts", ratio=1.0, normalize=normalize, zero_scores="select")
    for seed in (0, 1, 2):
        answers, mini = _mini_batch(layout, seed, rollout_is_weights=seed == 2)
        _select(mini, answers, settings, config)
        mask = padded_response_fields(mini, ["response_mask", "gmts_selected"])
        assert torch.equal(mask["gmts_selected"], mask["response_mask"].bool())
        leaves = _leaves(answers)
        with_entropy = bool(entropy_coeff)
        want, want_grads, _ = _loss_over_micro_batches(
            functools.partial(ppo_loss, config), mini, answers, leaves, with_entropy
        )
        gmts = functools.partial(gmts_ppo_loss, config, settings=settings)
        got, grads, _ = _loss_over_micro_batches(gmts, mini, answers, leaves, with_entropy)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-8)


def _core_loss(
    mini, answers, leaf, config, selected, aggregation, normalize, kl_tokens,
    mask_key="response_mask",
):  # fmt: skip
    """The core's policy_loss on the whole mini-batch, padded, float32 (the oracle)."""
    fields = padded_response_fields(mini, FIELDS + ["gmts_selected"])
    mask = fields[mask_key].bool()
    objective = dataclasses.replace(objective_from_actor_config(config), aggregation=aggregation)
    return policy_loss(
        no_padding_2_padding(vb.model_output(answers, mini, leaf=leaf), mini).float(),
        fields["old_log_probs"].float(),
        fields["advantages"].float(),
        mask,
        LossConfig(objective, SelectionConfig(normalize=normalize, kl_tokens=kl_tokens)),
        ref_logprobs=fields["ref_log_prob"].float(),
        selected=selected,
    )


def _assert_gmts_loss_is_the_core_loss(mini, answers, config, settings, selected, agg, normalize):
    """The GMTS loss summed over verl's dynamic-size micro-batches == the core's loss on the
    whole mini-batch (values and gradients); returns (metrics, loss)."""
    leaves = _leaves(answers)
    gmts = functools.partial(gmts_ppo_loss, config, settings=settings)
    got, (grad,), metrics = _loss_over_micro_batches(gmts, mini, answers, leaves, False, 12)
    leaves[0].grad = None
    kl_tokens = settings.selection.kl_tokens
    want, _ = _core_loss(mini, answers, leaves[0], config, selected, agg, normalize, kl_tokens)
    want.backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad, leaves[0].grad, rtol=1e-5, atol=1e-7)
    return metrics, got


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kl_tokens", ["selected", "all"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_selection_and_loss_match_the_core_eq2(layout, kl_tokens, agg):
    """Exactly ceil(rho N) response tokens, scored in float32 (V1's old log-probs are bf16), the
    mask stored in the layout of response_mask, and the loss summed over verl's micro-batches
    (dynamic sizes: rows regrouped and reordered) equal to the core's eq. 2 with verl's dual clip
    and clamped k3 KL (values and gradients), whatever verl's loss_agg_mode (the core's rule)."""
    config = _actor_config(loss_agg_mode=agg)
    rho = 0.3
    settings = _settings(score="gmts", ratio=rho, kl_tokens=kl_tokens)
    objective = objective_from_actor_config(config)
    assert (objective.dual_clip, objective.kl_clamp, objective.clip_high) == (3.0, 10.0, 0.28)
    for seed in (0, 1, 2, 3):
        answers, mini = _mini_batch(layout, seed)
        _select(mini, answers, settings, config)
        assert mini["gmts_selected"].is_nested == mini["response_mask"].is_nested
        fields = padded_response_fields(mini, FIELDS + ["gmts_selected"])
        mask, selected = fields["response_mask"].bool(), fields["gmts_selected"]
        n_valid = int(mask.sum())
        assert selected.dtype == torch.bool and not (selected & ~mask).any()
        assert int(selected.sum()) == math.ceil(rho * n_valid)
        assert tu.get_non_tensor_data(mini, "gmts_num_selected", None) == math.ceil(rho * n_valid)
        want_selected = select_for_update(  # the core on float32 copies of the same inputs
            settings.selection,
            objective,
            logprobs=no_padding_2_padding(vb.model_output(answers, mini), mini),
            old_logprobs=fields["old_log_probs"].float(),
            advantages=fields["advantages"].float(),
            response_mask=mask,
            entropy=no_padding_2_padding(vb.model_output(answers, mini, "current_entropy"), mini),
            ref_logprobs=fields["ref_log_prob"].float(),
        ).selected
        assert torch.equal(selected, want_selected)

        metrics, _ = _assert_gmts_loss_is_the_core_loss(
            mini, answers, config, settings, selected, agg, "selected"
        )
        assert metrics["gmts/selected_fraction"] == pytest.approx(selected.sum().item() / n_valid)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kl_tokens", ["selected", "all"])
def test_normalize_all_with_seq_mean_token_mean_divides_each_answer_by_its_length(
    layout, kl_tokens
):
    """normalize='all' + seq-mean-token-mean: each answer's selected-token loss divided by its
    full length |o_i| (not by its selected count |S_i|), = the core's seq-mean-token-mean."""
    config = _actor_config(loss_agg_mode="seq-mean-token-mean")
    settings = _settings(score="gmts", ratio=0.3, normalize="all", kl_tokens=kl_tokens)
    for seed in (0, 1, 2):
        answers, mini = _mini_batch(layout, seed)
        _select(mini, answers, settings, config)
        selected = padded_response_fields(mini, ["gmts_selected"])["gmts_selected"]
        _, got = _assert_gmts_loss_is_the_core_loss(
            mini, answers, config, settings, selected, "seq-mean-token-mean", "all"
        )
        # dividing each answer by its selected count |S_i| (the old behaviour: verl's
        # seq-mean-token-mean over the selected tokens as its mask) gives a different loss
        wrong, _ = _core_loss(
            mini, answers, None, config, selected, "seq-mean-token-mean", "all", kl_tokens,
            mask_key="gmts_selected",
        )  # fmt: skip
        assert not torch.allclose(wrong.detach(), got, rtol=1e-3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rollout_is_weights_enter_omega(layout):
    """verl multiplies its per-token policy loss by rollout_is_weights w; the score uses the
    gradient coefficient of that weighted loss, read off by autograd from verl's own ppo_loss."""
    config = _actor_config(use_kl_loss=False)
    settings = _settings(score="omega", ratio=0.4)
    answers, mini = _mini_batch(layout, 3, rollout_is_weights=True)
    _select(mini, answers, settings, config)
    fields = padded_response_fields(mini, ["response_mask", "gmts_selected", "rollout_is_weights"])
    mask, selected = fields["response_mask"].bool(), fields["gmts_selected"]

    leaf = torch.cat(answers.current_logprobs).clone().requires_grad_(True)
    loss, _ = ppo_loss(config, {"log_probs": vb.model_output(answers, mini, leaf=leaf)}, mini)
    loss.backward()
    # (B, R) d loss / d log pi, rows in the mini-batch's order
    grad = no_padding_2_padding(vb.model_output(answers, mini, leaf=leaf.grad), mini)
    omega = (-grad * int(mask.sum())).abs()  # token-mean: loss = -sum(w s) / N
    k = math.ceil(0.4 * int(mask.sum()))
    threshold = omega[mask].topk(k).values[-1]
    assert torch.equal(selected, mask & (omega >= threshold))  # no ties in random data
    assert not torch.equal(fields["rollout_is_weights"][mask], torch.ones(int(mask.sum())))

    mini["rollout_is_weights"] = -mini["rollout_is_weights"]
    with pytest.raises(ValueError, match="rollout_is_weights has negative"):
        _select(mini, answers, settings, config)


class _FakeEngine:
    """Stands in for a verl engine: infer_batch returns the answers' current statistics."""

    def __init__(self, answers):
        self.answers = answers
        self.infer_calls = 0
        self.trained_on = None

    def get_data_parallel_group(self):
        return None

    def infer_batch(self, data, loss_function=None):
        assert tu.get_non_tensor_data(data, "calculate_entropy", None) is True
        self.infer_calls += 1
        output = {
            "log_probs": vb.model_output(self.answers, data),
            "entropy": vb.model_output(self.answers, data, "current_entropy"),
        }
        return {"model_output": output}

    def train_batch(self, data, loss_function):
        self.trained_on = data
        return "trained"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_engine_hook_runs_the_exact_pass_before_micro_batching(layout, monkeypatch):
    fake_base = types.ModuleType("fake_engine_base")
    fake_base.BaseEngine = _FakeEngine
    monkeypatch.setattr(_FakeEngine, "train_batch", _FakeEngine.train_batch)
    plugin.patch_base_engine(fake_base)
    plugin.patch_base_engine(fake_base)  # idempotent
    assert getattr(_FakeEngine.train_batch, "__gmts_patched__", False)

    config = _actor_config()
    settings = _settings(score="gmts", ratio=0.3)
    answers, mini = _mini_batch(layout, 7)
    tu.assign_non_tensor(mini, calculate_entropy=False)
    engine = _FakeEngine(answers)
    loss_fn = GMTSPolicyLoss(config, settings)
    assert engine.train_batch(mini, loss_function=loss_fn) == "trained"
    assert engine.infer_calls == 1
    assert tu.get_non_tensor_data(mini, "calculate_entropy", None) is False  # restored
    fields = padded_response_fields(engine.trained_on, FIELDS + ["gmts_selected"])
    want = select_for_update(
        settings.selection,
        loss_fn.objective,
        logprobs=no_padding_2_padding(vb.model_output(answers, mini), mini),
        old_logprobs=fields["old_log_probs"].float(),
        advantages=fields["advantages"].float(),
        response_mask=fields["response_mask"].bool(),
        entropy=no_padding_2_padding(vb.model_output(answers, mini, "current_entropy"), mini),
        ref_logprobs=fields["ref_log_prob"].float(),
    ).selected
    assert torch.equal(fields["gmts_selected"], want)

    # any other loss function passes through untouched
    other_answers, plain = _mini_batch(layout, 8)
    other = _FakeEngine(other_answers)
    other.train_batch(plain, loss_function=functools.partial(ppo_loss, config=config))
    assert other.infer_calls == 0 and "gmts_selected" not in plain


@pytest.mark.parametrize("layout", LAYOUTS)
def test_missing_selection_raises_when_training_but_not_in_forward_only_evaluation(layout):
    config = _actor_config()
    settings = _settings(score="gmts", ratio=0.3)
    answers, mini = _mini_batch(layout, 4)
    output = {"log_probs": vb.model_output(answers, mini)}
    with pytest.raises(ValueError, match="gmts_selected"):
        gmts_ppo_loss(config, output, mini, settings=settings)
    with torch.no_grad():
        loss, _ = gmts_ppo_loss(config, output, mini, settings=settings)
        want, _ = ppo_loss(config, output, mini)
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rollout_score_inputs_skip_the_extra_pass(layout):
    settings = GMTSVerlSettings(
        selection=SelectionConfig(score="omega", ratio=0.5), score_inputs="rollout"
    )
    answers, mini = _mini_batch(layout, 9)
    engine = _FakeEngine(answers)
    GMTSPolicyLoss(_actor_config(), settings).prepare_mini_batch(engine, mini)
    assert engine.infer_calls == 0
    fields = padded_response_fields(mini, ["response_mask", "gmts_selected"])
    n_valid = int(fields["response_mask"].sum())
    assert int(fields["gmts_selected"].sum()) == math.ceil(0.5 * n_valid)
    with pytest.raises(ValueError, match="entropies"):
        GMTSVerlSettings(selection=SelectionConfig(score="gmts"), score_inputs="rollout")


def test_set_loss_fn_hook_swaps_verl_actor_ppo_loss_and_refuses_other_actor_losses(monkeypatch):
    class FakeWorker:
        def set_loss_fn(self, loss_fn):
            self.loss_fn = loss_fn

    module = types.ModuleType("fake_engine_workers")
    module.TrainingWorker = FakeWorker
    plugin.patch_training_worker(module)
    config = _actor_config()
    verl_loss = functools.partial(ppo_loss, config=config)
    distillation = functools.partial(gmts_ppo_loss, config=config)  # any other actor loss

    monkeypatch.delenv(ENV_VAR, raising=False)
    worker = FakeWorker()
    for loss_fn in (verl_loss, distillation):
        worker.set_loss_fn(loss_fn)
        assert worker.loss_fn is loss_fn  # no settings: verl unchanged

    monkeypatch.setenv(ENV_VAR, _settings(score="entropy", ratio=0.2).to_env_value(encoded=True))
    worker.set_loss_fn(verl_loss)
    assert isinstance(worker.loss_fn, GMTSPolicyLoss)
    assert worker.loss_fn.settings.selection.score == "entropy"
    assert worker.loss_fn.config is config
    installed = worker.loss_fn
    worker.set_loss_fn(installed)  # already GMTS: kept
    assert worker.loss_fn is installed
    for passing in (
        functools.partial(value_loss, config=None),
        functools.partial(sft_loss, config=None),
    ):
        worker.set_loss_fn(passing)
        assert worker.loss_fn is passing  # critic / SFT: nothing to select
    for refused in (distillation, lambda model_output, data, dp_group=None: None):
        with pytest.raises(ValueError, match="not verl's ppo_loss"):
            worker.set_loss_fn(refused)


def test_actor_settings_gmts_cannot_honour_raise():
    """A few refusals on verl's ActorConfig (test_verl_loss_modes.py covers every loss mode
    and KL type)."""
    GMTSPolicyLoss(_actor_config(loss_agg_mode="seq-mean-token-mean"), _settings())  # eq. 2
    with pytest.raises(ValueError, match="loss_agg_mode"):  # no core counterpart
        GMTSPolicyLoss(_actor_config(loss_agg_mode="seq-mean-token-sum-norm"), _settings())
    with pytest.raises(ValueError, match="kl_loss_type='full'"):
        GMTSPolicyLoss(_actor_config(kl_loss_type="full"), _settings())
    # clip_cov under GMTS: the core's clip-cov with verl's parameters; a band verl would
    # accept but that holds no token (lb >= ub) is named
    config = _actor_config(policy_loss=PolicyLossConfig(loss_mode="clip_cov"))
    assert GMTSPolicyLoss(config, _settings()).objective.name == "clip-cov"
    with pytest.raises(ValueError, match="clip_cov_lb must be < clip_cov_ub"):
        config = _actor_config(
            policy_loss=PolicyLossConfig(loss_mode="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0)
        )
        GMTSPolicyLoss(config, _settings())
    # each answer divided by its |o_i| under normalize='all': every mode zeroes through weights
    config = _actor_config(
        policy_loss=PolicyLossConfig(loss_mode="gpg"), loss_agg_mode="seq-mean-token-mean"
    )
    GMTSPolicyLoss(config, _settings(score="gmts", normalize="all"))
    with pytest.raises(ValueError, match="scope"):
        _settings(scope="group")
    with pytest.raises(ValueError, match="logit_grad_norm"):
        _settings(score="logit-grad")


def _verl_config(*overrides: str):
    """verl's own Hydra config (ppo_trainer.yaml) with command-line overrides."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def test_legacy_trainer_with_dapo_group_filtering_is_refused():
    """verl 0.9.1's legacy trainer never reads algorithm.filter_groups: refuse, don't drop it."""
    on = "algorithm.filter_groups.enable=true"
    with pytest.raises(ValueError, match="legacy trainer implements no group filtering"):
        plugin.check_trainer_config(_verl_config(on, "trainer.use_v1=false"))
    plugin.check_trainer_config(_verl_config(on))  # V1 (the default) filters
    plugin.check_trainer_config(_verl_config("trainer.use_v1=false"))


def test_driver_checks_the_actor_settings_before_ray_starts():
    """verl's composed Hydra config (a DictConfig): the workers' actor check, on the driver."""
    clip_cov = "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov"
    empty_band = "actor_rollout_ref.actor.policy_loss.clip_cov_lb=9.0"  # above ub = 5
    with pytest.raises(ValueError, match="clip_cov_lb must be < clip_cov_ub"):
        plugin.check_trainer_config(_verl_config(clip_cov, empty_band), _settings(score="gmts"))
    plugin.check_trainer_config(_verl_config(clip_cov), _settings(score="gmts"))
    plugin.check_trainer_config(_verl_config(clip_cov), _settings(score="entropy"))
    kl_full = [
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=full",
    ]
    with pytest.raises(ValueError, match="full next-token distributions"):
        plugin.check_trainer_config(_verl_config(*kl_full), _settings(score="entropy"))
    dro = "actor_rollout_ref.actor.policy_loss.loss_mode=dro"
    with pytest.raises(ValueError, match="dro_beta"):
        plugin.check_trainer_config(_verl_config(dro), _settings(score="entropy"))
    plugin.check_trainer_config(
        _verl_config(dro, "actor_rollout_ref.actor.policy_loss.dro_beta=0.1"), _settings()
    )
    plugin.check_trainer_config(_verl_config(clip_cov))  # no GMTS: verl's own business


@pytest.mark.slow
def test_launcher_refuses_dapo_on_the_legacy_trainer_before_ray_starts(tmp_path):
    """The shipped DAPO config with trainer.use_v1=false: verl's main_ppo stops in its config
    check (the plugin's validate_config hook), before ray.init."""
    config = vb.REPO / "configs" / "verl" / "qwen2.5-math-1.5b-dapo-gmts.yaml"
    cmd = [
        sys.executable, "-m", "gmts.integrations.verl", "--config", str(config),
        "trainer.use_v1=false", f"data.train_files={tmp_path}/x.parquet",
        f"data.val_files={tmp_path}/x.parquet",
    ]  # fmt: skip
    env = dict(os.environ, RAY_ADDRESS="127.0.0.1:1")  # a Ray start would fail differently
    # cwd: Hydra writes its outputs/ run folder into the working directory
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "legacy trainer implements no group filtering" in out, out[-3000:]
    assert "ray init kwargs" not in out


@pytest.mark.parametrize("config_file", sorted((vb.REPO / "configs" / "verl").glob("*.yaml")))
def test_shipped_configs_start_on_verl_v1_and_filter_groups_when_they_say(config_file):
    """Each shipped config, composed by verl's Hydra config, runs the V1 trainer (verl's
    default) and, for DAPO, resolves a group filter metric as V1's trainer does."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from gmts.integrations.verl.__main__ import build_command

    _, _, overrides, _ = build_command(["--config", str(config_file)])
    config = _verl_config(*overrides)
    assert config.trainer.use_v1 is True
    plugin.check_trainer_config(config)
    metric = PPOTrainer._resolve_filter_groups_metric(types.SimpleNamespace(config=config))
    assert (metric is not None) == ("dapo" in config_file.stem), metric


@pytest.mark.slow
def test_plugin_registers_through_the_verl_entry_point():
    """A fresh interpreter: importing verl loads our entry point, which registers itself."""
    code = (
        "import sys, verl\n"
        "assert 'gmts.integrations.verl.plugin' in sys.modules, 'entry point not loaded'\n"
        "from gmts.integrations.verl import plugin\n"
        "assert plugin.is_registered()\n"
        "assert plugin._finder in sys.meta_path\n"
        "assert set(plugin._pending) <= set(plugin.TARGETS)\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    env.pop("VERL_USE_EXTERNAL_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"  # verl's own switch: then nothing is loaded
    code_off = "import sys, verl\nprint('gmts.integrations.verl.plugin' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code_off], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("False"), out.stderr[-3000:]


def test_when_imported_patches_a_module_imported_later(tmp_path, monkeypatch):
    (tmp_path / "gmts_fake_target_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    plugin.when_imported("gmts_fake_target_mod", lambda module: seen.append(module.VALUE))
    assert seen == []
    import gmts_fake_target_mod  # noqa: F401

    assert seen == [1]
    plugin.when_imported("gmts_fake_target_mod", lambda module: seen.append(2))  # already there
    assert seen == [1, 2]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gmts_loss_function_pickles_for_ray(layout):
    import pickle

    loss_fn = GMTSPolicyLoss(_actor_config(), _settings(score="entropy", ratio=0.2))
    clone = pickle.loads(pickle.dumps(loss_fn))
    assert clone.settings == loss_fn.settings and clone.objective == loss_fn.objective
    answers, mini = _mini_batch(layout, 11)
    clone.prepare_mini_batch(_FakeEngine(answers), mini)
    loss, metrics = clone({"log_probs": vb.model_output(answers, mini)}, mini)
    n_valid = int(padded_response_fields(mini, ["response_mask"])["response_mask"].sum())
    assert torch.isfinite(loss)
    assert metrics["gmts/selected_fraction"] == pytest.approx(math.ceil(0.2 * n_valid) / n_valid)


def test_when_imported_handles_submodules_of_packages(tmp_path, monkeypatch):
    package = tmp_path / "gmts_fake_pkg"
    (package / "workers").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "workers" / "__init__.py").write_text("")
    (package / "workers" / "engine.py").write_text("class BaseEngine:\n    NAME = 'base'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    plugin.when_imported("gmts_fake_pkg.workers.engine", lambda m: seen.append(m.BaseEngine.NAME))
    import gmts_fake_pkg.workers.engine as engine_module

    assert seen == ["base"]
    assert engine_module.__spec__.name == "gmts_fake_pkg.workers.engine"
    assert "gmts_fake_pkg.workers.engine" not in plugin._pending


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_verl_selection_is_global_over_data_parallel_ranks(layout, tmp_path, free_port):
    """2 gloo ranks with half a mini-batch each == one process with all of it (masks, S and
    gradients after verl's data-parallel gradient averaging), for vanilla, geo_mean and sapo."""
    worker = Path(__file__).with_name("verl_two_rank_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(free_port), str(worker), str(tmp_path), layout,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert set(results[0]) == {"vanilla", "geo_mean", "sapo"}
    for mode in results[0]:  # the loss modes of verl_two_rank_worker.LOSS_MODES
        ranks = [results[0][mode], results[1][mode]]
        reference = ranks[0]["reference"]
        assert ranks[0]["nested"] == (layout == "v1")
        both = torch.cat([ranks[0]["selected"], ranks[1]["selected"]])
        assert torch.equal(both, reference["selected"]), mode
        assert ranks[0]["num_selected"] == ranks[1]["num_selected"] == reference["num_selected"]
        # FSDP averages gradients over the 2 ranks: (sum of per-rank gradients) / dp_size
        grads = (ranks[0]["grad"] + ranks[1]["grad"]) / 2
        torch.testing.assert_close(grads, reference["grad"], rtol=1e-6, atol=1e-9, msg=mode)
        torch.testing.assert_close(
            (ranks[0]["loss"] + ranks[1]["loss"]) / 2, reference["loss"], rtol=1e-6, atol=1e-9
        )
