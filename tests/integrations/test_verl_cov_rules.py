"""Clip-Cov and KL-Cov (arXiv 2505.22617) against verl 0.9.1's own loss functions, and the
condition rules (STAPO, RSI-S) in the verl plugin.

Mini-batches and micro-batches are built with verl's own functions in both trainer layouts
(``verl_batches``). Checked here:

- the core objectives ``clip-cov`` and ``kl-cov`` (built from verl's actor config by the
  plugin) equal ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` on every
  micro-batch: loss and gradient, clip_cov's random draw included (verl draws from the global
  RNG: ``torch.manual_seed(s)`` before verl's call, ``pick_seed=s`` for the core), with verl's
  default parameters and with bands and ratios that pick many tokens, under rollout weights;
- GMTS on top in the plugin (an omega score): the pick is made once over the mini-batch before
  the selection; the selection is the core's with that pick, the loss summed over verl's
  micro-batches (dynamic sizes) is the core's ``policy_loss`` over the mini-batch with the same
  pick, and its gradient at ratio 1 is -omega / N: GMTS ranks by the coefficient of the loss
  actually optimised.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is installed in .venv-verl only")
pytest.importorskip("verl.workers.utils.losses", reason="verl is installed in .venv-verl only")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # verl_batches (not a package)

import verl_batches as vb  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

import gmts  # noqa: E402
from gmts.core import LossConfig, SelectionConfig, policy_loss, select_for_update  # noqa: E402
from gmts.core.objectives import ObjectiveInputs, objective_picks, objective_terms  # noqa: E402
from gmts.integrations.verl.loss import (  # noqa: E402
    PICKED_KEY,
    gmts_ppo_loss,
    objective_from_actor_config,
    padded_response_fields,
)
from gmts.integrations.verl.settings import GMTSVerlSettings  # noqa: E402

LAYOUTS = sorted(vb.BUILDERS)
ROW_MEAN = "seq-mean-token-mean"
# verl's defaults (its config: ratio 0.0002, band (1, 5), ppo_kl_coef 0.1), and parameters that
# pick many tokens of these small batches
CASES = {
    "clip_cov-defaults": {"loss_mode": "clip_cov"},
    "clip_cov-wide": {
        "loss_mode": "clip_cov",
        "clip_cov_ratio": 0.3,
        "clip_cov_lb": -0.05,
        "clip_cov_ub": 0.3,
    },
    "kl_cov-defaults": {"loss_mode": "kl_cov"},
    "kl_cov-wide": {"loss_mode": "kl_cov", "kl_cov_ratio": 0.3, "ppo_kl_coef": 0.7},
}
VERL_FUNCTIONS = {"clip_cov": "clip_cov", "kl_cov": "kl_cov"}


def _config(case: str, **more):
    return vb.actor_config(policy_loss=dict(CASES[case]), use_kl_loss=False, **more)


def _micro_fields(answers, micro, leaf):
    """A micro-batch's padded fields and its current log-probs from ``leaf`` (with grad)."""
    keys = ["response_mask", "old_log_probs", "advantages", "rollout_is_weights"]
    fields = padded_response_fields(micro, keys)
    log_prob = no_padding_2_padding(vb.model_output(answers, micro, leaf=leaf), micro)
    return fields, log_prob


def _aggregate(values, mask, mode):
    """verl's agg_loss of one micro-batch on one rank (token-mean / seq-mean-token-mean)."""
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum()
    rows = (values * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    return rows[mask.sum(-1) > 0].mean()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("agg", ["token-mean", ROW_MEAN])
@pytest.mark.parametrize("case", sorted(CASES))
def test_core_objective_equals_verls_own_function(case, agg, layout):
    config = _config(case, loss_agg_mode=agg)
    objective = objective_from_actor_config(config)
    assert objective.name == CASES[case]["loss_mode"].replace("_", "-")
    verl_fn = get_policy_loss_fn(CASES[case]["loss_mode"])
    picked_somewhere, compared, ties = False, 0, 0
    for seed in (0, 1, 2):
        answers, mini = vb.mini_batch(layout, seed, rollout_is_weights=True)
        micros = [*vb.micro_batches(mini, micro_batch_size=3), mini]  # several rows each
        for i, micro in enumerate(micros):
            draw = 100 * seed + i
            theirs, ours = vb.leaves(answers, True)[0], vb.leaves(answers, True)[0]
            fields, log_prob = _micro_fields(answers, micro, theirs)
            mask, weights = fields["response_mask"], fields["rollout_is_weights"]
            config.global_batch_info.clear()  # one micro-batch on one rank: its own counts
            torch.manual_seed(draw)
            want, _ = verl_fn(
                old_log_prob=fields["old_log_probs"],
                log_prob=log_prob,
                advantages=fields["advantages"],
                response_mask=mask,
                loss_agg_mode=agg,
                config=config,
                rollout_is_weights=weights,
            )
            want.backward()

            fields, log_prob = _micro_fields(answers, micro, ours)
            inputs = ObjectiveInputs.of(
                log_prob,
                fields["old_log_probs"],
                fields["advantages"],
                mask.bool(),
                importance_weights=weights,
                pick_seed=draw,
            )
            parts = objective_terms(objective, inputs)
            got = _aggregate(-parts.surrogate, mask.bool(), agg)
            got.backward()
            picks = objective_picks(objective, inputs, seed=draw)
            picked_somewhere |= bool(picks.any())
            if objective.name == "kl-cov" and _tied_at_the_cut(inputs, picks):
                # verl's torch.topk takes any of the tied tokens, the core the earliest: the
                # same loss only up to which tied token carries the penalty (a micro-batch
                # whose tokens share one advantage has every c_t = 0)
                ties += 1
                continue
            compared += 1
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
            torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=1e-8)
    assert picked_somewhere  # (verl's default band (1, 5) too, on a whole mini-batch)
    assert compared >= 3 * ties  # most micro-batches are compared exactly


def _tied_at_the_cut(inputs: ObjectiveInputs, picks: torch.Tensor) -> bool:
    """Whether a kl-cov pick has an unpicked valid token whose covariance equals the smallest
    picked one (then torch.topk's choice among them is unspecified)."""
    mask, adv, lp = inputs.mask, inputs.advantages, inputs.logprobs.detach()
    cov = (adv - adv[mask].mean()) * (lp - lp[mask].mean())
    return bool(picks.any()) and bool((cov[mask & ~picks] == cov[picks].min()).any())


def test_the_wide_cases_pick_tokens_that_carry_gradient():
    """The premise of the comparisons: the pick changes the gradient in these batches."""
    for case in ("clip_cov-wide", "kl_cov-wide"):
        objective = objective_from_actor_config(_config(case))
        answers, mini = vb.mini_batch("v1", 0, rollout_is_weights=True)
        x = _inputs(answers, mini)
        picks = objective_picks(objective, x, seed=0)
        args = (objective, x.logprobs, x.old_logprobs, x.advantages, x.mask)
        omega = gmts.gradient_coefficient(*args, picked=picks)
        unpicked = gmts.gradient_coefficient(*args, picked=torch.zeros_like(picks))
        assert 0 < int(picks.sum()) < int(x.mask.sum()) // 2, case
        assert bool((omega != unpicked)[picks].all()), case  # the pick changes their gradient
        assert torch.equal(omega[x.mask & ~picks], unpicked[x.mask & ~picks]), case


# ------------------------------------------------------------- GMTS on top in the plugin


def _inputs(answers, mini) -> ObjectiveInputs:
    fields = padded_response_fields(
        mini, ["response_mask", "old_log_probs", "advantages", "rollout_is_weights"]
    )
    return ObjectiveInputs.of(
        vb.current_padded(answers, mini),
        fields["old_log_probs"].float(),
        fields["advantages"].float(),
        fields["response_mask"].bool(),
        importance_weights=fields["rollout_is_weights"].float(),
    )


def _settings(**selection) -> GMTSVerlSettings:
    return GMTSVerlSettings(selection=SelectionConfig(**selection))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("normalize", ["selected", "all"])
@pytest.mark.parametrize("case", ["clip_cov-wide", "kl_cov-wide"])
def test_gmts_on_top_is_the_core_with_the_mini_batch_pick(case, normalize, layout):
    config = _config(case)
    objective = objective_from_actor_config(config)
    settings = _settings(score="gmts", ratio=0.3, normalize=normalize, seed=5)
    for seed in (0, 1):
        answers, mini = vb.mini_batch(layout, seed, rollout_is_weights=True)
        vb.select(mini, answers, settings, config)  # step 0: the draw's seed is 5 + 0
        x = _inputs(answers, mini)
        picks = objective_picks(objective, x, seed=5)
        stored = padded_response_fields(mini, [PICKED_KEY, "gmts_selected"])
        assert torch.equal(stored[PICKED_KEY], picks)
        want_selected = select_for_update(
            settings.selection,
            objective,
            logprobs=x.logprobs,
            old_logprobs=x.old_logprobs,
            advantages=x.advantages,
            response_mask=x.mask,
            entropy=vb.current_padded(answers, mini, "current_entropy"),
            importance_weights=x.importance_weights,
            picked=picks,
        ).selected
        assert torch.equal(stored["gmts_selected"], want_selected)

        leaves = vb.leaves(answers)
        loss_fn = functools.partial(gmts_ppo_loss, config, settings=settings)
        got, (grad,), _ = vb.loss_over_micro_batches(
            loss_fn,
            mini,
            answers,
            leaves,
            max_token_len=12,
            seed=123,  # the RNG is not read
        )
        leaf = x.logprobs.clone().requires_grad_(True)
        want, _ = policy_loss(
            leaf,
            x.old_logprobs,
            x.advantages,
            x.mask,
            LossConfig.of(objective, settings.selection),
            selected=want_selected,
            importance_weights=x.importance_weights,
            picked=picks,
        )
        want.backward()
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(
            vb.flat_to_padded(answers, mini, grad), leaf.grad, rtol=1e-5, atol=1e-7
        )


@pytest.mark.parametrize("case", ["clip_cov-wide", "kl_cov-wide"])
def test_the_plugin_loss_gradient_is_minus_omega_over_n_at_ratio_one(case):
    """Every token selected (ratio 1, zero scores kept), eq. 2: the plugin's gradient over
    dynamic micro-batches is -omega / N, omega computed with the stored pick."""
    config = _config(case)
    objective = objective_from_actor_config(config)
    settings = _settings(score="gmts", ratio=1.0, zero_scores="select")
    answers, mini = vb.mini_batch("v1", 3, rollout_is_weights=True)
    vb.select(mini, answers, settings, config)
    x = _inputs(answers, mini)
    picks = padded_response_fields(mini, [PICKED_KEY])[PICKED_KEY]
    omega = gmts.gradient_coefficient(
        objective,
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        x.mask,
        importance_weights=x.importance_weights,
        picked=picks,
    )
    leaves = vb.leaves(answers)
    loss_fn = functools.partial(gmts_ppo_loss, config, settings=settings)
    _, (grad,), _ = vb.loss_over_micro_batches(loss_fn, mini, answers, leaves, max_token_len=12)
    n = int(x.mask.sum())
    torch.testing.assert_close(
        vb.flat_to_padded(answers, mini, grad), -omega / n, rtol=1e-5, atol=1e-8
    )
    assert int(picks.sum()) > 0


def test_an_entropy_score_leaves_the_pick_to_verl():
    """Without omega nothing is picked before the selection: verl's own function picks per
    micro-batch (tests/integrations/test_verl_loss_modes.py compares it with verl's loss)."""
    config = _config("clip_cov-wide")
    answers, mini = vb.mini_batch("legacy", 0)
    vb.select(mini, answers, _settings(score="entropy", ratio=0.3), config)
    assert PICKED_KEY not in mini and "gmts_selected" in mini


# ------------------------------------------------------- the condition rules in the plugin


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rule", ["stapo", "rsi"])
def test_condition_rules_select_in_verl_as_in_the_core(rule, layout):
    """STAPO / RSI-S through the plugin (score_inputs=current: the extra pass's log-probs and
    entropies) keep what the core keeps; without entropies (score_inputs=rollout) they are
    refused, naming the statistic."""
    config = vb.actor_config(use_kl_loss=False)
    objective = objective_from_actor_config(config)
    params = dict(stapo_prob_threshold=0.3) if rule == "stapo" else {}
    selection = SelectionConfig(score=rule, ratio=1.0, **params)
    kept_some = False
    for seed in (0, 1):
        answers, mini = vb.mini_batch(layout, seed, rollout_is_weights=True)
        vb.select(mini, answers, GMTSVerlSettings(selection=selection), config)
        x = _inputs(answers, mini)
        want = select_for_update(
            selection,
            objective,
            logprobs=x.logprobs,
            old_logprobs=x.old_logprobs,
            advantages=x.advantages,
            response_mask=x.mask,
            entropy=vb.current_padded(answers, mini, "current_entropy"),
        ).selected
        got = padded_response_fields(mini, ["gmts_selected"])["gmts_selected"]
        assert torch.equal(got, want)
        kept_some |= 0 < int(got.sum()) < int(x.mask.sum())
    assert kept_some
    with pytest.raises(ValueError, match="reads entropy"):
        GMTSVerlSettings(selection=selection, score_inputs="rollout")
