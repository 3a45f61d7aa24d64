"""The policy the trainer updates, and its KL reference: ``model.lora`` decides what trains.

- full fine-tuning (``model.lora: null``): every parameter trains, as float32 master weights
  (:class:`gmts.scale.precision.Precision`); the reference is a second, frozen copy of the
  starting model in the compute dtype, laid out by the strategy.
- LoRA (:mod:`gmts.models.lora`): the base is loaded frozen in the compute dtype
  (``Precision.frozen``: bf16 under ``model.dtype: bfloat16``) and peft adapters are added as
  float32 masters, the only parameters with ``requires_grad`` (so the optimizer, built from
  those, holds only them); the strategy lays the whole peft model out as it would any model.
  The reference is the same model with its adapters switched off
  (:class:`gmts.models.lora.AdaptersOff`): the starting policy, without a second copy.

Resume loads the checkpoint's ``model/`` before the strategy lays the model out: the whole
float32 model, or the base from ``model.path`` plus the saved float32 adapters.

``model.dtype: auto`` is resolved once, before anything reads the config
(:func:`resolve_dtype`): the run goes on with the dtype it picked, so every part (the engines,
the memory plan, the run's ``config.yaml``) sees the dtype the run computes in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gmts.models.loading import ModelPathError, load_model, resolve_model_path
from gmts.models.lora import (
    AdaptersOff,
    LoraConfig,
    add_adapters,
    is_adapter_folder,
    load_adapter_weights,
)
from gmts.scale.auto_dtype import DtypeChoice, choose_dtype
from gmts.scale.distributed import DistInfo, barrier
from gmts.scale.precision import Precision
from gmts.scale.strategy import Strategy, make_strategy

if TYPE_CHECKING:
    from gmts.train.config import TrainConfig


@dataclass(frozen=True)
class Policy:
    """The laid-out policy and its reference.

    Attributes:
        model: the trained model (on this rank's device, as the strategy lays it out).
        reference: what the reference log-probs are computed with (same forward signature;
            None without KL).
    """

    model: torch.nn.Module
    reference: Any


def resolve_dtype(
    cfg: TrainConfig, device: torch.device, info: DistInfo | None = None
) -> tuple[TrainConfig, DtypeChoice]:
    """``cfg`` with ``model.dtype`` as the run computes it (``auto`` resolved on ``device``,
    :func:`gmts.scale.auto_dtype.choose_dtype`), and the choice (what was read and why).

    With several processes every rank must pick the same dtype (a mixed group would shard and
    reduce tensors of two dtypes); ranks that disagree raise, naming each rank's choice.
    """
    choice = choose_dtype(cfg.model.dtype, device)
    if info is not None and info.world_size > 1:
        import torch.distributed as dist

        picked: list[Any] = [None] * info.world_size
        dist.all_gather_object(picked, choice.dtype, group=info.group)
        if len(set(picked)) > 1:
            ranks = ", ".join(f"rank {r}: {d}" for r, d in enumerate(picked))
            raise ValueError(
                f"model.dtype={cfg.model.dtype}: the processes picked different dtypes "
                f"({ranks}); set model.dtype=float32 or bfloat16"
            )
    if choice.dtype == cfg.model.dtype:
        return cfg, choice
    model = dataclasses.replace(cfg.model, dtype=choice.dtype)
    return dataclasses.replace(cfg, model=model), choice


def resolve_base_path(cfg: TrainConfig, info: DistInfo, *, progress: bool) -> str:
    """``model.path`` resolved (:func:`gmts.models.loading.resolve_model_path`; the embedded
    warm start of ``data.task`` and ``seed`` is built on first use, with ``progress``): rank 0
    first (it builds and caches the warm start), then the other ranks, which find it.

    Raises:
        ValueError: ``model.path`` designates no model (the message names the setting).
    """

    def resolve(progress: bool) -> str:
        try:
            return resolve_model_path(
                cfg.model.path, task=cfg.data.task, seed=cfg.seed, progress=progress
            )
        except ModelPathError as exc:
            raise ValueError(f"model.path: {exc}") from None

    path = resolve(progress) if info.is_main else ""
    barrier(info)
    return path if info.is_main else resolve(False)


def load_policy(
    *,
    base_path: str,
    resume_from: Path | None,
    lora: LoraConfig | None,
    strategy: Strategy,
    reference: bool,
    seed: int,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
) -> Policy:
    """Load the policy (and, with ``reference``, its KL reference) and lay it out.

    Args:
        base_path: the starting model (``model.path`` resolved).
        resume_from: a checkpoint folder to continue from (its ``model/``), or None.
        lora: ``model.lora`` (None: full fine-tuning).
        seed: seeds the adapters' initialisation (the same on every rank).
    """
    precision = strategy.precision
    saved = None if resume_from is None else str(resume_from / "model")
    if saved is not None and is_adapter_folder(saved) != (lora is not None):
        held = "LoRA adapters" if is_adapter_folder(saved) else "a whole model"
        raise ValueError(
            f"--resume: {resume_from} holds {held}, but model.lora is "
            f"{'null' if lora is None else 'set'}; resume with the run's own model.lora"
        )
    if lora is None:
        policy = load_model(
            saved or base_path,
            dtype=precision.master,
            trust_remote_code=trust_remote_code,
            gradient_checkpointing=gradient_checkpointing,
        )
        model = strategy.prepare_policy(policy)
        ref = None
        if reference:  # the reference is always the starting policy
            frozen = load_model(
                base_path,
                dtype=precision.frozen,
                trust_remote_code=trust_remote_code,
                training=False,
            )
            ref = strategy.prepare_reference(frozen.requires_grad_(False))
        return Policy(model, ref)
    base = load_model(
        base_path,
        dtype=precision.frozen,
        trust_remote_code=trust_remote_code,
        gradient_checkpointing=gradient_checkpointing,
    )
    policy = add_adapters(base, lora, seed=seed, base_path=base_path, dtype=precision.master)
    if saved is not None:
        load_adapter_weights(policy, saved)
    model = strategy.prepare_policy(policy)
    return Policy(model, AdaptersOff(model) if reference else None)


def build_policy(
    cfg: TrainConfig,
    base_path: str,
    *,
    info: DistInfo,
    device: torch.device,
    resume_from: Path | None = None,
    reference: bool = True,
) -> tuple[Strategy, Policy]:
    """``cfg``'s strategy (``distributed.strategy`` in the precision of ``model.dtype``, ``auto``
    resolved on ``device``) and its policy, loaded and laid out by it (:func:`load_policy`):
    what ``Trainer`` trains, and what :func:`gmts.train.evaluation.evaluate_start` evaluates.

    Args:
        base_path: the starting model (``model.path`` resolved).
        info, device: this process's place in the group and its device.
        resume_from: a checkpoint folder to continue from, or None.
        reference: load the KL reference where ``cfg`` asks for one (``objective.kl_coef >
            0``); False: never (an evaluation needs none).
    """
    precision = Precision.from_name(choose_dtype(cfg.model.dtype, device).dtype)
    strategy = make_strategy(cfg.distributed.strategy, info, precision, device)
    policy = load_policy(
        base_path=base_path,
        resume_from=resume_from,
        lora=cfg.model.lora,
        strategy=strategy,
        reference=reference and cfg.objective.kl_coef > 0,
        seed=cfg.seed,
        trust_remote_code=cfg.model.trust_remote_code,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )
    return strategy, policy
