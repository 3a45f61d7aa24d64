"""The conformance matrix: one fixed batch, every selection preset x {GRPO, DAPO}, every engine.

Each engine computes the loss of the batch and its gradient with respect to the per-token
log-probs; every cell must equal the reference written here from the paper's equations, or
the engine must refuse the combination with a clear error. Engines:

- ``reference``: this file, from the equations (plain loops for the selection, torch ops for
  the objective), independent of gmts.core's loss code;
- ``core``: README's composition (``select_for_update`` + ``policy_loss(LossConfig.of(...))``);
- ``trainer``: the standalone trainer's mini-batch update (``gmts.train.update``) with the
  model's forward replaced by the fixed log-probs;
- ``trl``: ``GMTSGRPOTrainer._compute_loss`` with TRL's forward replaced likewise;
- ``verl``: the verl plugin's loss on a mini-batch built with verl's own functions (in the
  verl environment only).

Not a test module: loaded by the ``test_conformance_*.py`` files and runnable as a script that
prints the Markdown table of docs/semantics.md (``python tests/conformance/_matrix.py``).
"""

from __future__ import annotations

import math
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import gmts

B, T = 6, 7
LENGTHS = (7, 3, 5, 1, 6, 4)  # unequal rows; one of a single token
GROUP_SIZE = 2  # rows (2i, 2i + 1) answer question i
BETA = 0.05  # GRPO's KL weight here (large enough to matter)
RATIO = 0.3
SCORE = "gmts"
PRESETS = ("paper", "reference-code", "trl")
ALGORITHMS = ("grpo", "dapo")
ENGINES = ("core", "trainer", "trl", "verl")
DTYPE = torch.float64


def objective(algorithm: str) -> gmts.ObjectiveConfig:
    """GRPO (seq-mean-token-mean, k3 KL) or DAPO (token-mean, no KL), clip 0.2 / 0.28."""
    if algorithm == "grpo":
        return gmts.ObjectiveConfig.preset("grpo", kl_coef=BETA)
    return gmts.ObjectiveConfig.preset("dapo")


def selection(preset: str) -> gmts.SelectionConfig:
    return gmts.SelectionConfig.preset(preset, score=SCORE, ratio=RATIO)


@dataclass(frozen=True)
class Batch:
    """The fixed batch; every tensor float64 ``(B, T)`` unless noted."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    entropy: torch.Tensor  # float32-representable values (engines score in float32 or 64)
    advantages: torch.Tensor  # (B,)
    mask: torch.Tensor  # bool
    group_ids: torch.Tensor  # (B,) long


def fixed_batch() -> Batch:
    """Rows of unequal lengths, group-normalised advantages, a KL term, and a tie in the GMTS
    score straddling the cut of the whole-batch selection (two tokens with equal score, of which
    the tie rule takes only the first in row-major order).

    Every value is exactly representable where an engine stores it in a narrower type: old
    log-probs in bfloat16 (verl's V1 trainer), the rest in float32; engines compute from the
    same numbers.
    """
    g = torch.Generator().manual_seed(7)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    old = (-0.5 - 2.5 * torch.rand(B, T, generator=g)).bfloat16().to(DTYPE)
    logprobs = (old + 0.25 * torch.randn(B, T, generator=g, dtype=DTYPE)).float().to(DTYPE)
    ref = (old + 0.25 * torch.randn(B, T, generator=g, dtype=DTYPE)).float().to(DTYPE)
    entropy = (0.05 + 2.0 * torch.rand(B, T, generator=g)).to(DTYPE)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=DTYPE)
    advantages = gmts.group_advantages(rewards, GROUP_SIZE)  # rows 0, 3, 4 share one value
    # the tie: copy token a's (log-prob, old, ref, entropy) onto token b of a row with the same
    # advantage, so both have the same omega and entropy, then place them at the cut
    for t in (logprobs, old, ref, entropy):
        t[TIE[1]] = t[TIE[0]]
    batch = Batch(logprobs, old, ref, entropy, advantages, mask, torch.arange(B) // GROUP_SIZE)
    return _with_tie_at_the_cut(batch, *TIE)


TIE = ((4, 3), (0, 1))
"""Two tokens (row, position) with equal scores; (0, 1) comes first in row-major order."""


def _with_tie_at_the_cut(batch: Batch, a: tuple[int, int], b: tuple[int, int]) -> Batch:
    """Scale token a's (and b's) entropy so that their shared DAPO GMTS score is the k-th best
    of the batch: one of the two is selected, the other is not."""
    omega = _omega(batch, objective("dapo"), weighted=False)
    score = (batch.entropy * omega).abs()
    k = math.ceil(RATIO * int(batch.mask.sum()))
    # put the pair between the (k-1)-th and k-th best of the other tokens
    others = [
        float(score[i, t])
        for i in range(B)
        for t in range(T)
        if batch.mask[i, t] and (i, t) not in (a, b)
    ]
    others.sort(reverse=True)
    target = 0.5 * (others[k - 2] + others[k - 1])
    factor = target / float(score[a])
    entropy = batch.entropy.clone()
    entropy[a] = entropy[b] = float(torch.tensor(float(entropy[a]) * factor).float())
    return Batch(
        batch.logprobs,
        batch.old_logprobs,
        batch.ref_logprobs,
        entropy,
        batch.advantages,
        batch.mask,
        batch.group_ids,
    )


# ------------------------------------------------------------------------------------------
# the reference, from the equations


def _omega(batch: Batch, obj: gmts.ObjectiveConfig, weighted: bool) -> torch.Tensor:
    """omega = r A I(r, A) + beta (rho - 1) (the digest), times 1/|o_i| when ``weighted``."""
    r = torch.exp(batch.logprobs - batch.old_logprobs)
    adv = batch.advantages[:, None].expand(B, T)
    clipped = ((adv > 0) & (r > 1 + obj.clip_high)) | ((adv < 0) & (r < 1 - obj.clip_low))
    omega = torch.where(clipped, 0.0, r * adv)
    if obj.kl_coef:
        omega = omega + obj.kl_coef * (torch.exp(batch.ref_logprobs - batch.logprobs) - 1)
    if weighted:
        omega = omega / torch.tensor(LENGTHS, dtype=DTYPE)[:, None]
    return omega


def reference_selection(batch: Batch, cfg: gmts.SelectionConfig, algorithm: str) -> torch.Tensor:
    """Per unit: the top k by |E * omega| (ties to the first token in row-major order, or the
    last with ties='last'), or every token at or above TRL's quantile threshold
    (count='quantile', torch.quantile as TRL calls it). Zero scores are skipped under
    zero_scores='skip'."""
    obj = objective(algorithm)
    weighted = cfg.omega_weighting and obj.aggregation == "seq-mean-token-mean"
    score = (batch.entropy * _omega(batch, obj, weighted)).abs()
    if cfg.score == "entropy":
        score = batch.entropy
    units: dict[int, list[tuple[int, int]]] = {}
    for i in range(B):
        unit = int(batch.group_ids[i]) if cfg.scope == "group" else 0
        units.setdefault(unit, []).extend((i, t) for t in range(T) if batch.mask[i, t])
    selected = torch.zeros(B, T, dtype=torch.bool)
    for tokens in units.values():
        if cfg.count == "quantile":  # TRL: H * mask.float() >= quantile(H_valid.float(), 1 - rho)
            values = torch.tensor([float(score[it]) for it in tokens]).float()
            threshold = torch.quantile(values, 1 - RATIO)
            for it in tokens:  # in the scores' dtype (float64 here): TRL widens the threshold
                selected[it] = bool(score[it] * 1.0 >= threshold)
            continue
        n = len(tokens)
        exact = RATIO * n
        k = math.floor(exact + 1e-12) if cfg.count == "floor" else max(1, math.ceil(exact - 1e-12))
        sign = -1 if cfg.ties == "last" else 1  # which of equal scores comes first
        order = sorted(tokens, key=lambda it: (-float(score[it]), sign * it[0], sign * it[1]))
        for it in order[:k]:
            if cfg.zero_scores == "skip" and float(score[it]) == 0.0:
                continue
            selected[it] = True
    return selected


def reference_loss(
    batch: Batch, logprobs: torch.Tensor, cfg: gmts.SelectionConfig, algorithm: str
) -> torch.Tensor:
    """The loss from the equations: eq. 2 for normalize='selected', otherwise GRPO eq. 1 / DAPO
    with unselected tokens contributing no policy term (the authors' code, TRL)."""
    obj = objective(algorithm)
    sel = reference_selection(batch, cfg, algorithm) & batch.mask
    r = torch.exp(logprobs - batch.old_logprobs)
    adv = batch.advantages[:, None].expand(B, T)
    s = torch.min(r * adv, torch.clamp(r, 1 - obj.clip_low, 1 + obj.clip_high) * adv)
    x = batch.ref_logprobs - logprobs
    d = torch.exp(x) - x - 1  # k3
    beta = obj.kl_coef
    kl_on = sel if cfg.kl_tokens == "selected" else batch.mask
    if cfg.normalize == "selected":  # eq. 2: 1/S sum over the selected (KL per kl_tokens)
        n_sel, n_all = int(sel.sum()), int(batch.mask.sum())
        kl_den = n_sel if cfg.kl_tokens == "selected" else n_all
        return -(s * sel).sum() / n_sel + beta * (d * kl_on).sum() / kl_den
    token_loss = -(s * sel) + beta * (d * kl_on)  # (B, T)
    lengths = torch.tensor(LENGTHS, dtype=DTYPE)
    if cfg.normalize == "per-group":  # the authors' code: each group on its own, summed
        total = torch.zeros((), dtype=DTYPE)
        for g in range(B // GROUP_SIZE):
            rows = list(range(g * GROUP_SIZE, (g + 1) * GROUP_SIZE))
            if obj.aggregation == "seq-mean-token-mean":  # A / (G |o_i|), summed
                for i in rows:
                    total = total + (token_loss[i] * batch.mask[i]).sum() / (
                        GROUP_SIZE * lengths[i]
                    )
            else:  # A / sum_{i in group} |o_i|, summed
                n_group = sum(LENGTHS[i] for i in rows)
                total = total + sum((token_loss[i] * batch.mask[i]).sum() for i in rows) / n_group
        return total
    if obj.aggregation == "seq-mean-token-mean":  # 1/G sum_i 1/|o_i| sum_t
        return ((token_loss * batch.mask).sum(-1) / lengths).sum() / B
    return (token_loss * batch.mask).sum() / int(batch.mask.sum())


@dataclass(frozen=True)
class Cell:
    """One engine's result: the loss and d loss / d logprobs ``(B, T)``, or a refusal."""

    loss: float | None = None
    grad: torch.Tensor | None = None
    refused: str | None = None


def reference(preset: str, algorithm: str) -> Cell:
    batch = fixed_batch()
    leaf = batch.logprobs.clone().requires_grad_(True)
    loss = reference_loss(batch, leaf, selection(preset), algorithm)
    loss.backward()
    return Cell(float(loss), leaf.grad)


# ------------------------------------------------------------------------------------------
# engines


def core(preset: str, algorithm: str) -> Cell:
    """README's composition on the whole batch (a single micro-batch, one process)."""
    batch = fixed_batch()
    obj, cfg = objective(algorithm), selection(preset)
    leaf = batch.logprobs.clone().requires_grad_(True)
    result = gmts.select_for_update(
        cfg,
        obj,
        logprobs=leaf,
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages,
        response_mask=batch.mask,
        entropy=batch.entropy,
        ref_logprobs=batch.ref_logprobs if obj.kl_coef else None,
        group_ids=batch.group_ids,
    )
    loss, _ = gmts.policy_loss(
        leaf,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        gmts.LossConfig.of(obj, cfg),
        selected=result.selected,
        ref_logprobs=batch.ref_logprobs if obj.kl_coef else None,
        group_ids=batch.group_ids,
    )
    loss.backward()
    return Cell(float(loss), leaf.grad)


def trainer(preset: str, algorithm: str) -> Cell:
    """The standalone trainer's mini-batch step as ``Trainer.train_step`` runs it
    (``train_minibatch``: the current policy's scores, ``select_minibatch``, then
    ``update_minibatch``), with the model forward replaced by the fixed log-probs through the
    trainer's forward seam, a ``TokenScorer`` stand-in
    (micro-batches of 2 rows; the "trl" preset's unit, a micro-batch, is then the whole batch,
    as in the TRL engine here)."""
    return trainer_cell(objective(algorithm), selection(preset))


def trainer_cell(
    obj: gmts.ObjectiveConfig, cfg: gmts.SelectionConfig, batch: Batch | None = None
) -> Cell:
    """:func:`trainer` for any objective, selection and batch (the objective rows use it)."""
    from gmts.core.logprobs import TokenStatistics
    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import Replicate
    from gmts.train.batch import ScoredBatch
    from gmts.train.forward_plan import Positions
    from gmts.train.update import train_minibatch

    batch = fixed_batch() if batch is None else batch
    leaf = batch.logprobs.clone().requires_grad_(True)
    train_batch = ScoredBatch(
        prompt_ids=torch.zeros(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.arange(B)[:, None].expand(B, T).contiguous(),  # row index per row
        response_mask=batch.mask,
        rewards=torch.zeros(B),
        advantages=batch.advantages,
        group_ids=batch.group_ids,
        old_logprobs=batch.old_logprobs,
        old_entropy=batch.entropy,
        ref_logprobs=batch.ref_logprobs if obj.kl_coef else None,
    )

    class FixedScorer:
        """The trainer's TokenScorer with the model's forward replaced by the fixed batch."""

        def __call__(self, model: Any, rows: Any, **_: Any) -> TokenStatistics:
            index = rows.response_ids[:, 0]  # (b,) which rows of the fixed batch
            return TokenStatistics(leaf[index], batch.entropy[index], None)

        def no_grad(self, model: Any, rows: Any, **_: Any) -> TokenStatistics:
            stats = self(model, rows)
            return TokenStatistics(stats.logprobs.detach(), stats.entropy, None)

        def positions(self, rows: Any) -> Positions:
            return Positions(0, 0)  # no model runs

    scorer, info = FixedScorer(), DistInfo()
    micro = B if cfg.unit == "micro-batch" else 2
    model = torch.nn.Linear(1, 1)
    result = train_minibatch(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        train_batch,
        scorer=scorer,
        selection=cfg,
        loss=gmts.LossConfig.of(obj, cfg, horizon=T),
        micro_batch_size=micro,
        grad_clip=None,
        strategy=Replicate(info, Precision(), torch.device("cpu")),
        step=0,
        policy_changed=True,  # the current policy's scores: the fixed log-probs, not the old
        overlap=False,
    )
    return Cell(result.loss, leaf.grad)


def trl(preset: str, algorithm: str) -> Cell:
    """GMTSGRPOTrainer._compute_loss on the batch as one micro-batch, TRL's forward replaced."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig  # noqa: F401  (TRL must import)

    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer
    from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer, gmts_args

    batch = fixed_batch()
    obj, cfg = objective(algorithm), selection(preset)
    model_dir = _tiny_model_dir(build_tiny_model, build_char_tokenizer, TinyModelConfig)
    try:
        args = GMTSGRPOConfig(
            output_dir=tempfile.mkdtemp(),
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            report_to="none",
            per_device_train_batch_size=B,
            num_generations=GROUP_SIZE,
            max_completion_length=T,
            save_strategy="no",
            seed=0,
            loss_type=algorithm,  # TRL names its loss types after the algorithms
            beta=obj.kl_coef,
            epsilon=obj.clip_low,
            epsilon_high=obj.clip_high,
            use_bias_correction_kl=False,
            **gmts_args(cfg),
        )
        engine = GMTSGRPOTrainer(
            model=model_dir,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "1+1="}] * B),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
        )
    except ValueError as err:
        return Cell(refused=_first_problem(err))
    engine.current_gradient_accumulation_steps = 1
    leaf = batch.logprobs.clone().requires_grad_(True)
    engine._gmts_forward = lambda model, inputs, **kw: (leaf, batch.entropy, None)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": batch.mask.long(),
        "advantages": batch.advantages,
        "old_per_token_logps": batch.old_logprobs,
        "num_items_in_batch": batch.mask.sum().to(DTYPE),
    }
    if obj.kl_coef:
        inputs["ref_per_token_logps"] = batch.ref_logprobs
    engine.model.train()
    loss = engine._compute_loss(engine.model, inputs)
    loss.backward()
    return Cell(float(loss), leaf.grad)


def _verl_batches() -> Any:
    """tests/integrations/verl_batches.py: verl mini-batches built with verl's own functions."""
    import importlib.util
    import sys

    if "verl_batches" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "integrations" / "verl_batches.py"
        spec = importlib.util.spec_from_file_location("verl_batches", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["verl_batches"] = module
        spec.loader.exec_module(module)
    return sys.modules["verl_batches"]


_VERL_PROMPTS = (2, 3, 2, 3, 2, 3)  # prompt tokens per answer (unequal: verl nests them)


def verl(preset: str, algorithm: str) -> Cell:
    """The verl plugin's loss (``GMTSPolicyLoss``) on an actor mini-batch of verl's default
    (V1) trainer built with verl's own functions: old log-probs in bfloat16, advantages from
    verl's GRPO estimator on the rewards, verl's micro-batches of 2 rows, the engine's output
    (the log-probs over prompt + response per answer) taken from one flat leaf. GRPO is verl's
    seq-mean-token-mean with the k3 KL loss (low_var_kl); DAPO token-mean without KL. The rows
    are not shuffled (``actor.shuffle=false``), so the tie rule sees the batch's own order."""
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    from verl.workers.utils.padding import no_padding_2_padding

    from gmts.integrations.verl.loss import GMTSPolicyLoss, prepare_selection
    from gmts.integrations.verl.settings import GMTSVerlSettings

    vb = _verl_batches()
    batch = fixed_batch()
    obj, cfg = objective(algorithm), selection(preset)
    try:
        settings = GMTSVerlSettings(selection=cfg)
        config = ActorConfig(
            strategy="fsdp",
            rollout_n=GROUP_SIZE,
            ppo_micro_batch_size_per_gpu=2,
            clip_ratio=obj.clip_low,
            clip_ratio_low=obj.clip_low,
            clip_ratio_high=obj.clip_high,
            clip_ratio_c=3.0,  # verl's default dual clip: inactive on this batch (asserted)
            loss_agg_mode=obj.aggregation,
            use_kl_loss=obj.kl_coef > 0,
            kl_loss_coef=obj.kl_coef,
            kl_loss_type="low_var_kl",
            entropy_coeff=0.0,
            policy_loss=PolicyLossConfig(loss_mode="vanilla"),
        )
        loss_fn = GMTSPolicyLoss(config, settings)
    except ValueError as err:
        return Cell(refused=_first_problem(err))

    def per_answer(values: torch.Tensor, fill: float) -> list[torch.Tensor]:
        """Engine layout: position P - 1 + t of answer i holds response token t's value."""
        out = []
        for i, (p, n) in enumerate(zip(_VERL_PROMPTS, LENGTHS)):
            row = torch.full((p + n,), fill, dtype=torch.float32)
            row[p - 1 : p - 1 + n] = values[i, :n].float()
            out.append(row)
        return out

    answers = vb.Answers(
        prompt_ids=[torch.arange(5, 5 + p) for p in _VERL_PROMPTS],
        response_ids=[torch.arange(1, n + 1) for n in LENGTHS],
        old_logprobs=per_answer(batch.old_logprobs, -1.0),
        ref_logprobs=per_answer(batch.ref_logprobs, -1.0),
        current_logprobs=per_answer(batch.logprobs, -1.0),
        current_entropy=per_answer(batch.entropy, 1.0),
        rewards=[1.0, 0.0, 0.0, 1.0, 1.0, 0.0],  # fixed_batch's rewards
        uids=[f"q{i // GROUP_SIZE}" for i in range(B)],
    )
    data = vb.v1_actor_batch(answers)
    (mini,) = vb.mini_batches(data, B, shuffle=False)
    mini = vb.engine_info(mini)
    prepare_selection(
        mini,
        settings,
        loss_fn.objective,
        logprobs=no_padding_2_padding(vb.model_output(answers, mini), mini),
        entropy=no_padding_2_padding(vb.model_output(answers, mini, "current_entropy"), mini),
    )
    leaf = torch.cat(answers.current_logprobs).requires_grad_(True)
    total = torch.zeros(())
    for micro in vb.micro_batches(mini, micro_batch_size=2):
        loss, _ = loss_fn({"log_probs": vb.model_output(answers, micro, leaf=leaf)}, micro)
        loss.backward()
        total = total + loss.detach()
    grad = torch.zeros(B, T, dtype=DTYPE)
    start = 0
    for i, (p, n) in enumerate(zip(_VERL_PROMPTS, LENGTHS)):
        grad[i, :n] = leaf.grad[start + p - 1 : start + p - 1 + n].to(DTYPE)
        start += p + n
    return Cell(float(total), grad)


_MODEL_DIRS: dict[str, str] = {}


def _tiny_model_dir(build_model: Callable, build_tokenizer: Callable, config_cls: Any) -> str:
    if "trl" not in _MODEL_DIRS:
        path = tempfile.mkdtemp()
        tokenizer = build_tokenizer()
        model = build_model(
            tokenizer, config_cls(architecture="qwen2", hidden_size=16, num_heads=2, num_layers=1)
        )
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        _MODEL_DIRS["trl"] = path
    return _MODEL_DIRS["trl"]


def _first_problem(err: Exception) -> str:
    """The first listed problem of an engine's refusal (one line for the table)."""
    lines = [line.strip("- ").strip() for line in str(err).splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]


ENGINE_FUNCTIONS: dict[str, Callable[[str, str], Cell]] = {
    "core": core,
    "trainer": trainer,
    "trl": trl,
    "verl": verl,
}

TOLERANCE = {"core": 1e-9, "trainer": 1e-9, "trl": 1e-9, "verl": 1e-5}
"""Relative tolerance per engine: float64 round-off, or float32 for verl, which computes its
loss in float32 (the inputs are exactly representable there)."""


def compare(cell: Cell, want: Cell, tolerance: float = 1e-9) -> str:
    """'equal' (loss and gradient within ``tolerance``), 'refused' or 'DIFFERS ...'."""
    if cell.refused is not None:
        return "refused"
    loss_ok = math.isclose(cell.loss, want.loss, rel_tol=tolerance, abs_tol=1e-12)
    grad_err = float((cell.grad - want.grad).abs().max())
    grad_ok = grad_err <= tolerance * max(float(want.grad.abs().max()), 1e-12)
    if loss_ok and grad_ok:
        return "equal"
    return f"DIFFERS (loss {cell.loss!r} vs {want.loss!r}, max grad error {grad_err:.3g})"


SEMANTICS = Path(__file__).resolve().parents[2] / "docs" / "semantics.md"


def documented_statuses() -> dict[tuple[str, str, str], str]:
    """(preset, algorithm, engine) -> status, from the table in docs/semantics.md."""
    text = SEMANTICS.read_text()
    block = re.search(
        r"<!-- conformance-matrix:start -->\n(.*?)\n<!-- conformance-matrix:end -->", text, re.S
    )
    if block is None:
        raise ValueError("docs/semantics.md has no conformance matrix block")
    lines = block.group(1).strip().splitlines()
    engines = [c.strip() for c in lines[0].strip("|").split("|")][2:]
    statuses = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        preset, algorithm = cells[0], cells[1].lower()
        for engine, status in zip(engines, cells[2:]):
            statuses[(preset, algorithm, engine)] = status
    return statuses


def markdown_table(statuses: dict[tuple[str, str, str], str]) -> str:
    """The matrix as docs/semantics.md shows it: rows preset x algorithm, columns engines."""
    head = "| preset | algorithm | " + " | ".join(ENGINES) + " |"
    rows = [head, "|" + "---|" * (2 + len(ENGINES))]
    for preset in PRESETS:
        for algorithm in ALGORITHMS:
            cells = [statuses.get((preset, algorithm, e), "not run") for e in ENGINES]
            rows.append(f"| {preset} | {algorithm.upper()} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # run in .venv for core/trainer/trl, in .venv-verl for verl
    import importlib.util as _util

    available = [e for e in ENGINES if e in ("core", "trainer") or _util.find_spec(e)]
    statuses = {}
    for preset in PRESETS:
        for algorithm in ALGORITHMS:
            want = reference(preset, algorithm)
            for name in available:
                cell = ENGINE_FUNCTIONS[name](preset, algorithm)
                statuses[(preset, algorithm, name)] = compare(cell, want, TOLERANCE[name])
    print(markdown_table(statuses))
