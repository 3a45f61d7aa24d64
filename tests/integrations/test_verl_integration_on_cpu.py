"""GMTS inside verl's engine-worker loss path, on CPU with verl installed (no Ray, no GPU)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import sys
import types

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos")
pytest.importorskip("verl.workers.utils.losses")

from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from gmts.core import LossConfig, SelectionConfig, policy_loss, select_for_update  # noqa: E402
from gmts.integrations.verl import plugin  # noqa: E402
from gmts.integrations.verl.loss import (  # noqa: E402
    GMTSPolicyLoss,
    gmts_ppo_loss,
    objective_from_actor_config,
    prepare_selection,
)
from gmts.integrations.verl.settings import ENV_VAR, GMTSVerlSettings  # noqa: E402

P, R = 5, 6  # prompt and response widths


def _actor_config(**overrides) -> ActorConfig:
    kwargs = dict(
        strategy="fsdp",
        rollout_n=1,
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


def _batch(seed: int = 0, rows: int = 6):
    """verl's actor mini-batch layout after left_right_2_no_padding.

    Left-padded prompts and right-padded responses in ``attention_mask`` (B, P + R); padded
    ``(B, R)`` response fields; the model's log-probs/entropies as one packed (total_nnz,) leaf
    over the valid prompt + response tokens (what the engine returns, shifted by one).
    """
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(2, P + 1, (rows,), generator=g)
    response_lens = torch.randint(1, R + 1, (rows,), generator=g)
    response_lens[0] = R
    attention_mask = torch.zeros(rows, P + R, dtype=torch.long)
    for i in range(rows):
        attention_mask[i, P - prompt_lens[i] : P] = 1  # left padding
        attention_mask[i, P : P + response_lens[i]] = 1  # right padding
    response_mask = attention_mask[:, P:].clone()
    adv_rows = torch.randn(rows, generator=g)
    data = TensorDict(
        {
            "prompts": torch.randint(0, 50, (rows, P), generator=g),
            "responses": torch.randint(0, 50, (rows, R), generator=g),
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "old_log_probs": -1.5 + 0.4 * torch.randn(rows, R, generator=g),
            "advantages": adv_rows[:, None].expand(rows, R).clone(),
            "ref_log_prob": -1.5 + 0.4 * torch.randn(rows, R, generator=g),
        },
        batch_size=[rows],
    )
    n_valid = int(response_mask.sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_valid, global_batch_size=rows)
    total = int(attention_mask.sum())
    flat_logprobs = (-1.5 + 0.4 * torch.randn(total, generator=g)).requires_grad_(True)
    flat_entropy = (1.0 + torch.rand(total, generator=g)).requires_grad_(True)
    return data, flat_logprobs, flat_entropy


def _padded_stats(data, flat):
    from verl.workers.utils.padding import no_padding_2_padding

    return no_padding_2_padding(flat, data)


def _settings(**selection) -> GMTSVerlSettings:
    return GMTSVerlSettings(selection=SelectionConfig(**selection))


def _value_and_grad(fn, *leaves):
    for leaf in leaves:
        leaf.grad = None
    loss, metrics = fn()
    loss.backward()
    return loss.detach(), [leaf.grad.clone() for leaf in leaves], metrics


@pytest.mark.parametrize(
    "agg,normalize,entropy_coeff,use_kl",
    [
        ("token-mean", "selected", 0.0, True),
        ("token-mean", "selected", 0.01, False),
        ("seq-mean-token-mean", "all", 0.0, True),
        ("seq-mean-token-sum", "all", 0.01, True),
    ],
)
def test_ratio_one_equals_verl_ppo_loss(agg, normalize, entropy_coeff, use_kl):
    """ratio=1.0: the GMTS loss is verl's vanilla ppo_loss (values and gradients)."""
    config = _actor_config(loss_agg_mode=agg, entropy_coeff=entropy_coeff, use_kl_loss=use_kl)
    settings = _settings(score="gmts", ratio=1.0, normalize=normalize)
    for seed in (0, 1, 2):
        data, flat_lp, flat_ent = _batch(seed)
        output = {"log_probs": flat_lp}
        if entropy_coeff:
            output["entropy"] = flat_ent
        current = _padded_stats(data, flat_lp.detach())
        entropy = _padded_stats(data, flat_ent.detach())
        prepare_selection(
            data, settings, objective_from_actor_config(config), logprobs=current, entropy=entropy
        )
        assert torch.equal(data["gmts_selected"], data["response_mask"].bool())
        leaves = (flat_lp, flat_ent) if entropy_coeff else (flat_lp,)
        ref_fn = functools.partial(ppo_loss, config, output, data)
        ref_loss, ref_grads, _ = _value_and_grad(ref_fn, *leaves)
        fn = functools.partial(gmts_ppo_loss, config, output, data, settings=settings)
        loss, grads, _ = _value_and_grad(fn, *leaves)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-8)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def _core_eq2_loss(data, flat_lp, objective, selected, kl_tokens, kl_coef):
    """The core's eq. 2 loss on the padded tensors (the oracle for verl's path)."""
    mask = data["response_mask"].bool()
    objective = dataclasses.replace(objective, kl_coef=kl_coef)
    return policy_loss(
        _padded_stats(data, flat_lp),
        data["old_log_probs"],
        data["advantages"],
        mask,
        LossConfig(objective, normalize="selected", kl_tokens=kl_tokens),
        ref_logprobs=data["ref_log_prob"],
        selected=selected,
    )


@pytest.mark.parametrize("kl_tokens", ["selected", "all"])
def test_selection_on_verl_layout_matches_core_eq2(kl_tokens):
    """Exactly ceil(rho N) response tokens (never prompt or padding), and verl's loss on them
    equals the core's eq.-2 policy_loss with verl's dual clip and clamped k3 KL."""
    config = _actor_config()
    rho = 0.3
    settings = _settings(score="gmts", ratio=rho, kl_tokens=kl_tokens)
    objective = objective_from_actor_config(config)
    assert (objective.dual_clip, objective.kl_clamp, objective.clip_high) == (3.0, 10.0, 0.28)
    for seed in (0, 1, 2, 3):
        data, flat_lp, flat_ent = _batch(seed)
        current = _padded_stats(data, flat_lp.detach())  # (B, R) from the packed layout
        entropy = _padded_stats(data, flat_ent.detach())
        prepare_selection(data, settings, objective, logprobs=current, entropy=entropy)
        mask = data["response_mask"].bool()
        selected = data["gmts_selected"]
        n_valid = int(mask.sum())
        assert selected.shape == (6, R) and selected.dtype == torch.bool
        assert not (selected & ~mask).any()  # padding never selected
        assert int(selected.sum()) == math.ceil(rho * n_valid)
        assert tu.get_non_tensor_data(data, "gmts_num_selected", None) == math.ceil(rho * n_valid)

        output = {"log_probs": flat_lp}
        fn = functools.partial(gmts_ppo_loss, config, output, data, settings=settings)
        loss, (grad,), metrics = _value_and_grad(fn, flat_lp)
        core_fn = functools.partial(
            _core_eq2_loss, data, flat_lp, objective, selected, kl_tokens, config.kl_loss_coef
        )
        want, (want_grad,), _ = _value_and_grad(core_fn, flat_lp)
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)
        assert metrics["gmts/selected_fraction"] == pytest.approx(selected.sum().item() / n_valid)


def test_micro_batches_in_any_row_order_sum_to_the_mini_batch_loss():
    """The mask travels with its rows through verl's reordering; S is global to the mini-batch."""
    config = _actor_config()
    settings = _settings(score="gmts", ratio=0.25)
    data, flat_lp, flat_ent = _batch(5, rows=6)
    prepare_selection(
        data,
        settings,
        objective_from_actor_config(config),
        logprobs=_padded_stats(data, flat_lp.detach()),
        entropy=_padded_stats(data, flat_ent.detach()),
    )
    fn = functools.partial(gmts_ppo_loss, config, {"log_probs": flat_lp}, data, settings=settings)
    full, _, _ = _value_and_grad(fn, flat_lp)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), data["attention_mask"].sum(1).cumsum(0)])
    total = torch.zeros(())
    for rows in ([3, 0, 4], [5, 1, 2]):
        micro = tu.index_select_tensor_dict(data, torch.tensor(rows))
        packed = torch.cat([flat_lp.detach()[offsets[i] : offsets[i + 1]] for i in rows])
        loss, _ = gmts_ppo_loss(config, {"log_probs": packed}, micro, settings=settings)
        total = total + loss.detach()
    torch.testing.assert_close(total, full, rtol=1e-6, atol=1e-8)


class _FakeEngine:
    """Stands in for a verl engine: infer_batch returns 'current' statistics."""

    def __init__(self, flat_logprobs, flat_entropy):
        self.flat_logprobs = flat_logprobs
        self.flat_entropy = flat_entropy
        self.infer_calls = 0
        self.trained_on = None

    def get_data_parallel_group(self):
        return None

    def infer_batch(self, data, loss_function=None):
        assert tu.get_non_tensor_data(data, "calculate_entropy", None) is True
        self.infer_calls += 1
        return {"model_output": {"log_probs": self.flat_logprobs, "entropy": self.flat_entropy}}

    def train_batch(self, data, loss_function):
        self.trained_on = data
        return "trained"


def test_engine_hook_runs_the_exact_pass_before_micro_batching(monkeypatch):
    fake_base = types.ModuleType("fake_engine_base")
    fake_base.BaseEngine = _FakeEngine
    monkeypatch.setattr(_FakeEngine, "train_batch", _FakeEngine.train_batch)
    plugin.patch_base_engine(fake_base)
    plugin.patch_base_engine(fake_base)  # idempotent
    assert getattr(_FakeEngine.train_batch, "__gmts_patched__", False)

    config = _actor_config()
    settings = _settings(score="gmts", ratio=0.3)
    data, flat_lp, flat_ent = _batch(7)
    tu.assign_non_tensor(data, calculate_entropy=False)
    engine = _FakeEngine(flat_lp.detach(), flat_ent.detach())
    loss_fn = GMTSPolicyLoss(config, settings)
    assert engine.train_batch(data, loss_function=loss_fn) == "trained"
    assert engine.infer_calls == 1
    assert tu.get_non_tensor_data(data, "calculate_entropy", None) is False  # restored
    want = select_for_update(
        settings.selection,
        loss_fn.objective,
        logprobs=_padded_stats(data, flat_lp.detach()),
        old_logprobs=data["old_log_probs"],
        advantages=data["advantages"],
        response_mask=data["response_mask"].bool(),
        entropy=_padded_stats(data, flat_ent.detach()),
        ref_logprobs=data["ref_log_prob"],
    ).selected
    assert torch.equal(engine.trained_on["gmts_selected"], want)

    # any other loss function passes through untouched
    other = _FakeEngine(flat_lp.detach(), flat_ent.detach())
    plain, _, _ = _batch(8)
    other.train_batch(plain, loss_function=functools.partial(ppo_loss, config=config))
    assert other.infer_calls == 0 and "gmts_selected" not in plain


def test_missing_selection_raises_when_training_but_not_in_forward_only_evaluation():
    config = _actor_config()
    settings = _settings(score="gmts", ratio=0.3)
    data, flat_lp, _ = _batch(4)
    with pytest.raises(ValueError, match="gmts_selected"):
        gmts_ppo_loss(config, {"log_probs": flat_lp}, data, settings=settings)
    with torch.no_grad():
        loss, _ = gmts_ppo_loss(config, {"log_probs": flat_lp}, data, settings=settings)
        want, _ = ppo_loss(config, {"log_probs": flat_lp}, data)
    torch.testing.assert_close(loss, want)


def test_rollout_score_inputs_skip_the_extra_pass():
    settings = GMTSVerlSettings(
        selection=SelectionConfig(score="omega", ratio=0.5), score_inputs="rollout"
    )
    data, flat_lp, flat_ent = _batch(9)
    engine = _FakeEngine(flat_lp.detach(), flat_ent.detach())
    GMTSPolicyLoss(_actor_config(), settings).prepare_mini_batch(engine, data)
    assert engine.infer_calls == 0
    assert int(data["gmts_selected"].sum()) == math.ceil(0.5 * int(data["response_mask"].sum()))
    with pytest.raises(ValueError, match="entropies"):
        GMTSVerlSettings(selection=SelectionConfig(score="gmts"), score_inputs="rollout")


def test_set_loss_fn_hook_swaps_only_verl_actor_ppo_loss(monkeypatch):
    class FakeWorker:
        def set_loss_fn(self, loss_fn):
            self.loss_fn = loss_fn

    module = types.ModuleType("fake_engine_workers")
    module.TrainingWorker = FakeWorker
    plugin.patch_training_worker(module)
    config = _actor_config()
    verl_loss = functools.partial(ppo_loss, config=config)

    monkeypatch.delenv(ENV_VAR, raising=False)
    worker = FakeWorker()
    worker.set_loss_fn(verl_loss)
    assert worker.loss_fn is verl_loss  # no settings: verl unchanged

    monkeypatch.setenv(ENV_VAR, _settings(score="entropy", ratio=0.2).to_env_value(encoded=True))
    worker.set_loss_fn(verl_loss)
    assert isinstance(worker.loss_fn, GMTSPolicyLoss)
    assert worker.loss_fn.settings.selection.score == "entropy"
    assert worker.loss_fn.config is config
    other = functools.partial(gmts_ppo_loss, config=config)
    worker.set_loss_fn(other)
    assert worker.loss_fn is other


def test_actor_settings_gmts_cannot_honour_raise():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        GMTSPolicyLoss(_actor_config(loss_agg_mode="seq-mean-token-mean"), _settings())
    with pytest.raises(ValueError, match="kl_loss_type"):
        GMTSPolicyLoss(_actor_config(kl_loss_type="k1"), _settings())
    with pytest.raises(ValueError, match="loss_mode"):
        config = _actor_config(policy_loss=PolicyLossConfig(loss_mode="gpg"))
        GMTSPolicyLoss(config, _settings())
    with pytest.raises(ValueError, match="scope"):
        _settings(scope="group")
    with pytest.raises(ValueError, match="logit_grad_norm"):
        _settings(score="logit-grad")


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


def test_gmts_loss_function_pickles_for_ray():
    import pickle

    loss_fn = GMTSPolicyLoss(_actor_config(), _settings(score="entropy", ratio=0.2))
    clone = pickle.loads(pickle.dumps(loss_fn))
    assert clone.settings == loss_fn.settings and clone.objective == loss_fn.objective
    data, flat_lp, flat_ent = _batch(11)
    engine = _FakeEngine(flat_lp.detach(), flat_ent.detach())
    clone.prepare_mini_batch(engine, data)
    loss, metrics = clone({"log_probs": flat_lp}, data)
    n_valid = int(data["response_mask"].sum())
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
def test_verl_selection_is_global_over_data_parallel_ranks(tmp_path, free_port):
    """2 gloo ranks with half a mini-batch each == one process with all of it (masks, S and
    gradients after verl's data-parallel gradient averaging)."""
    from pathlib import Path

    worker = Path(__file__).with_name("verl_two_rank_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(free_port), str(worker), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    reference = ranks[0]["reference"]
    both = torch.cat([ranks[0]["selected"], ranks[1]["selected"]])
    assert torch.equal(both, reference["selected"])
    assert ranks[0]["num_selected"] == ranks[1]["num_selected"] == reference["num_selected"]
    # FSDP averages gradients over the 2 ranks: per-token gradient / dp_size == reference
    grads = torch.cat([ranks[0]["grad"], ranks[1]["grad"]]) / 2
    torch.testing.assert_close(grads, reference["grad"], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(
        (ranks[0]["loss"] + ranks[1]["loss"]) / 2, reference["loss"], rtol=1e-6, atol=1e-9
    )
