"""The objective rows of the conformance matrix: GMTS (the paper preset, eq. 2) under every
objective the engines offer, on every engine that offers it.

For each row the reference selects the top 30% of the fixed batch by ``|E * omega|``, with
omega from autograd of a per-token objective written the way the engines write it
(tests/conformance/_references.py), and takes eq. 2's mean over the selected tokens; each engine
must give the same loss and gradient w.r.t. the per-token log-probs, refuse with a reason, or
not offer the objective at all ("—").

Interface for the engine columns (one module each, so the TRL and verl work is independent):

- ``tests/conformance/_objectives_trl.py`` defines ``trl_cell(row: Row) -> Cell``: the TRL
  integration (``GMTSGRPOTrainer._compute_loss``, TRL's forward replaced by the fixed
  log-probs) configured with ``row.trl`` (GRPOConfig keyword arguments) and
  ``gmts.SelectionConfig.preset("paper", score="gmts", ratio=RATIO)``;
- ``tests/conformance/_objectives_verl.py`` defines ``verl_cell(row: Row) -> Cell``: the verl
  plugin's loss on a mini-batch built with verl's own functions, with ``row.verl`` (ActorConfig
  overrides, ``policy_loss`` a dict of PolicyLossConfig fields) and the same selection.

Both receive only rows whose ``trl`` / ``verl`` is not None, and compute on
``objective_batch()`` (rewards ``REWARDS``, ``GROUP_SIZE`` answers per question; an engine
that computes advantages itself gets them from these rewards); a refusal is
``Cell(refused=...)``.
Not a test module: loaded by tests/conformance/test_conformance_objectives.py (core, trainer,
trl) and test_conformance_verl.py (verl); ``python tests/conformance/_objectives.py`` prints the
table of docs/semantics.md.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import gmts

HERE = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules[name]


matrix = _load("_matrix")
refs = _load("_references")
Cell = matrix.Cell
B, T, RATIO, DTYPE = matrix.B, matrix.T, matrix.RATIO, matrix.DTYPE
BETA = 0.05
GROUP_SIZE = 3  # two questions of three answers: advantages of unequal magnitude
REWARDS = (1.0, 0.0, 0.0, 1.0, 1.0, 0.0)


def objective_batch() -> Any:
    """The preset matrix's fixed batch (tests/conformance/_matrix.py: its log-probs, reference
    log-probs, entropies and mask) with GROUP_SIZE = 3, so that |A| differs between answers
    (with two answers per question every |A| is the same and |E omega| would rank like E for
    the objectives without a clip): advantages = gmts.group_advantages(REWARDS, 3), the GRPO
    estimator verl and TRL use too."""
    batch = matrix.fixed_batch()
    rewards = torch.tensor(REWARDS, dtype=DTYPE)
    return matrix.Batch(
        batch.logprobs,
        batch.old_logprobs,
        batch.ref_logprobs,
        batch.entropy,
        gmts.group_advantages(rewards, GROUP_SIZE),
        batch.mask,
        torch.arange(B) // GROUP_SIZE,
    )


ENGINES = ("core", "trainer", "trl", "verl")
NOT_OFFERED = "—"


@dataclass(frozen=True)
class Row:
    """One objective as the core, TRL and verl spell it.

    Attributes:
        name: the row's label.
        objective: ``gmts.ObjectiveConfig`` keyword arguments (the core's spelling).
        reference: ``(lp, old, a, mask, ref) -> l`` ``(B, T)`` per-token objective written like
            the engine that offers it (policy term minus beta times its KL).
        trl: GRPOConfig keyword arguments expressing it in TRL 1.16, or None (not offered).
        verl: ActorConfig overrides expressing it in verl 0.9.1 (``policy_loss``: a dict of
            PolicyLossConfig fields), or None (not offered).
    """

    name: str
    objective: dict[str, Any]
    reference: Callable[..., torch.Tensor]
    trl: dict[str, Any] | None = None
    verl: dict[str, Any] | None = None
    note: str = field(default="", compare=False)


def _w(lp: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(lp)


def _kl(lp: torch.Tensor, ref: torch.Tensor, estimator: str = "k3", clamp: Any = None) -> Any:
    return BETA * refs.ref_kl(lp, ref, estimator, clamp)


def _clip(low: float = 0.2, high: float = 0.28) -> dict[str, float]:
    return {"clip_low": low, "clip_high": high}


def _trl(**kw: Any) -> dict[str, Any]:
    """TRL's spelling: epsilon / epsilon_high are the clip; beta 0 unless given."""
    out = {"epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0, "use_bias_correction_kl": False}
    out.update(kw)
    return out


def _verl(mode: str = "vanilla", **kw: Any) -> dict[str, Any]:
    """verl's spelling: clip_ratio_low/high, clip_ratio_c (3: verl's default, inactive here)."""
    out: dict[str, Any] = {
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "use_kl_loss": False,
        "policy_loss": {"loss_mode": mode},
    }
    policy = kw.pop("policy_loss", {})
    out.update(kw)
    out["policy_loss"] = {**out["policy_loss"], **policy}
    return out


_VERL_KL = {"use_kl_loss": True, "kl_loss_coef": BETA}


def _ppo(dual: float | None = None) -> Callable[..., torch.Tensor]:
    c = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": dual}
    c |= {"log_ratio_min": None, "log_ratio_max": None}
    return lambda lp, old, a, m, ref: refs.ref_ppo_token(lp, old, a, m, _w(lp), c)


ROWS: tuple[Row, ...] = (
    Row(
        "ppo, k3 KL (GRPO)",
        {"kl_coef": BETA, **_clip()},
        lambda lp, old, a, m, ref: _ppo()(lp, old, a, m, ref) - _kl(lp, ref),
        trl=_trl(loss_type="grpo", beta=BETA),
        verl=_verl(kl_loss_type="low_var_kl", **_VERL_KL),
    ),
    Row(
        "ppo (DAPO)",
        _clip(),
        _ppo(),
        trl=_trl(loss_type="dapo"),
        verl=_verl(),
    ),
    Row(
        "ppo, dual clip 1.3 (verl clip_ratio_c, TRL delta)",
        {"dual_clip": 1.3, **_clip()},
        _ppo(dual=1.3),
        trl=_trl(loss_type="dapo", delta=1.3),
        verl=_verl(clip_ratio_c=1.3),
    ),
    Row(
        "ppo, k3 KL ratio-corrected (TRL use_bias_correction_kl)",
        {"kl_coef": BETA, "kl_ratio_correction": True, **_clip()},
        lambda lp, old, a, m, ref: _ppo()(lp, old, a, m, ref) - _kl(lp, ref) * torch.exp(lp - old),
        trl=_trl(loss_type="grpo", beta=BETA, use_bias_correction_kl=True),
    ),
    Row(
        "ppo, k1 KL",
        {"kl_coef": BETA, "kl_estimator": "k1", **_clip()},
        lambda lp, old, a, m, ref: _ppo()(lp, old, a, m, ref) - _kl(lp, ref, "k1"),
        verl=_verl(kl_loss_type="k1", **_VERL_KL),
    ),
    Row(
        "ppo, k2 KL",
        {"kl_coef": BETA, "kl_estimator": "k2", **_clip()},
        lambda lp, old, a, m, ref: _ppo()(lp, old, a, m, ref) - _kl(lp, ref, "k2"),
        verl=_verl(kl_loss_type="k2", **_VERL_KL),
    ),
    Row(
        "ppo, abs KL",
        {"kl_coef": BETA, "kl_estimator": "abs", **_clip()},
        lambda lp, old, a, m, ref: _ppo()(lp, old, a, m, ref) - _kl(lp, ref, "abs"),
        verl=_verl(kl_loss_type="abs", **_VERL_KL),
    ),
    Row(
        "ppo, k3+ KL (straight-through)",
        {"kl_coef": BETA, "kl_estimator": "k3+", **_clip()},
        lambda lp, old, a, m, ref: _ppo()(lp, old, a, m, ref) - _kl(lp, ref, "k3+"),
        verl=_verl(kl_loss_type="k3+", **_VERL_KL),
    ),
    Row(
        "GSPO (sequence ratio)",
        {"ratio_level": "sequence", **_clip(0.05, 0.07)},
        lambda lp, old, a, m, ref: refs.ref_ppo_trl(
            lp, old, a, m, _w(lp), {"clip_low": 0.05, "clip_high": 0.07, "delta": None}, "sequence"
        ),
        trl=_trl(
            loss_type="grpo", importance_sampling_level="sequence", epsilon=0.05, epsilon_high=0.07
        ),
    ),
    Row(
        "GSPO-token",
        {"ratio_level": "sequence-token", "log_ratio_max": 10.0, **_clip(0.05, 0.07)},
        lambda lp, old, a, m, ref: refs.ref_gspo_token_verl(
            lp, old, a, m, _w(lp), {"clip_low": 0.05, "clip_high": 0.07}
        ),
        verl=_verl("gspo", clip_ratio=0.05, clip_ratio_low=0.05, clip_ratio_high=0.07),
    ),
    Row(
        "CISPO",
        {"name": "cispo", **_clip(1.0, 0.2)},
        lambda lp, old, a, m, ref: refs.ref_cispo_trl(lp, old, a, m, _w(lp), {"epsilon_high": 1.2}),
        trl=_trl(loss_type="cispo", epsilon_high=1.2),
        verl=_verl("cispo", clip_ratio=1.0, clip_ratio_low=1.0, clip_ratio_high=0.2),
    ),
    Row(
        "SAPO",
        {"name": "sapo"},
        lambda lp, old, a, m, ref: refs.ref_sapo(
            lp, old, a, m, _w(lp), {"tau_pos": 1.0, "tau_neg": 1.05}, "token"
        ),
        trl=_trl(loss_type="sapo"),
        verl=_verl("sapo", loss_agg_mode="seq-mean-token-mean"),
    ),
    Row(
        "GMPO (verl geo_mean)",
        {"name": "gmpo", **_clip(0.4, 0.4)},
        lambda lp, old, a, m, ref: refs.ref_gmpo(
            lp, old, a, m, _w(lp), {"clip_low": 0.4, "clip_high": 0.4}
        ),
        verl=_verl("geo_mean", clip_ratio=0.4, clip_ratio_low=0.4, clip_ratio_high=0.4),
    ),
    Row(
        "GPG",
        {"name": "gpg"},
        lambda lp, old, a, m, ref: refs.ref_gpg(lp, old, a, m, _w(lp), {}),
        verl=_verl("gpg"),
    ),
    Row(
        "DPPO-TV",
        {"name": "dppo-tv", "ratio_cap": 3.0, **_clip(0.05, 0.05)},
        lambda lp, old, a, m, ref: refs.ref_dppo(
            lp, old, a, m, _w(lp), {"clip_low": 0.05, "clip_high": 0.05, "ratio_cap": 3.0}, "tv"
        ),
        verl=_verl("dppo_tv", clip_ratio=0.05, clip_ratio_low=0.05, clip_ratio_high=0.05),
    ),
    Row(
        "DPPO-KL",
        {"name": "dppo-kl", "ratio_cap": 3.0, **_clip(0.02, 0.03)},
        lambda lp, old, a, m, ref: refs.ref_dppo(
            lp, old, a, m, _w(lp), {"clip_low": 0.02, "clip_high": 0.03, "ratio_cap": 3.0}, "kl"
        ),
        verl=_verl("dppo_kl", clip_ratio=0.02, clip_ratio_low=0.02, clip_ratio_high=0.03),
    ),
    Row(
        "DRO",
        {"name": "dro", "dro_beta": 0.5},
        lambda lp, old, a, m, ref: refs.ref_dro(lp, old, a, m, _w(lp), {"dro_beta": 0.5}),
        verl=_verl("dro", policy_loss={"dro_beta": 0.5}),
    ),
    Row(
        "VESPO",
        {"name": "vespo"},
        lambda lp, old, a, m, ref: refs.ref_vespo(
            lp,
            old,
            a,
            m,
            _w(lp),
            {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
        ),
        trl=_trl(loss_type="vespo"),
    ),
)
_CLIP_COV = {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.4, "clip_cov_ub": 1.0}  # picks selected
_KL_COV = {"kl_cov_ratio": 0.2, "kl_cov_coef": 0.5}  # tokens here (the rows discriminate)
ROWS += (
    Row(
        "Clip-Cov (verl clip_cov)",
        {"name": "clip-cov", **_clip(), **_CLIP_COV},
        lambda lp, old, a, m, ref: refs.ref_clip_cov(
            lp, old, a, m, _w(lp), {**_clip(), **_CLIP_COV}
        ),
        verl=_verl("clip_cov", policy_loss=_CLIP_COV),
        note="the pick over the whole mini-batch, its draw seeded with selection.seed + step",
    ),
    Row(
        "KL-Cov (verl kl_cov)",
        {"name": "kl-cov", **_KL_COV},
        lambda lp, old, a, m, ref: refs.ref_kl_cov(lp, old, a, m, _w(lp), _KL_COV),
        verl=_verl(
            "kl_cov", policy_loss={"kl_cov_ratio": 0.2, "ppo_kl_coef": _KL_COV["kl_cov_coef"]}
        ),
    ),
)
ROW_BY_NAME = {row.name: row for row in ROWS}


def objective(row: Row) -> gmts.ObjectiveConfig:
    return gmts.ObjectiveConfig(**row.objective)


def selection() -> gmts.SelectionConfig:
    return gmts.SelectionConfig.preset("paper", score="gmts", ratio=RATIO)


# ------------------------------------------------------------------------------------------
# the reference


def _reference_omega(row: Row, batch: Any) -> torch.Tensor:
    lp = batch.logprobs.clone().requires_grad_(True)
    a = batch.advantages[:, None].expand(B, T)
    mask = batch.mask.to(DTYPE)
    l_ref = row.reference(lp, batch.old_logprobs, a, mask, batch.ref_logprobs)
    (grad,) = torch.autograd.grad((l_ref * mask).sum(), lp)
    return grad.detach()


def reference_selection(row: Row, batch: Any) -> torch.Tensor:
    """The top ceil(0.3 N) tokens by |E * omega| (ties: the first in row-major order), zero
    scores never (the paper preset)."""
    score = (batch.entropy * _reference_omega(row, batch)).abs()
    tokens = [(i, t) for i in range(B) for t in range(T) if batch.mask[i, t]]
    k = -(-3 * len(tokens) // 10)  # ceil(0.3 N)
    order = sorted(tokens, key=lambda it: (-float(score[it]), it))
    selected = torch.zeros(B, T, dtype=torch.bool)
    for it in order[:k]:
        if float(score[it]) != 0.0:
            selected[it] = True
    return selected


def reference(row: Row) -> Cell:
    """Eq. 2: minus the mean of l over the selected tokens, l written like the engine."""
    batch = objective_batch()
    selected = reference_selection(row, batch)
    leaf = batch.logprobs.clone().requires_grad_(True)
    a = batch.advantages[:, None].expand(B, T)
    l_ref = row.reference(leaf, batch.old_logprobs, a, batch.mask.to(DTYPE), batch.ref_logprobs)
    loss = -(l_ref * selected).sum() / int(selected.sum())
    loss.backward()
    return Cell(float(loss.detach()), leaf.grad)


# ------------------------------------------------------------------------------------------
# the core and the trainer


def core(row: Row) -> Cell:
    batch = objective_batch()
    obj, cfg = objective(row), selection()
    ref = batch.ref_logprobs if obj.kl_coef else None
    leaf = batch.logprobs.clone().requires_grad_(True)
    result = gmts.select_for_update(
        cfg,
        obj,
        logprobs=leaf,
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages,
        response_mask=batch.mask,
        entropy=batch.entropy,
        ref_logprobs=ref,
    )
    loss, _ = gmts.policy_loss(
        leaf,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        gmts.LossConfig.of(obj, cfg),
        selected=result.selected,
        ref_logprobs=ref,
    )
    loss.backward()
    return Cell(float(loss.detach()), leaf.grad)


def trainer(row: Row) -> Cell:
    """The standalone trainer's mini-batch update with this objective (micro-batches of 2)."""
    return matrix.trainer_cell(objective(row), selection(), objective_batch())


def engine_column(module: str) -> bool:
    """Whether an engine column's module exists (the TRL and verl columns live in their own)."""
    return (HERE / f"{module}.py").is_file()


def _engine_cell(module: str, function: str, row: Row) -> Cell:
    return getattr(_load(module), function)(row)


def cell(row: Row, engine: str) -> Cell | None:
    """The engine's cell for ``row``, or None where the engine does not offer the objective."""
    if engine == "core":
        return core(row)
    if engine == "trainer":
        return trainer(row)
    if engine == "trl":
        return None if row.trl is None else _engine_cell("_objectives_trl", "trl_cell", row)
    if engine == "verl":
        return None if row.verl is None else _engine_cell("_objectives_verl", "verl_cell", row)
    raise ValueError(f"unknown engine {engine!r}")


def status(row: Row, engine: str, want: Cell | None = None) -> str:
    got = cell(row, engine)
    if got is None:
        return NOT_OFFERED
    want = reference(row) if want is None else want
    return matrix.compare(got, want, matrix.TOLERANCE[engine])


# ------------------------------------------------------------------------------------------
# the table in docs/semantics.md

START, END = "<!-- objective-matrix:start -->", "<!-- objective-matrix:end -->"


def documented_statuses() -> dict[tuple[str, str], str]:
    """(row name, engine) -> status, from the objective table of docs/semantics.md."""
    import re

    text = matrix.SEMANTICS.read_text()
    block = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    if block is None:
        raise ValueError("docs/semantics.md has no objective matrix block")
    lines = block.group(1).strip().splitlines()
    engines = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for engine, value in zip(engines, cells[1:]):
            out[(cells[0], engine)] = value
    return out


def markdown_table(statuses: dict[tuple[str, str], str]) -> str:
    rows = ["| objective | " + " | ".join(ENGINES) + " |", "|" + "---|" * (1 + len(ENGINES))]
    for row in ROWS:
        cells = [statuses.get((row.name, e), "not run") for e in ENGINES]
        rows.append(f"| {row.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # .venv gives core, trainer, trl; .venv-verl gives verl
    columns = {"trl": "_objectives_trl", "verl": "_objectives_verl"}
    available = [
        e
        for e in ENGINES
        if e in ("core", "trainer") or (importlib.util.find_spec(e) and engine_column(columns[e]))
    ]
    found = {}
    for row in ROWS:
        want = reference(row)
        for engine in available:
            found[(row.name, engine)] = status(row, engine, want)
    documented = documented_statuses() if START in matrix.SEMANTICS.read_text() else {}
    print(markdown_table({**documented, **found}))
