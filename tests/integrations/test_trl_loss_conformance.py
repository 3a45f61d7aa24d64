"""GMTSGRPOTrainer's loss against TRL 1.16's own ``GRPOTrainer._compute_loss`` on identical
micro-batches built by TRL's own ``_generate_and_score_completions`` (tests/integrations/
trl_batches.py): every ``loss_type``, both importance-sampling levels, ``delta``, the off-policy
mask, the KL with and without ``use_bias_correction_kl``, every vLLM importance-sampling mode,
the entropy bonus (static and TRL's adaptive controller), and TRL's ``top_entropy_quantile``
at rho in {0.1, 0.2, 0.3, 0.5, 0.7, 0.9}, with distinct and with tied entropies.

One trainer serves every case: TRL's loss is ``GRPOTrainer._compute_loss`` called on it, ours
its own ``_compute_loss``; a case sets the attributes TRL's loss reads (``loss_type``,
``beta``, ``args.delta``, ...) on the live trainer, as TRL's constructor would have. TRL's
forward is replaced by fixed per-token log-probs and entropies (float64 leaves), so "equal"
means the loss and its gradient with respect to both.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # trl_batches (not a package)
import trl_batches as tb  # noqa: E402

import gmts  # noqa: E402
from gmts.core import SelectionConfig, select_for_update  # noqa: E402
from gmts.core.objectives import gradient_coefficient, loss_omega  # noqa: E402
from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer  # noqa: E402
from gmts.integrations.trl_loss import LOSS_TYPES, VLLM_IS_MODES  # noqa: E402

BATCHES = ("on-policy", "stale", *VLLM_IS_MODES)
"""on-policy: TRL skips the old-policy pass (r = 1); stale: num_iterations = 2, so TRL computes
old log-probs; the vLLM IS modes: use_vllm with importance-sampling correction in that mode."""
RHOS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
NONE = SelectionConfig(score="none")

# attributes TRL's _compute_loss reads on the trainer itself; the others it reads on args
_TRAINER_ATTRS = {
    "loss_type",
    "importance_sampling_level",
    "epsilon_low",
    "epsilon_high",
    "beta",
    "off_policy_mask_threshold",
    "top_entropy_quantile",
    "entropy_coef",
    "use_adaptive_entropy",
    "gmts_selection",
}


@pytest.fixture(scope="module")
def trainer():
    model_dir = tb.save_tiny_model(tempfile.mkdtemp())
    return tb.build_trainer(GMTSGRPOTrainer, GMTSGRPOConfig(**tb.trl_kwargs()), model_dir)


def _vllm_mode(batch: str) -> str | None:
    return batch if batch in VLLM_IS_MODES else None


@pytest.fixture(scope="module")
def batches(trainer):
    """name -> (TRL's generation batch, the IS clip range): one per entry of BATCHES, each
    generated with the trainer's settings of that entry (truncate modes clip to [0.5, 3], mask
    modes zero outside [0.6, 2.5]: both sides act on this batch)."""
    out = {}
    for name in BATCHES:
        mode = _vllm_mode(name)
        clip = (0.5, 3.0) if mode and mode.endswith("truncate") else (0.6, 2.5)
        tb.set_vllm_is(trainer, mode, *clip)
        trainer.num_iterations = 2 if name == "stale" else 1  # TRL: old pass when mu > 1
        out[name] = (tb.double(tb.generation_batch(trainer)), clip)
    trainer.num_iterations = 1
    tb.set_vllm_is(trainer, None)
    assert "old_per_token_logps" not in out["on-policy"][0]
    assert "old_per_token_logps" in out["stale"][0]
    return out


@contextlib.contextmanager
def configured(trainer, batch="on-policy", clip=(None, 3.0), **options):
    """Set TRL's loss options (and ``gmts_selection``) on the live trainer, with the vLLM IS
    settings ``batch`` was generated with; restore after."""
    mode = _vllm_mode(batch)
    entropy_on = options.get("entropy_coef", 0.0) != 0.0 or options.get("use_adaptive_entropy")
    options.setdefault("gmts_selection", NONE)
    options["_entropy_bonus_enabled"] = bool(entropy_on)
    if options.get("loss_type") == "cispo":
        options.setdefault("epsilon_high", 5.0)  # TRL's advice for cispo (ScaleRL)
    if options.get("loss_type") == "sapo":  # float32-exact (see _tolerance), near TRL's 1.05
        options.setdefault("sapo_temperature_neg", 1.0625)
    saved = []
    for name, value in options.items():
        owner = trainer if name in _TRAINER_ATTRS or name.startswith("_") else trainer.args
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)
    tb.set_vllm_is(trainer, mode, *clip)
    try:
        yield
    finally:
        tb.set_vllm_is(trainer, None)
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _assert_same(ours, theirs, rtol=1e-9, atol=1e-12):
    for a, b in zip(ours, theirs, strict=True):  # loss, d/d logprobs, d/d entropy
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def _tolerance(trainer) -> dict[str, float]:
    """Exact up to float64 rounding, except SAPO at temperatures float32 cannot hold: TRL
    builds them with torch.where on Python floats, float32 tensors (1.05 -> 1.0499999523)."""
    temperatures = (trainer.args.sapo_temperature_pos, trainer.args.sapo_temperature_neg)
    if trainer.loss_type == "sapo" and any(float(torch.tensor(t)) != t for t in temperatures):
        return dict(rtol=1e-6, atol=1e-7)
    return dict(rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------
# the loss of every TRL option, no selection


LOSS_CASES = [
    *[dict(loss_type=lt) for lt in LOSS_TYPES],
    *[
        dict(loss_type=lt, importance_sampling_level="sequence")
        for lt in LOSS_TYPES
        if lt != "vespo"
    ],
    dict(loss_type="vespo", importance_sampling_level="sequence", use_bias_correction_kl=False),
    dict(loss_type="dapo", delta=1.3),
    dict(loss_type="dapo", delta=0.9),  # at or below the on-policy ratio: TRL's clamp still rules
    dict(loss_type="cispo", epsilon_high=0.5),  # TRL caps the weight below 1: exact too
    dict(loss_type="vespo", importance_sampling_level="sequence"),  # KL corrected by s_i
    dict(loss_type="grpo", delta=1.1),  # below 1 + epsilon_high: caps A > 0 tokens earlier
    dict(loss_type="luspo", importance_sampling_level="sequence", delta=1.05),
    *[dict(loss_type=lt, off_policy_mask_threshold=0.02) for lt in ("grpo", "dapo", "cispo")],
    dict(loss_type="sapo", off_policy_mask_threshold=0.02),
    dict(loss_type="sapo", sapo_temperature_neg=1.05),  # TRL's default
    dict(loss_type="vespo", off_policy_mask_threshold=0.02),
    dict(loss_type="grpo", use_bias_correction_kl=False),
    dict(loss_type="grpo", importance_sampling_level="sequence", use_bias_correction_kl=False),
    dict(loss_type="dapo", beta=0.0),
]


def _case_id(case: dict) -> str:
    return "-".join(f"{v}" if k == "loss_type" else f"{k}={v}" for k, v in case.items())


def _applicable(case: dict, batch: str) -> bool:
    # TRL's own constructor refuses VESPO with the sequence IS modes
    return not (case["loss_type"] == "vespo" and batch.startswith("sequence"))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", LOSS_CASES, ids=[_case_id(c) for c in LOSS_CASES])
def test_loss_equals_trls_own_loss(trainer, batches, case, batch):
    """gmts_score='none': loss, d loss / d logprobs equal TRL's _compute_loss."""
    if not _applicable(case, batch):
        pytest.skip("TRL refuses VESPO with sequence-level vLLM IS at construction")
    inputs, clip = batches[batch]
    logprobs, entropy = tb.current_policy(inputs, seed=1)
    with configured(trainer, batch, clip, **case):
        theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
        ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        tolerance = _tolerance(trainer)
    _assert_same(ours, theirs, **tolerance)
    assert float(theirs[1].abs().max()) > 0


def _quoted_values(help_text: str, lead: str) -> tuple[str, ...]:
    """The quoted names of the sentence that starts with ``lead`` in a TRL help text."""
    sentence = help_text.split(lead, 1)[1].split(". ", 1)[0]
    return tuple(re.findall(r"'(\w+)'", sentence))


def test_the_loss_types_and_vllm_is_modes_are_trls():
    """LOSS_TYPES and VLLM_IS_MODES (which parametrize this module) are exactly the values the
    installed TRL's GRPOConfig documents, and its generation code names every mode."""
    import inspect

    from trl import GRPOConfig, GRPOTrainer

    fields = GRPOConfig.__dataclass_fields__
    loss_help = fields["loss_type"].metadata["help"]
    mode_help = fields["vllm_importance_sampling_mode"].metadata["help"]
    assert set(_quoted_values(loss_help, "Supported values are")) == set(LOSS_TYPES)
    assert set(_quoted_values(mode_help, "Supported options are")) == set(VLLM_IS_MODES)
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for mode in VLLM_IS_MODES:
        assert f'"{mode}"' in source, mode


def test_the_cases_exercise_what_they_name(trainer, batches):
    """Guard against vacuous cases: on these batches the clips, delta, the off-policy mask and
    every IS mode's truncation / masking act on some tokens."""
    inputs, _ = batches["stale"]
    logprobs, _ = tb.current_policy(inputs, seed=1)
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"][:, None].expand_as(mask)
    r = torch.exp(logprobs - inputs["old_per_token_logps"])
    assert ((r > 1.28) & (adv > 0) & mask).any() and ((r < 0.8) & (adv < 0) & mask).any()
    assert ((r > 1.1) & (r < 1.28) & (adv > 0) & mask).any()  # delta=1.1 acts below the clip
    opm = trainer.get_off_policy_mask(
        inputs["advantages"][:, None],
        logprobs,
        inputs["sampling_per_token_logps"],
        inputs["completion_mask"],
        0.02,
    )
    assert (opm == 0).any() and (opm == 1).any()
    for mode in VLLM_IS_MODES:
        ratio = batches[mode][0]["importance_sampling_ratio"]
        low, high = batches[mode][1]
        if mode.endswith("mask"):
            assert (ratio == 0).any(), mode
        else:
            assert ((ratio == low) | (ratio == high)).any(), mode
        assert ratio.shape[1] == (1 if mode.startswith("sequence") else mask.shape[1])


# ------------------------------------------------------------------------------------------
# omega of the GMTS score is the gradient of TRL's own per-token loss


def _trl_token_weight(trainer, inputs, loss_type: str) -> torch.Tensor:
    """``(B, T)`` d loss / d (token loss) of TRL 1.16's aggregation per loss_type (read in
    grpo_trainer.py), one micro-batch, one process, no accumulation."""
    mask = inputs["completion_mask"].double()
    rows = mask.shape[0]
    if loss_type in ("grpo", "sapo"):
        return mask / mask.sum(-1, keepdim=True).clamp(min=1.0) / rows
    if loss_type == "luspo":
        return mask / rows
    if loss_type == "bnpo":
        return mask / mask.sum()
    if loss_type == "dr_grpo":
        return mask / (rows * trainer.max_completion_length)
    return mask / inputs["num_items_in_batch"].clamp(min=1.0)  # dapo, cispo, vespo


OMEGA_CASES = [
    *[dict(loss_type=lt) for lt in LOSS_TYPES],
    dict(loss_type="grpo", importance_sampling_level="sequence"),
    dict(loss_type="dapo", delta=1.1, off_policy_mask_threshold=0.02),
    dict(loss_type="vespo", off_policy_mask_threshold=0.02),
]


@pytest.mark.parametrize("mode", ("stale", *VLLM_IS_MODES))
@pytest.mark.parametrize("case", OMEGA_CASES, ids=[_case_id(c) for c in OMEGA_CASES])
def test_gmts_omega_is_the_gradient_of_trls_token_loss(trainer, batches, case, mode):
    """omega (the trainer's objective, advantages and importance weights through the core's
    gradient_coefficient) times TRL's aggregation weight == loss_omega of TRL's own loss; and
    gmts_score='gmts' with gmts_normalize='all' trains on the top k = ceil(0.3 N) tokens by
    |H * that gradient / weight|, with TRL's loss for that token mask (TRL's own entropy mask
    replaced by it) as its loss."""
    if not _applicable(case, mode):
        pytest.skip("TRL refuses VESPO with sequence-level vLLM IS at construction")
    inputs, clip = batches[mode]
    _assert_omega_is_trls_gradient(trainer, inputs, mode, clip, case)


def _assert_omega_is_trls_gradient(trainer, inputs, mode, clip, case):
    logprobs, entropy = tb.current_policy(inputs, seed=2)
    mask = inputs["completion_mask"].bool()
    with configured(trainer, mode, clip, **case):

        def trl_loss(lp):
            with tb.fixed_forward(trainer, lp, entropy):
                return tb.trl_compute_loss(trainer, trainer.model, inputs)

        theirs = loss_omega(trl_loss, logprobs, mask)  # (B, T)
        old = inputs.get("old_per_token_logps", logprobs)
        options = trainer._gmts_options()
        policy = trainer._gmts_policy(options, inputs, logprobs, old)
        omega = gradient_coefficient(
            trainer._gmts_loss_config(options, policy.vespo_padding_weight).objective,
            logprobs,
            old,
            policy.advantages,
            mask,
            ref_logprobs=inputs["ref_per_token_logps"],
            importance_weights=policy.importance_weights,
        )
        weight = _trl_token_weight(trainer, inputs, case["loss_type"])
        tolerance = _tolerance(trainer)
        torch.testing.assert_close(omega * weight, theirs, **tolerance)

        # the selection ranks by |H omega| with omega recovered from TRL's gradient
        score = torch.where(mask, (entropy * theirs / weight.clamp(min=1e-300)).abs(), -1.0)
        n = int(mask.sum())
        k = math.ceil(0.3 * n)
        top = torch.zeros_like(mask)
        top.view(-1)[score.view(-1).topk(k).indices] = True
        assert float(score.view(-1).topk(k + 1).values[-2:].diff().abs()) > 0  # distinct cut
        selection = SelectionConfig(
            score="gmts", ratio=0.3, unit="micro-batch", normalize="all", kl_tokens="all"
        )
        selected, ours, trl_masked = _ours_and_trls_with_mask(
            trainer, selection, top, inputs, logprobs, entropy
        )
    assert torch.equal(selected, top)
    _assert_same(ours, trl_masked, **tolerance)


def _ours_and_trls_with_mask(trainer, selection, mask, inputs, logprobs, entropy):
    """``(our selection, our loss and grads, TRL's with its entropy mask replaced by mask)``:
    GMTSGRPOTrainer under ``selection``, and TRL's own _compute_loss whose
    ``get_high_entropy_mask`` returns ``mask``."""
    trainer.gmts_selection = selection
    recorded = []
    select = trainer._gmts_select

    def recording(*args, **kwargs):
        out = select(*args, **kwargs)
        recorded.append(out.selected)
        return out

    trainer._gmts_select = recording
    trainer.top_entropy_quantile = 0.5  # TRL then applies get_high_entropy_mask, patched:
    trainer.get_high_entropy_mask = lambda entropies, m, threshold: mask
    try:
        ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
    finally:
        del trainer._gmts_select, trainer.get_high_entropy_mask
        trainer.top_entropy_quantile = 1.0
    return recorded[-1], ours, theirs


# ------------------------------------------------------------------------------------------
# VESPO with a vLLM token IS range that excludes 1: TRL's sum over the padding, reproduced


VESPO_PADDING = {  # name -> (mode, IS range): the padding's ratio 1.2, 0.9 and 0 (log 1e-8)
    "truncate-above-1": ("token_truncate", (1.2, 3.0)),
    "truncate-below-1": ("token_truncate", (0.2, 0.9)),
    "mask-above-1": ("token_mask", (1.05, 2.5)),
}
VESPO_CASES = [
    dict(loss_type="vespo"),
    dict(loss_type="vespo", off_policy_mask_threshold=0.02),
    dict(loss_type="vespo", importance_sampling_level="sequence"),
]


@pytest.fixture(scope="module")
def padded_batches(trainer):
    """name -> (TRL's generation batch with that IS mode and range, the range); the sampler
    reseeded, so the batches do not depend on which fixtures ran before."""
    out = {}
    for name, (mode, clip) in VESPO_PADDING.items():
        trainer.rollout_func.generator.manual_seed(100)
        tb.set_vllm_is(trainer, mode, *clip)
        out[name] = (tb.double(tb.generation_batch(trainer)), clip)
    tb.set_vllm_is(trainer, None)
    return out


def test_vespo_padding_batches_discriminate(trainer, padded_batches):
    """On these batches TRL's own get_gamma_weights, which counts the positions outside the
    mask, changes the weight of rows with A != 0 against the same weights with those
    positions' ratio set to 1 (what the core's vespo reads by default); and the GMTS selection
    (policies of seeds 2 and 7, the omega and step-unit tests') changes with it."""
    for name, (inputs, clip) in padded_batches.items():
        mask = inputs["completion_mask"]
        ratio = inputs["importance_sampling_ratio"]
        assert bool((ratio[~mask.bool()] != 1).all()), name  # the padding's ratio is not 1
        logprobs, _ = tb.current_policy(inputs, seed=1)
        advantages = inputs["advantages"][:, None]
        args = (advantages, logprobs - inputs["sampling_per_token_logps"], mask)
        trl = trainer.get_gamma_weights(*args, ratio)
        valid_only = trainer.get_gamma_weights(*args, torch.where(mask.bool(), ratio, 1.0))
        differ = ~torch.isclose(trl, valid_only, rtol=1e-6, atol=0.0)
        assert bool((differ & (advantages != 0)).any()), name

        mode, _ = VESPO_PADDING[name]
        selection = SelectionConfig(score="gmts", ratio=0.3)
        with configured(trainer, mode, clip, loss_type="vespo", gmts_vespo_trl_padding=True):
            options = trainer._gmts_options()
            for seed in (2, 7):
                logprobs, entropy = tb.current_policy(inputs, seed=seed)
                old = inputs.get("old_per_token_logps", logprobs)
                policy = trainer._gmts_policy(options, inputs, logprobs, old)
                selected = [
                    select_for_update(
                        selection,
                        trainer._gmts_loss_config(options, padding).objective,
                        logprobs=logprobs,
                        old_logprobs=old,
                        advantages=policy.advantages,
                        response_mask=mask.bool(),
                        entropy=entropy.float(),
                        ref_logprobs=inputs["ref_per_token_logps"],
                        importance_weights=policy.importance_weights,
                    ).selected
                    for padding in (policy.vespo_padding_weight, None)
                ]
                assert not torch.equal(*selected), (name, seed)


@pytest.mark.parametrize("name", sorted(VESPO_PADDING))
@pytest.mark.parametrize("case", VESPO_CASES, ids=[_case_id(c) for c in VESPO_CASES])
def test_vespo_trl_padding_equals_trls_own_loss(trainer, padded_batches, case, name):
    """gmts_vespo_trl_padding, gmts_score='none': the loss and its gradients equal TRL's
    _compute_loss; without the padding's ratio the same batch gives other gradients (the
    core's vespo then reads the valid tokens only)."""
    mode, _ = VESPO_PADDING[name]
    inputs, clip = padded_batches[name]
    logprobs, entropy = tb.current_policy(inputs, seed=1)
    with configured(trainer, mode, clip, **case, gmts_vespo_trl_padding=True):
        theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
        ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        policy_of = trainer._gmts_policy
        trainer._gmts_policy = lambda *a, **k: replace(
            policy_of(*a, **k), vespo_padding_weight=None
        )
        try:
            valid_only = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        finally:
            del trainer._gmts_policy
    _assert_same(ours, theirs)
    assert float(theirs[1].abs().max()) > 0
    assert not torch.allclose(valid_only[1], theirs[1], rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("name", sorted(VESPO_PADDING))
@pytest.mark.parametrize("case", VESPO_CASES[:2], ids=[_case_id(c) for c in VESPO_CASES[:2]])
def test_vespo_trl_padding_omega_is_the_gradient_of_trls_token_loss(
    trainer, padded_batches, case, name
):
    """omega with TRL's padding counted is the coefficient of the gradient TRL's own loss has,
    and the GMTS selection is the top k by it (as test_gmts_omega_is_the_gradient_...)."""
    mode, _ = VESPO_PADDING[name]
    inputs, clip = padded_batches[name]
    _assert_omega_is_trls_gradient(
        trainer, inputs, mode, clip, {**case, "gmts_vespo_trl_padding": True}
    )


@pytest.mark.parametrize("name", sorted(VESPO_PADDING))
@pytest.mark.parametrize("normalize", ["selected", "all"])
def test_vespo_trl_padding_step_unit_equals_one_micro_batch(
    trainer, padded_batches, normalize, name
):
    """The selection over accumulated micro-batches of one row each counts the padding's
    ratio of every row, also when the micro-batch that selects for the window (the first,
    TRL's full-length row 0) has no padding of its own."""
    mode, _ = VESPO_PADDING[name]
    inputs, clip = padded_batches[name]
    mask = inputs["completion_mask"]
    assert bool(mask[0].all()) and not bool(mask.all())
    _assert_step_unit_equals_one_micro_batch(
        trainer,
        inputs,
        mode,
        clip,
        dict(loss_type="vespo", gmts_vespo_trl_padding=True),
        normalize,
        split=mask.shape[0],
    )


# ------------------------------------------------------------------------------------------
# TRL's top_entropy_quantile, at every rho, distinct and tied entropies


def _tied(entropy: torch.Tensor, seed: int) -> torch.Tensor:
    """Entropies from 4 levels (many ties, at every cut)."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor([0.25, 0.5, 1.0, 1.75], dtype=torch.float64)
    return levels[torch.randint(0, 4, entropy.shape, generator=g)]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize(
    "case,mode",
    [
        (dict(loss_type="grpo"), "stale"),
        (dict(loss_type="dapo", off_policy_mask_threshold=0.02), "token_truncate"),
        (dict(loss_type="bnpo", importance_sampling_level="sequence"), "sequence_mask"),
    ],
    ids=["grpo", "dapo-opm-token_truncate", "bnpo-gspo-sequence_mask"],
)
def test_trl_preset_with_entropy_equals_top_entropy_quantile(
    trainer, batches, case, mode, rho, ties
):
    """The 'trl' preset with score='entropy' selects exactly TRL's own
    get_high_entropy_mask(H, mask, 1 - rho) (TRL's method itself) and gives TRL's
    top_entropy_quantile loss and gradients; with ties as well (both keep every tie)."""
    inputs, clip = batches[mode]
    logprobs, entropy = tb.current_policy(inputs, seed=3)
    if ties:
        entropy = _tied(entropy, seed=4)
    mask = inputs["completion_mask"]
    preset = SelectionConfig.preset("trl", score="entropy", ratio=rho)
    with configured(trainer, mode, clip, **case, gmts_selection=preset):
        trl_mask = trainer.get_high_entropy_mask(entropy, mask, 1 - rho)
        recorded = []
        select = trainer._gmts_select
        trainer._gmts_select = lambda *a, **k: recorded.append(select(*a, **k)) or recorded[-1]
        try:
            ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        finally:
            del trainer._gmts_select
        trainer.top_entropy_quantile = rho
        theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
    assert torch.equal(recorded[-1].selected, trl_mask)
    _assert_same(ours, theirs)
    n = int(mask.sum())
    if ties:  # TRL keeps every tie at the threshold: more than any exact count would
        assert int(trl_mask.sum()) >= math.ceil(rho * n)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_trl_preset_equals_top_entropy_quantile_for_every_loss_type(trainer, batches, loss_type):
    """The same at rho = 0.3 with tied entropies and TRL's vLLM token IS ratio, per loss_type."""
    inputs, clip = batches["token_mask"]
    logprobs, entropy = tb.current_policy(inputs, seed=9)
    entropy = _tied(entropy, seed=10)
    preset = SelectionConfig.preset("trl", score="entropy", ratio=0.3)
    with configured(trainer, "token_mask", clip, loss_type=loss_type, gmts_selection=preset):
        ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        trainer.top_entropy_quantile = 0.3
        theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
        tolerance = _tolerance(trainer)
    _assert_same(ours, theirs, **tolerance)


def test_ceil_count_differs_from_trls_quantile_with_distinct_scores(trainer, batches):
    """Why docs/integrations.md no longer says "with distinct scores the two agree": of N
    distinct scores TRL keeps those at or above torch.quantile's interpolated (1 - rho)
    quantile, about N - (1 - rho)(N - 1) of them (float32 rounding of the position decides
    at whole positions), not ceil(rho N) (TRL's own get_high_entropy_mask, one process)."""
    inputs, _ = batches["stale"]
    _, entropy = tb.current_policy(inputs, seed=3)
    cases = {"batch": (entropy, inputs["completion_mask"])}
    g = torch.Generator().manual_seed(8)
    for n in (14, 31):
        row = (0.05 + 0.1 * torch.randperm(n, generator=g).double())[None, :]  # distinct
        cases[n] = (row, torch.ones_like(row, dtype=torch.long))
    differ = {}
    for name, (values, valid) in cases.items():
        n = int(valid.sum())
        differ[name] = []
        for rho in RHOS:
            kept = int(trainer.get_high_entropy_mask(values, valid, 1 - rho).sum())
            position = (1 - rho) * (n - 1)
            if abs(position - round(position)) > 1e-4:  # not a whole position: no rounding
                assert kept == n - math.ceil(position), (n, rho)
            if kept != math.ceil(rho * n):
                differ[name].append((rho, kept, math.ceil(rho * n)))
    assert differ[14] == [(0.3, 4, 5), (0.9, 12, 13)]  # (rho, TRL's count, ceil(rho N))
    assert differ[31] == [(0.2, 6, 7), (0.3, 9, 10)]
    assert differ["batch"]


def test_trl_preset_keeps_trls_mask_for_float64_entropies(trainer):
    """TRL's quantile is float32 but it compares `entropies * mask.float()`, float64 for float64
    entropies, with it: a score just below the threshold that rounds to it in float32 is left
    out. The 'trl' preset does the same (TRL's own get_high_entropy_mask, one process)."""
    g = torch.Generator().manual_seed(12)
    rounding_decides = 0
    for rho in RHOS:
        for n in range(1, 61):
            values = 3 * torch.rand(2, n, generator=g, dtype=torch.float64)
            valid = (torch.rand(2, n, generator=g) < 0.8).long()
            theirs = trainer.get_high_entropy_mask(values, valid, 1 - rho)
            zeros = torch.zeros_like(values)
            ours = gmts.select_for_update(
                SelectionConfig.preset("trl", score="entropy", ratio=rho),
                gmts.ObjectiveConfig.preset("grpo"),
                logprobs=zeros,
                old_logprobs=zeros,
                advantages=torch.ones(2, dtype=torch.float64),
                response_mask=valid.bool(),
                entropy=values,
            ).selected
            assert torch.equal(ours, theirs), (rho, n)
            in_float32 = trainer.get_high_entropy_mask(values.float(), valid, 1 - rho)
            rounding_decides += not torch.equal(in_float32, theirs)
    assert rounding_decides > 0  # a comparison in float32 would have differed


# ------------------------------------------------------------------------------------------
# the entropy bonus


@pytest.mark.parametrize(
    "case,mode",
    [
        (dict(loss_type="grpo"), "stale"),
        (dict(loss_type="dapo"), "token_mask"),
        (dict(loss_type="luspo", importance_sampling_level="sequence"), "sequence_truncate"),
    ],
    ids=["grpo", "dapo-token_mask", "luspo-sequence_truncate"],
)
@pytest.mark.parametrize("rho", [None, 0.3], ids=["no-selection", "rho0.3"])
def test_static_entropy_bonus_equals_trls(trainer, batches, case, mode, rho):
    """entropy_coef: the loss and its gradients with respect to the log-probs AND the
    entropies equal TRL's; with the 'trl' preset + entropy the bonus acts on the selected
    tokens, as TRL's on mask * entropy_mask."""
    inputs, clip = batches[mode]
    logprobs, entropy = tb.current_policy(inputs, seed=5)
    selection = NONE if rho is None else SelectionConfig.preset("trl", score="entropy", ratio=rho)
    with configured(trainer, mode, clip, **case, entropy_coef=0.05, gmts_selection=selection):
        ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
        trainer.top_entropy_quantile = 1.0 if rho is None else rho
        theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
    _assert_same(ours, theirs)
    assert float(theirs[2].abs().max()) > 0  # the bonus has an entropy gradient


def test_gmts_selection_ignores_the_entropy_bonus(trainer, batches):
    """The bonus's gradient does not go through log pi(o_t): the GMTS score (omega of the
    policy-gradient term) selects the same tokens with and without it."""
    inputs, clip = batches["token_truncate"]
    logprobs, entropy = tb.current_policy(inputs, seed=6)
    selection = SelectionConfig(score="gmts", ratio=0.3, unit="micro-batch")
    picked = []
    for coef in (0.0, 0.5):
        with configured(trainer, "token_truncate", clip, loss_type="dapo", entropy_coef=coef):
            trainer.gmts_selection = selection
            select = trainer._gmts_select

            def recording(*a, select=select, **k):
                picked.append(select(*a, **k))
                return picked[-1]

            trainer._gmts_select = recording
            try:
                tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
            finally:
                del trainer._gmts_select
    assert torch.equal(picked[0].selected, picked[1].selected)


def _controller_state(trainer):
    stats = trainer._entropy_window_stats
    return (
        trainer.entropy_coef,
        trainer._last_world_entropy,
        None if stats is None else stats.tolist(),
    )


def _reset_controller(trainer, coef):
    trainer.entropy_coef = coef
    trainer._last_world_entropy = float("inf")
    trainer._entropy_window_stats = None


@pytest.mark.parametrize("rho", [None, 0.5], ids=["no-selection", "rho0.5"])
def test_adaptive_entropy_controller_follows_trls(trainer, batches, rho):
    """use_adaptive_entropy over 4 optimizer steps of 2 accumulated micro-batches: every
    micro-batch's loss and gradients, and the controller's state after each (entropy_coef,
    the last window entropy, the window sums), equal TRL's. The target sits between the
    steps' entropies, so the coefficient is switched on and off and moves both ways."""
    inputs, clip = batches["stale"]
    policies = [tb.current_policy(inputs, seed=10 + i) for i in range(8)]
    # entropies alternate between low and high windows around the target 1.0 (kept float32
    # values: the model's entropies are float32, which TRL's float32 quantile threshold and the
    # trainer's float32 scores assume)
    policies = [
        (lp, (ent * (0.6 if (i // 2) % 2 == 0 else 1.4)).float().double())
        for i, (lp, ent) in enumerate(policies)
    ]
    selection = NONE if rho is None else SelectionConfig.preset("trl", score="entropy", ratio=rho)
    runs = {}
    for name, compute in (("trl", tb.trl_compute_loss), ("gmts", tb.gmts_compute_loss)):
        with configured(
            trainer,
            "stale",
            clip,
            loss_type="grpo",
            use_adaptive_entropy=True,
            entropy_coef=0.02,
            entropy_target=1.0,
            entropy_coef_delta=0.01,
            gmts_selection=selection,
            top_entropy_quantile=1.0 if (rho is None or name == "gmts") else rho,
        ):
            _reset_controller(trainer, 0.02)
            trainer.current_gradient_accumulation_steps = 2
            state = trainer.accelerator.gradient_state
            records = []
            try:
                for i, (lp, ent) in enumerate(policies):
                    state._set_sync_gradients(i % 2 == 1)  # the window's last micro-batch
                    out = tb.loss_and_grads(compute, trainer, inputs, lp, ent)
                    records.append((out, _controller_state(trainer)))
            finally:
                state._set_sync_gradients(True)
                trainer.current_gradient_accumulation_steps = 1
                _reset_controller(trainer, 0.0)
        runs[name] = records
    coefs = []
    for (ours, our_state), (theirs, their_state) in zip(runs["gmts"], runs["trl"], strict=True):
        _assert_same(ours, theirs)
        assert our_state[0] == pytest.approx(their_state[0], abs=1e-15)
        assert our_state[1] == pytest.approx(their_state[1], rel=1e-12)
        if their_state[2] is None:
            assert our_state[2] is None
        else:
            assert our_state[2] == pytest.approx(their_state[2], rel=1e-12)
        coefs.append(their_state[0])
    assert max(coefs) > 0.02 and min(coefs) < 0.02  # moved up and down


# ------------------------------------------------------------------------------------------
# the selection unit spanning accumulated micro-batches, with TRL's weights


@pytest.mark.parametrize("normalize", ["selected", "all"])
@pytest.mark.parametrize(
    "case,batch",
    [
        (dict(loss_type="cispo", off_policy_mask_threshold=0.02), "token_truncate"),
        (dict(loss_type="dapo", importance_sampling_level="sequence"), "sequence_mask"),
        (dict(loss_type="vespo", off_policy_mask_threshold=0.02), "token_mask"),
    ],
    ids=["cispo-opm-token_truncate", "gspo-dapo-sequence_mask", "vespo-opm-token_mask"],
)
def test_step_unit_with_trl_weights_equals_one_micro_batch(
    trainer, batches, case, batch, normalize
):
    """gmts_unit='mini-batch' (the paper) over 2 accumulated micro-batches, whose selection
    pass recomputes TRL's off-policy mask and reads its IS ratio per micro-batch, gives the
    loss and gradients of one micro-batch holding both."""
    inputs, clip = batches[batch]
    _assert_step_unit_equals_one_micro_batch(trainer, inputs, batch, clip, case, normalize)


def _assert_step_unit_equals_one_micro_batch(
    trainer, inputs, batch, clip, case, normalize, split=2
):
    logprobs, entropy = tb.current_policy(inputs, seed=7)
    selection = SelectionConfig(score="gmts", ratio=0.3, normalize=normalize, kl_tokens="all")
    results = []
    for parts in (1, split):
        micro = [inputs] if parts == 1 else tb.split_rows(inputs, parts)
        lp = logprobs.detach().clone().requires_grad_(True)
        with configured(trainer, batch, clip, **case, gmts_selection=selection):
            trainer.args.steps_per_generation = parts
            trainer.current_gradient_accumulation_steps = parts
            trainer._buffered_inputs = micro
            total = torch.zeros((), dtype=torch.float64)
            try:
                with tb.row_forward(trainer, micro, lp, entropy):
                    for step, part in enumerate(micro):
                        trainer._step = step
                        total = total + trainer._compute_loss(trainer.model, part)
            finally:
                trainer.args.steps_per_generation = 1
                trainer.current_gradient_accumulation_steps = 1
                trainer._step = 0
                trainer._gmts_window_cache = None
            (grad,) = torch.autograd.grad(total, lp)
        results.append((total.detach(), grad))
    _assert_same(results[1], results[0])
    n = int(inputs["completion_mask"].sum())
    logged = trainer._metrics["train"]
    assert logged["gmts/unit_valid_tokens"][-1] == n  # one unit: both micro-batches
    assert logged["gmts/unit_selected_tokens"][-1] <= math.ceil(0.3 * n)


# ------------------------------------------------------------------------------------------
# the condition rules (STAPO, RSI-S) in TRL: the rule's mask, then TRL's own loss on it


def _condition_mask(rule: str, inputs: dict, logprobs, entropy):
    """The rule written out (tests/core/test_core_rule_scores.py checks the core against the
    same definitions): STAPO keeps all but A > 0, p < 0.3, H < quantile(H, 0.8); RSI-S keeps
    0.5 <= -log p / H <= 2."""
    mask = inputs["completion_mask"].bool()
    if rule == "stapo":
        tau_h = torch.quantile(entropy[mask].float(), 0.8)
        positive = (inputs["advantages"] > 0)[:, None].expand_as(mask)
        spurious = positive & (logprobs.exp() < 0.3) & (entropy < tau_h)
        return mask & ~spurious
    rsi = -logprobs / entropy
    return mask & (rsi >= 0.5) & (rsi <= 2.0)


@pytest.mark.parametrize("rule", ["stapo", "rsi"])
def test_condition_rules_run_in_trl_with_trls_own_loss(trainer, batches, rule):
    """gmts_score=stapo / rsi at ratio 1, each micro-batch on its own, normalize='all': the
    selection is the rule's mask, and the loss and gradients are TRL's own _compute_loss with
    its entropy mask replaced by that mask."""
    inputs, clip = batches["on-policy"]
    logprobs, entropy = tb.current_policy(inputs, seed=4)
    want = _condition_mask(rule, inputs, logprobs, entropy)
    mask = inputs["completion_mask"].bool()
    assert 0 < int(want.sum()) < int(mask.sum())  # the rule keeps some tokens, not all
    params = dict(stapo_prob_threshold=0.3) if rule == "stapo" else {}
    selection = SelectionConfig(
        score=rule, ratio=1.0, unit="micro-batch", normalize="all", kl_tokens="all", **params
    )
    with configured(trainer, "on-policy", clip, loss_type="dapo"):
        selected, ours, theirs = _ours_and_trls_with_mask(
            trainer, selection, want, inputs, logprobs, entropy
        )
    assert torch.equal(selected, want)
    _assert_same(ours, theirs)
