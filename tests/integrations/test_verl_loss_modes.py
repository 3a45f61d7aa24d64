"""GMTS with every verl 0.9.1 policy loss mode and KL type, against verl's own loss functions.

Mini-batches are built with verl's own functions in both trainer layouts (``verl_batches``).
For each loss mode and KL type GMTS composes with:

- ratio 1 with zero scores selected (every valid token): the GMTS loss summed over verl's
  micro-batches equals verl's own ``ppo_loss`` (which calls ``get_policy_loss_fn(loss_mode)``,
  ``kl_penalty`` and ``agg_loss``), values and gradients;
- omega of the matching core objective equals autograd of verl's own loss with respect to the
  log-probs (``gmts.loss_omega``), divided by that loss's aggregation weight of each token;
- with a real selection, the plugin selects what the core selects with that objective and its
  loss equals the core's ``policy_loss`` (the oracle);
- with scores that need no omega, verl's own function picks (clip_cov, kl_cov: per
  micro-batch, the draw included) or normalises (bypass_mode's batch-normalised IS weights, whose
  omega is not defined before the loss runs): each selected token's gradient is verl's own,
  divided by S instead of N; unselected tokens get none (clip_cov and kl_cov with an omega score:
  tests/integrations/test_verl_cov_rules.py);
- every refused combination raises with its reason.
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
from verl.workers.utils.losses import ppo_loss  # noqa: E402

import gmts  # noqa: E402
from gmts.core import LossConfig, SelectionConfig, policy_loss, select_for_update  # noqa: E402
from gmts.core.aggregation import get_aggregation  # noqa: E402
from gmts.integrations.verl.actor_config import KL_ESTIMATORS  # noqa: E402
from gmts.integrations.verl.loss import (  # noqa: E402
    GMTSPolicyLoss,
    gmts_ppo_loss,
    objective_from_actor_config,
    padded_response_fields,
)
from gmts.integrations.verl.loss_modes import (  # noqa: E402
    available_loss_modes,
    check_actor_config,
    get_loss_mode,
)
from gmts.integrations.verl.settings import GMTSVerlSettings  # noqa: E402

LAYOUTS = sorted(vb.BUILDERS)  # "legacy", "v1"
ROW_MEAN = "seq-mean-token-mean"


def _bypass(**rc):
    return {"policy_loss": {"loss_mode": "bypass_mode", "rollout_correction": rc}}


# loss mode cases whose omega is exact: id -> actor overrides (clip ranges chosen so that the
# trust regions act on some tokens of these batches and not on others)
OMEGA_CASES = {
    "vanilla": {},
    "vanilla-seq-mean-token-mean": {"loss_agg_mode": ROW_MEAN},
    "vanilla-dual-clip": {"clip_ratio_c": 1.05},  # acts on A < 0, r > 1.05
    "gspo": {"policy_loss": {"loss_mode": "gspo"}, "clip_ratio_low": 0.05, "clip_ratio_high": 0.08},
    "sapo": {"policy_loss": {"loss_mode": "sapo"}, "loss_agg_mode": ROW_MEAN, "tau_neg": 1.3},
    "cispo": {"policy_loss": {"loss_mode": "cispo"}, "clip_ratio_low": 0.1, "clip_ratio_high": 0.1},
    "geo_mean": {"policy_loss": {"loss_mode": "geo_mean"}, "loss_agg_mode": ROW_MEAN},
    "gpg": {"policy_loss": {"loss_mode": "gpg"}},
    "dppo_tv": {
        "policy_loss": {"loss_mode": "dppo_tv"},
        "clip_ratio_low": 0.04,
        "clip_ratio_high": 0.04,
        "clip_ratio_c": 1.2,
    },
    "dppo_kl": {
        "policy_loss": {"loss_mode": "dppo_kl"},
        "clip_ratio_low": 0.005,
        "clip_ratio_high": 0.005,
    },
    "dro": {"policy_loss": {"loss_mode": "dro", "dro_beta": 0.5}},
    "bypass-ppo_clip": _bypass(loss_type="ppo_clip", rollout_is=None),
    "bypass-ppo_clip-token-rs": _bypass(
        loss_type="ppo_clip", rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25"
    ),
    "bypass-reinforce-sequence-is": _bypass(
        loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=2.0
    ),
    "bypass-reinforce-token-is-rs": _bypass(
        loss_type="reinforce",
        rollout_is="token",
        rollout_is_threshold=1.1,
        rollout_rs="seq_mean_k2",
        rollout_rs_threshold=0.03,
    ),
}
# entropy scores with verl's own function: clip_cov and kl_cov pick per micro-batch (their
# omega-score path: test_verl_cov_rules.py); bypass_mode's batch-normalised weights have no omega
ENTROPY_CASES = {
    "clip_cov": {
        "policy_loss": {
            "loss_mode": "clip_cov",
            "clip_cov_ratio": 0.2,
            "clip_cov_lb": -10.0,
            "clip_cov_ub": 10.0,
        }
    },
    "kl_cov": {"policy_loss": {"loss_mode": "kl_cov", "kl_cov_ratio": 0.2, "ppo_kl_coef": 0.5}},
    "bypass-reinforce-batch-normalize": _bypass(
        loss_type="reinforce",
        rollout_is="token",
        rollout_is_threshold=1.3,
        rollout_is_batch_normalize=True,
    ),
}
KL_TYPES = sorted(KL_ESTIMATORS)
# verl's dppo_* evaluate pi_old = exp(old_log_probs) in the dtype of old_log_probs, bf16 under
# V1, for their trust regions; the core scores in float32. The exactness tests give these modes
# float32 old log-probs; test_dppo_with_bf16_old_log_probs_... pins down the difference.
FLOAT32_OLD = {"dppo_tv", "dppo_kl"}


def _mini_batch(case: str, layout: str, seed: int, **answer_kw):
    old_dtype = torch.float32 if case in FLOAT32_OLD else torch.bfloat16
    return vb.mini_batch(layout, seed, old_dtype=old_dtype, **answer_kw)


def _config(case: str, **more):
    overrides = {**OMEGA_CASES, **ENTROPY_CASES}[case]
    return vb.actor_config(**{**overrides, **more})


def _normalize_at_ratio_one(config) -> str:
    """'selected' is eq. 2's token-mean: verl's own loss at ratio 1 only for token-mean."""
    return "selected" if objective_from_actor_config(config).aggregation == "token-mean" else "all"


def _settings(**selection) -> GMTSVerlSettings:
    return GMTSVerlSettings(selection=SelectionConfig(**selection))


def _assert_ratio_one_equals_verl(config, score: str, layout: str, seed: int, seeded: bool = False):
    settings = _settings(
        score=score, ratio=1.0, zero_scores="select", normalize=_normalize_at_ratio_one(config)
    )
    answers, mini = vb.mini_batch(layout, seed, rollout_is_weights=seed % 2 == 1)  # verl's dtypes
    vb.select(mini, answers, settings, config)
    fields = padded_response_fields(mini, ["response_mask", "gmts_selected"])
    assert torch.equal(fields["gmts_selected"], fields["response_mask"].bool())
    rng = seed if seeded else None
    leaves = vb.leaves(answers)
    want, want_grads, _ = vb.loss_over_micro_batches(
        functools.partial(ppo_loss, config), mini, answers, leaves, True, 12, seed=rng
    )
    gmts_loss = functools.partial(gmts_ppo_loss, config, settings=settings)
    got, grads, _ = vb.loss_over_micro_batches(gmts_loss, mini, answers, leaves, True, 12, seed=rng)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-8)
    assert float(want_grads[0].abs().sum()) > 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", sorted(OMEGA_CASES))
def test_ratio_one_equals_verl_ppo_loss_for_every_loss_mode(case, layout):
    config = _config(case, entropy_coeff=0.01)
    for seed in (0, 1):
        _assert_ratio_one_equals_verl(config, "gmts", layout, seed)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", sorted(ENTROPY_CASES))
def test_ratio_one_equals_verl_ppo_loss_for_the_entropy_only_modes(case, layout):
    """clip_cov's random draw included: the same global RNG seed before both runs."""
    for seed in (0, 1):
        _assert_ratio_one_equals_verl(_config(case), "entropy", layout, seed, seeded=True)


@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_ratio_one_equals_verl_ppo_loss_for_every_kl_type(kl_type):
    config = vb.actor_config(kl_loss_type=kl_type, kl_loss_coef=0.3)
    for layout in LAYOUTS:
        _assert_ratio_one_equals_verl(config, "gmts", layout, seed=1)


def test_every_verl_loss_mode_is_known():
    """verl 0.9.1's PolicyLossConfig lists its loss modes; each is composed or refused here."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    assert set(POLICY_LOSS_REGISTRY) == set(available_loss_modes())
    tested = {_config(case).policy_loss.loss_mode for case in (*OMEGA_CASES, *ENTROPY_CASES)}
    assert tested == set(available_loss_modes())


# ------------------------------------------------------------------------------ omega


def _verl_omega(config, answers, mini):
    """-d (verl's own ppo_loss on the whole mini-batch) / d log pi, ``(B, R)``."""
    to_flat = vb.padded_to_flat(answers, mini)

    def verl_loss(padded):
        output = {"log_probs": vb.model_output(answers, mini, leaf=to_flat(padded))}
        return ppo_loss(config, output, mini)[0]

    current = vb.current_padded(answers, mini)
    return gmts.loss_omega(verl_loss, current, vb.padded_response_mask(mini))


def _core_inputs(config, answers, mini):
    """The core's inputs of the mini-batch (float32) and the importance weights the loss mode
    applies (the batch's, or bypass_mode's own from the current log-probs)."""
    keys = ["response_mask", "old_log_probs", "advantages", "ref_log_prob"]
    keys += [k for k in ("rollout_is_weights",) if k in mini]
    fields = padded_response_fields(mini, keys)
    mask = fields["response_mask"].bool()
    current = vb.current_padded(answers, mini)
    old = fields["old_log_probs"].float()
    weights = get_loss_mode(config.policy_loss.loss_mode).importance_weights(
        config, current, old, mask, fields.get("rollout_is_weights", None)
    )
    return {
        "logprobs": current,
        "old_logprobs": old,
        "advantages": fields["advantages"].float(),
        "mask": mask,
        "ref_logprobs": fields["ref_log_prob"].float(),
        "importance_weights": weights,
    }


def _assert_omega_is_verls(case, config, layout, **answer_kw):
    objective = objective_from_actor_config(config)
    for seed in (0, 1, 2):
        answers, mini = _mini_batch(case, layout, seed, rollout_is_weights=True, **answer_kw)
        x = _core_inputs(config, answers, mini)
        omega = gmts.gradient_coefficient(
            objective,
            x["logprobs"],
            x["old_logprobs"],
            x["advantages"],
            x["mask"],
            ref_logprobs=x["ref_logprobs"],
            importance_weights=x["importance_weights"],
        )
        aggregation = get_aggregation(objective.aggregation)
        divisor = mini["batch_num_tokens"] if aggregation.divisor == "tokens" else len(mini)
        weight = aggregation.token_weights(x["mask"]).float() / divisor
        verl = _verl_omega(config, answers, mini)
        torch.testing.assert_close(omega * weight, verl, rtol=1e-5, atol=1e-8)
        assert float((verl != 0).float().mean()) > 0.3  # most tokens carry a gradient


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", sorted(OMEGA_CASES))
def test_omega_is_autograd_of_verl_own_loss(case, layout):
    """omega of the core objective (analytic) == -d verl_loss / d log pi divided by the
    token's aggregation weight (1/N token-mean; 1/(rows |o_i|) seq-mean-token-mean, which is
    also what geo_mean's mean over rows gives)."""
    _assert_omega_is_verls(case, _config(case), layout)


@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_omega_is_autograd_of_verl_own_loss_for_every_kl_type(kl_type):
    """The KL part: verl's kl_penalty (its '+' straight-through, low_var_kl's clamp at 10,
    here reached by a large reference gap) as the core's estimator."""
    config = vb.actor_config(kl_loss_type=kl_type, kl_loss_coef=0.3)
    for layout in LAYOUTS:
        _assert_omega_is_verls("vanilla", config, layout, far_reference=True)


# ------------------------------------------------------------------------- the oracle


def _oracle_cases():
    for case in sorted(OMEGA_CASES):
        for normalize in ("selected", "all"):
            yield case, normalize


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case,normalize", list(_oracle_cases()))
def test_selection_and_loss_equal_the_core_with_the_matching_objective(case, normalize, layout):
    """rho = 0.3, score gmts: the plugin's selection == the core's select_for_update with the
    objective and weights of the loss mode, and its loss summed over verl's micro-batches
    (dynamic sizes) == the core's policy_loss on the whole mini-batch (values, gradients).
    geo_mean under normalize='all' keeps verl's mean over each micro-batch's rows, which the
    core's mini-batch loss is only for a mini-batch of one micro-batch."""
    config = _config(case)
    objective = objective_from_actor_config(config)
    settings = _settings(score="gmts", ratio=0.3, normalize=normalize, kl_tokens="selected")
    one_micro = case == "geo_mean" and normalize == "all"
    for seed in (0, 1):
        answers, mini = _mini_batch(case, layout, seed, rollout_is_weights=True)
        vb.select(mini, answers, settings, config)
        x = _core_inputs(config, answers, mini)
        entropy = vb.current_padded(answers, mini, "current_entropy")
        want_selected = select_for_update(
            settings.selection,
            objective,
            logprobs=x["logprobs"],
            old_logprobs=x["old_logprobs"],
            advantages=x["advantages"],
            response_mask=x["mask"],
            entropy=entropy,
            ref_logprobs=x["ref_logprobs"],
            importance_weights=x["importance_weights"],
        ).selected
        selected = padded_response_fields(mini, ["gmts_selected"])["gmts_selected"]
        assert torch.equal(selected, want_selected)

        leaves = vb.leaves(answers)
        loss_fn = functools.partial(gmts_ppo_loss, config, settings=settings)
        got, (grad,), _ = vb.loss_over_micro_batches(
            loss_fn,
            mini,
            answers,
            leaves,
            max_token_len=None if one_micro else 12,
            micro_batch_size=len(mini) if one_micro else 2,
        )
        leaf = x["logprobs"].clone().requires_grad_(True)
        want, _ = policy_loss(
            leaf,
            x["old_logprobs"],
            x["advantages"],
            x["mask"],
            LossConfig.of(objective, settings.selection),
            selected=selected,
            ref_logprobs=x["ref_logprobs"],
            importance_weights=x["importance_weights"],
        )
        want.backward()
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(
            vb.flat_to_padded(answers, mini, grad), leaf.grad, rtol=1e-5, atol=1e-7
        )


def test_dppo_with_bf16_old_log_probs_differs_only_where_bf16_flips_the_trust_region():
    """V1's bf16 old log-probs: verl's dppo_tv tests |pi - pi_old| against its thresholds with
    pi_old rounded to bf16; omega (float32) disagrees with autograd of verl's loss exactly at the
    tokens whose trust-region membership that rounding flips, and agrees everywhere else."""
    config = _config("dppo_tv")
    objective = objective_from_actor_config(config)
    low, high = config.clip_ratio_low, config.clip_ratio_high
    flipped_somewhere = False
    for seed in (0, 1, 2):
        answers, mini = vb.mini_batch("v1", seed, rollout_is_weights=True)
        x = _core_inputs(config, answers, mini)
        omega = gmts.gradient_coefficient(
            objective, x["logprobs"], x["old_logprobs"], x["advantages"], x["mask"],
            ref_logprobs=x["ref_logprobs"], importance_weights=x["importance_weights"],
        )  # fmt: skip
        verl = _verl_omega(config, answers, mini)
        old_bf16 = padded_response_fields(mini, ["old_log_probs"])["old_log_probs"]
        assert old_bf16.dtype == torch.bfloat16

        positive, current = x["advantages"] > 0, x["logprobs"].exp()
        in_bf16, in_fp32 = current - old_bf16.exp(), current - x["old_logprobs"].exp()
        flips = torch.where(positive, in_bf16 <= high, in_bf16 >= -low) != torch.where(
            positive, in_fp32 <= high, in_fp32 >= -low
        )
        flips &= x["mask"]
        differs = ~torch.isclose(omega / int(x["mask"].sum()), verl, rtol=1e-5, atol=1e-8)
        assert torch.equal(differs, flips)
        flipped_somewhere |= bool(flips.any())
    assert flipped_somewhere  # the case this test is about occurs in these batches


@pytest.mark.parametrize("layout", LAYOUTS)
def test_geo_mean_normalize_all_keeps_verls_mean_over_each_micro_batch(layout):
    """Two micro-batches of equal size: verl's geo_mean (and GMTS with normalize='all') is twice
    the core's mini-batch seq-mean-token-mean (verl divides by each micro-batch's rows)."""
    config = _config("geo_mean", use_kl_loss=False)
    settings = _settings(score="gmts", ratio=0.3, normalize="all")
    answers, mini = vb.mini_batch(layout, 3)
    vb.select(mini, answers, settings, config)
    loss_fn = functools.partial(gmts_ppo_loss, config, settings=settings)
    leaves = vb.leaves(answers)
    two, _, _ = vb.loss_over_micro_batches(loss_fn, mini, answers, leaves, micro_batch_size=3)
    one, _, _ = vb.loss_over_micro_batches(loss_fn, mini, answers, leaves, micro_batch_size=6)
    torch.testing.assert_close(two, 2 * one, rtol=1e-5, atol=1e-8)


# ------------------------------------------------- the modes without omega: entropy scores


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", sorted(ENTROPY_CASES))
def test_entropy_selection_composes_with_verl_own_loss(case, layout):
    """score=entropy, rho = 0.3, eq. 2: each selected token's gradient is the one verl's own
    loss gives it on the same micro-batches (same draw), times N / S; the others get none."""
    config = _config(case, use_kl_loss=False)
    settings = _settings(score="entropy", ratio=0.3)
    for seed in (0, 1):
        answers, mini = vb.mini_batch(layout, seed, rollout_is_weights=True)
        vb.select(mini, answers, settings, config)
        fields = padded_response_fields(mini, ["response_mask", "gmts_selected"])
        mask, selected = fields["response_mask"].bool(), fields["gmts_selected"]
        n_valid, n_selected = int(mask.sum()), int(selected.sum())
        leaves = vb.leaves(answers)
        verl_fn = functools.partial(ppo_loss, config)
        _, (verl_grad,), _ = vb.loss_over_micro_batches(
            verl_fn, mini, answers, leaves, max_token_len=12, seed=seed
        )
        gmts_fn = functools.partial(gmts_ppo_loss, config, settings=settings)
        _, (grad,), _ = vb.loss_over_micro_batches(
            gmts_fn, mini, answers, leaves, max_token_len=12, seed=seed
        )
        got = vb.flat_to_padded(answers, mini, grad)
        want = vb.flat_to_padded(answers, mini, verl_grad) * n_valid / n_selected
        torch.testing.assert_close(got[selected], want[selected], rtol=1e-5, atol=1e-8)
        assert not got[mask & ~selected].any()
        assert bool((want[selected] != 0).any())


def test_clip_cov_draw_acts_in_these_batches():
    """The premise of the clip_cov cases: verl's draw zeroes some tokens' gradient."""
    config = _config("clip_cov", use_kl_loss=False)
    answers, mini = vb.mini_batch("v1", 0)
    leaves = vb.leaves(answers)
    fn = functools.partial(ppo_loss, config)
    _, (with_draw,), _ = vb.loss_over_micro_batches(fn, mini, answers, leaves, seed=0)
    plain = vb.actor_config(use_kl_loss=False, clip_ratio_c=1e9)  # vanilla, no dual clip
    _, (without,), _ = vb.loss_over_micro_batches(
        functools.partial(ppo_loss, plain), mini, answers, leaves
    )
    mask = vb.padded_response_mask(mini)
    drawn = (vb.flat_to_padded(answers, mini, with_draw) == 0) & mask
    assert int(drawn.sum()) > int(((vb.flat_to_padded(answers, mini, without) == 0) & mask).sum())


# --------------------------------------------------------------------------- refusals


REFUSED = [
    ("vanilla", {"kl_loss_type": "full"}, {"score": "entropy"}, "full next-token distributions"),
    ("vanilla", {"kl_loss_type": "k7"}, {"score": "entropy"}, "not one of verl 0.9.1's KL types"),
    (
        "bypass-ppo_clip-token-rs",
        {"loss_agg_mode": ROW_MEAN},
        {"score": "entropy", "normalize": "all"},
        "divided by its count of kept tokens",
    ),
    (
        "bypass-reinforce-batch-normalize",
        {},
        {"score": "gmts"},
        "mean 1 over each micro-batch",
    ),
    ("sapo", {"loss_agg_mode": "token-mean"}, {"normalize": "all"}, "one aggregation for both"),
    ("geo_mean", {"loss_agg_mode": "token-mean"}, {"normalize": "all"}, "one aggregation"),
]


@pytest.mark.parametrize("case,overrides,selection,match", REFUSED)
def test_refused_combinations_name_the_obstacle(case, overrides, selection, match):
    config = _config(case, **overrides)
    with pytest.raises(ValueError, match=match):
        GMTSPolicyLoss(config, _settings(**selection))


def test_refusals_on_plain_configs_and_what_is_accepted():
    """The same checks on a dict of actor fields (the launcher's, verl's Hydra config)."""
    gmts_on = _settings(score="gmts")
    for config, match in (
        ({"policy_loss": {"loss_mode": "my_loss"}}, "not one of verl 0.9.1's loss modes"),
        ({"policy_loss": {"loss_mode": "dro"}}, "dro_beta"),
        (
            {"policy_loss": {"loss_mode": "bypass_mode", "rollout_correction": {"loss_type": "x"}}},
            "loss_type='x'",
        ),
        ({"loss_agg_mode": "token-sum"}, "loss_agg_mode='token-sum'"),
    ):
        with pytest.raises(ValueError, match=match):
            check_actor_config(config, gmts_on)
    # entropy scores need no omega: the covariance modes and batch-normalised IS weights work
    for case in ENTROPY_CASES:
        GMTSPolicyLoss(_config(case), _settings(score="entropy"))
    # without a selection the loss is verl's own ppo_loss: nothing is refused
    none = _settings(score="none")
    check_actor_config({"policy_loss": {"loss_mode": "clip_cov"}, "kl_loss_type": "full"}, none)


def test_no_selection_is_verls_ppo_loss_whatever_the_mode():
    config = _config("clip_cov", kl_loss_type="k2")
    loss_fn = GMTSPolicyLoss(config, _settings(score="none"))
    assert loss_fn.objective is None
    answers, mini = vb.mini_batch("v1", 5)
    loss_fn.prepare_mini_batch(None, mini)
    leaves = vb.leaves(answers)
    want, _, _ = vb.loss_over_micro_batches(
        functools.partial(ppo_loss, config), mini, answers, leaves, seed=1
    )
    got, _, _ = vb.loss_over_micro_batches(loss_fn, mini, answers, leaves, seed=1)
    torch.testing.assert_close(got, want)
