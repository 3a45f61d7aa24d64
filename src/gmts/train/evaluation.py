"""A run's held-out evaluation: average@k / pass@k of its policy on the held-out questions
(``data.task``'s, or ``data.eval_dataset``'s), through
:func:`gmts.embedded.evaluation.held_out_metrics`.

- :func:`evaluate_held_out` is what ``Trainer.evaluate`` runs (before step 1, every
  ``data.eval_every`` steps, after the last);
- :func:`evaluate_start` evaluates a config's starting policy with it, loaded as
  ``Trainer(cfg)`` loads it, without the rest of a run (run folder, optimizer, memory plan,
  rollout engine): ``gmts demo``'s one evaluation of each seed's start, step 0 of every
  method's curve. It gives exactly what ``Trainer(cfg).evaluate()`` gives before any step.

The sampling draws from its own generator (seeded with ``seed``), so the global RNGs play no
part in the result; the thread count (``threads``) does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from gmts._progress import Progress, count_forwards
from gmts.scale.distributed import DistInfo, barrier
from gmts.scale.strategy import Strategy
from gmts.train.sources import HeldOutSet

if TYPE_CHECKING:
    from gmts.train.config import TrainConfig


def evaluate_held_out(
    cfg: TrainConfig,
    model: torch.nn.Module,
    tokenizer: Any,
    target: Any,
    *,
    strategy: Strategy,
    info: DistInfo,
) -> dict[str, float] | None:
    """``{"average@k", "pass@k", "questions"}`` of ``model`` on ``target`` (rank 0; None on the
    other ranks, and without any held-out question).

    Args:
        cfg: the run's config (``data.eval_questions``, ``eval_samples``, ``eval_temperature``,
            ``rollout.generation_batch_size``, ``seed``).
        target: the built-in task (its first ``data.eval_questions`` held-out questions), a
            :class:`gmts.train.sources.HeldOutSet` (all its questions), or None.
        strategy, info: how ``model`` is laid out; every rank must call (rank 0 samples, the
            others wait for it).
    """
    d = cfg.data
    if target is None or d.eval_questions == 0:
        return None
    questions = len(target.problems) if isinstance(target, HeldOutSet) else d.eval_questions
    result = None
    with strategy.sampling(model):  # every rank enters; rank 0 samples
        if info.is_main:
            from gmts.embedded.evaluation import EVAL_BATCH_SIZE, held_out_metrics

            rows = questions * d.eval_samples
            chunk = cfg.rollout.generation_batch_size or EVAL_BATCH_SIZE
            what = f"held-out evaluation ({questions} questions x {d.eval_samples} samples)"
            # one forward of the model per sampled token of each generation chunk (fewer when
            # every row of a chunk has ended)
            tokens = math.ceil(rows / chunk) * target.max_new_tokens
            with Progress(what, tokens, "tokens", enabled=cfg.logging.progress) as shown:
                with count_forwards(model, shown.update):
                    result = held_out_metrics(
                        model,
                        tokenizer,
                        target,
                        n_questions=questions,
                        k=d.eval_samples,
                        seed=cfg.seed,
                        batch_size=cfg.rollout.generation_batch_size,
                        temperature=d.eval_temperature,
                    )
                shown.close(", ".join(f"{k} {v:.3f}" for k, v in result.items() if "@" in k))
    barrier(info)  # the other ranks wait for rank 0's evaluation
    return result


def evaluate_start(cfg: TrainConfig, *, progress: bool = False) -> dict[str, float] | None:
    """:func:`evaluate_held_out` of ``cfg``'s starting policy on its built-in task: the model
    and tokenizer of ``model.path`` (``"embedded"``: the warm start, built on first use with
    ``progress``), laid out as the trainer lays them out (:func:`gmts.train.policy.build_policy`:
    ``model.dtype``, ``model.lora``, ``distributed.strategy``), no KL reference.

    Raises:
        ValueError: ``cfg`` trains on a dataset (``data.dataset``): its held-out set is made
            by the trainer's source (``Trainer(cfg).evaluate()``).
    """
    from gmts.embedded.tasks import get_task
    from gmts.models.loading import load_tokenizer, pick_device
    from gmts.scale.distributed import init_distributed
    from gmts.train.policy import build_policy, resolve_base_path

    if cfg.data.dataset is not None:
        raise ValueError(
            "evaluate_start evaluates a built-in task (data.task); a data.dataset run's held-out "
            "set comes from its source: Trainer(cfg).evaluate()"
        )
    task = get_task(cfg.data.task)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    info = init_distributed(cfg.model.device)
    device = pick_device(cfg.model.device, info.local_rank)
    path = resolve_base_path(cfg, info, progress=progress)
    tokenizer = load_tokenizer(path, trust_remote_code=cfg.model.trust_remote_code)
    strategy, policy = build_policy(cfg, path, info=info, device=device, reference=False)
    return evaluate_held_out(cfg, policy.model, tokenizer, task, strategy=strategy, info=info)
