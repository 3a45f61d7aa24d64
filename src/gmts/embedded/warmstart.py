"""Supervised warm start of the tiny model on noisy demonstrations, cached on disk.

RLVR needs a policy that already gets some answers right, and room to improve. ``warm_start``
trains the tiny model (``gmts.embedded.tiny_model``) on demonstrations of a built-in task whose
answer digits are replaced by random digits with probability ``noise`` (0.3 by default), with the
loss on the completion only (batch 128, AdamW 1e-3, 50 warm-up steps, clip 1.0; see
../shared/notes/embedded-task-calibration.md). It stops once its greedy answer is right on 35% of
a fixed set of 400 training questions, on average over the last 5 checks (at most 2,000 steps):
the warm-up's accuracy rises from near 0 to near 1 within about a hundred steps, at a step that
moves with the seed and with the CPU's floating-point path, so a fixed step count would give one
seed a model that knows nothing and another a model RL can only sharpen. Checks run every 10
steps until one reaches 20%, then after every step, so the stop does not overshoot the target by
a check interval's rise; the mean over 5 checks of 400 questions keeps one lucky check from
stopping it early (benchmarks/warmstart_stop.py measures both). Stopped early, the warm model
leaves RL room to add ability, not only to remove the copied noise (docs/training.md has the
measured steps and accuracies).

The result is a Hugging Face model directory (model + tokenizer + ``warmstart.json`` with the
settings, every check and the held-out scores), written atomically (temporary directory, then
rename) under a name made from a hash of the settings, so later runs with the same settings
reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gmts._cache import cache_dir as gmts_cache_dir
from gmts.embedded.tiny_model import TinyModelConfig

INFO_FILE = "warmstart.json"
_FORMAT_VERSION = 2  # bump when the training recipe changes in a way the settings do not show


@dataclass(frozen=True)
class WarmStartConfig:
    """Settings of the supervised warm start (defaults: the demo's recipe, see the module doc).

    Attributes:
        steps: optimizer steps at most.
        stop_at_greedy: stop once the greedy accuracy on ``check_questions`` questions of the
            training distribution (a fixed set; never the held-out questions), averaged over
            the last ``stop_window`` checks, reaches this; None trains all ``steps``. The
            warm-up's accuracy jumps at a step that moves with the seed and the floating-point
            path, so a fixed step count gives warm starts of very different strength; stopping
            on a check gives every seed about the same headroom for RL.
        check_every: steps between two checks until one reaches ``fine_check_from``.
        check_questions: questions of the check.
        fine_check_from: from the first check at or above this accuracy on, check after every
            step (None: every ``check_every`` steps throughout). Near the target the accuracy
            rises by several points in ``check_every`` steps, which a coarse check overshoots.
        stop_window: checks averaged for the stop (1: the last check alone). One check of a
            few hundred questions is a few points noisy, and the model's greedy answers
            themselves move from step to step.
        batch_size: demonstrations per step.
        lr: AdamW peak learning rate, reached linearly after ``warmup_steps``, then constant.
        warmup_steps: linear warm-up length.
        weight_decay: AdamW weight decay.
        grad_clip: max global gradient norm.
        noise: probability that a demonstration's answer digit is replaced by a random digit
            (None: the task's ``demo_noise``).
        eval_questions: held-out questions used to score the warm model.
        eval_samples: samples per question (average@n, pass@n).
        model: tiny model shape.
    """

    steps: int = 2000
    stop_at_greedy: float | None = 0.35
    check_every: int = 10
    check_questions: int = 400
    fine_check_from: float | None = 0.2
    stop_window: int = 5
    batch_size: int = 128
    lr: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    noise: float | None = None
    eval_questions: int = 200
    eval_samples: int = 16
    model: TinyModelConfig = field(default_factory=TinyModelConfig)

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "check_every",
            "check_questions",
            "stop_window",
            "batch_size",
            "eval_questions",
            "eval_samples",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip!r}")
        if self.stop_at_greedy is not None and not 0.0 < self.stop_at_greedy <= 1.0:
            raise ValueError(
                f"stop_at_greedy must be in (0, 1] or None, got {self.stop_at_greedy!r}"
            )
        if self.fine_check_from is not None and not 0.0 < self.fine_check_from <= 1.0:
            raise ValueError(
                f"fine_check_from must be in (0, 1] or None, got {self.fine_check_from!r}"
            )
        if self.noise is not None and not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1] or None, got {self.noise!r}")
        if not isinstance(self.model, TinyModelConfig):
            raise ValueError(f"model must be a TinyModelConfig, got {type(self.model).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StopCheck:
    """The early stop's bookkeeping, apart from any model: when to check, whether to stop.

    ``due(steps_done)`` says whether to check after that step; ``record(steps_done, accuracy)``
    stores a check and returns whether training stops there. ``history`` holds every
    ``(step, accuracy)`` checked; ``smoothed`` is the mean of the last ``stop_window`` checks.
    benchmarks/warmstart_stop.py replays it on traced accuracies.
    """

    def __init__(self, config: WarmStartConfig) -> None:
        self.config = config
        self.history: list[tuple[int, float]] = []
        self.fine = False

    def due(self, steps_done: int) -> bool:
        if self.config.stop_at_greedy is None:
            return False
        return self.fine or steps_done % self.config.check_every == 0

    @property
    def smoothed(self) -> float | None:
        recent = [a for _, a in self.history[-self.config.stop_window :]]
        return sum(recent) / len(recent) if recent else None

    def record(self, steps_done: int, accuracy: float) -> bool:
        c = self.config
        self.history.append((steps_done, accuracy))
        if c.fine_check_from is not None and accuracy >= c.fine_check_from:
            self.fine = True
        smoothed = self.smoothed
        return (
            c.stop_at_greedy is not None
            and len(self.history) >= c.stop_window
            and smoothed is not None
            and smoothed >= c.stop_at_greedy
        )


def default_cache_dir() -> Path:
    """``$GMTS_CACHE/warmstart`` when GMTS_CACHE is set, else ``~/.cache/gmts/warmstart``."""
    return gmts_cache_dir("warmstart")


def warm_start_settings(
    task_name: str, *, seed: int = 0, config: WarmStartConfig | None = None
) -> dict[str, Any]:
    """Everything that determines the warm-started model (what the cache key hashes)."""
    from gmts.embedded.tasks import get_task

    task = get_task(task_name)
    config = config or WarmStartConfig()
    noise = task.demo_noise if config.noise is None else config.noise
    return {
        "format": _FORMAT_VERSION,
        "task": asdict(task),
        "seed": seed,
        "config": {**config.to_dict(), "noise": noise},
    }


def _cache_entry(
    task_name: str, cache_dir: str | os.PathLike[str] | None, seed: int, config: WarmStartConfig
) -> tuple[dict[str, Any], str, Path]:
    """(settings, their hash, the cache folder) of one warm start."""
    settings = warm_start_settings(task_name, seed=seed, config=config)  # validates task_name
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return settings, key, root / f"{task_name}-seed{seed}-{key}"


def is_cached(
    task_name: str = "addition",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    config: WarmStartConfig | None = None,
) -> bool:
    """Whether :func:`warm_start` with these arguments would reuse a cached result."""
    _, _, final = _cache_entry(task_name, cache_dir, seed, config or WarmStartConfig())
    return (final / INFO_FILE).is_file()


def warm_start(
    task_name: str = "addition",
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    steps: int | None = None,
    config: WarmStartConfig | None = None,
    progress: bool = True,
) -> Path:
    """Warm-start the tiny model on ``task_name`` (or reuse the cached result) and return its dir.

    Args:
        task_name: a registered built-in task (``gmts.embedded.tasks.available_tasks()``).
        cache_dir: where results live (default ``default_cache_dir()``).
        seed: seeds the initialisation and the data order; the same seed gives the same model
            (on the same machine and thread count).
        steps: overrides ``config.steps``.
        config: the recipe (``WarmStartConfig()`` when None).
        progress: show a tqdm progress bar.

    Returns:
        A directory loadable with ``AutoModelForCausalLM.from_pretrained`` and
        ``AutoTokenizer.from_pretrained`` (or ``load_warm_start``); ``warmstart.json`` there holds
        the settings, the held-out ``average_at_n``/``pass_at_n`` and the training time.
    """
    config = config or WarmStartConfig()
    if steps is not None:
        config = replace(config, steps=steps)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    settings, key, final = _cache_entry(task_name, cache_dir, seed, config)
    root = final.parent
    if (final / INFO_FILE).is_file():
        return final

    root.mkdir(parents=True, exist_ok=True)
    with _one_builder(final):  # another process building this warm start is waited for
        if (final / INFO_FILE).is_file():
            return final
        model, tokenizer, info = _train(task_name, seed=seed, config=config, progress=progress)
        info = {"settings": settings, "key": key, **info}
        _write_atomically(final, model, tokenizer, info)
    return final


@contextmanager
def _one_builder(final: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``final``'s lock file (``fcntl.flock``: released when the
    process ends, however it ends), so two processes asking for the same warm start train it
    once. Where ``fcntl`` is missing (Windows) both train; the atomic rename keeps one."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(final.parent / f".{final.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomically(final: Path, model: Any, tokenizer: Any, info: dict[str, Any]) -> None:
    """Save into a staging folder next to ``final``, then rename it: a reader never sees half."""
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        with _hf_progress_bars_off():  # ours is the only bar the user should see
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
        (staging / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(staging, final)
        except OSError:
            if not (final / INFO_FILE).is_file():  # not a concurrent writer that got there first
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def load_warm_start(path: str | os.PathLike[str]) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, info) from a ``warm_start`` directory; the model is in training mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / INFO_FILE).is_file():
        raise ValueError(f"{path} is not a warm-start directory (no {INFO_FILE})")
    with _hf_progress_bars_off():
        model = AutoModelForCausalLM.from_pretrained(path)
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(path)
    info = json.loads((path / INFO_FILE).read_text())
    return model, tokenizer, info


@contextmanager
def _hf_progress_bars_off() -> Iterator[None]:
    """Silence transformers' own progress bars ("Writing model shards", "Loading weights")."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _batch(
    task: Any, tokenizer: Any, rng: random.Random, size: int, noise: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels), each (b, L), right-padded; labels are -100 except
    on the completion tokens and the EOS (the loss is on the completion only)."""
    problems = task.sample(size, rng)
    texts = [p.prompt for p in problems] + [task.demonstration(p, rng, noise) for p in problems]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]  # one call for both halves
    prompts, targets = encoded[:size], encoded[size:]
    eos = tokenizer.eos_token_id
    width = max(len(p) + len(t) for p, t in zip(prompts, targets)) + 1
    ids_rows, mask_rows, label_rows = [], [], []
    for prompt, target in zip(prompts, targets):
        pad = width - len(prompt) - len(target) - 1
        ids_rows.append(prompt + target + [eos] + [eos] * pad)
        mask_rows.append([1] * (width - pad) + [0] * pad)
        label_rows.append([-100] * len(prompt) + target + [eos] + [-100] * pad)
    input_ids = torch.tensor(ids_rows, dtype=torch.long)
    attention_mask = torch.tensor(mask_rows, dtype=torch.long)
    labels = torch.tensor(label_rows, dtype=torch.long)
    return input_ids, attention_mask, labels


def _train(
    task_name: str,
    *,
    seed: int,
    config: WarmStartConfig,
    progress: bool,
    observe: Callable[[int, Any], None] | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Train one warm start; ``observe(steps_done, model)``, when given, runs after every
    optimizer step and before that step's check (it must leave the model in training mode and
    the data stream alone: benchmarks/warmstart_stop.py traces the accuracy with it)."""
    from tqdm.auto import tqdm

    from gmts.embedded.evaluation import evaluate_task
    from gmts.embedded.tasks import get_task
    from gmts.embedded.tiny_model import build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    task = get_task(task_name)
    noise = task.demo_noise if config.noise is None else config.noise
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, replace(config.model, seed=config.model.seed + seed))
    needed = task.prompt_length + task.max_new_tokens
    if needed > config.model.max_positions:
        raise ValueError(
            f"task {task_name!r} needs {needed} positions but model.max_positions is "
            f"{config.model.max_positions}"
        )
    rng = random.Random(f"warmstart/{task_name}/{seed}")
    check = task.sample(config.check_questions, random.Random(f"warmstart-check/{task_name}"))
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    warmup = max(config.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    stop = StopCheck(config)
    model.train()
    start = time.perf_counter()
    loss_value = float("nan")
    steps_done = 0
    bar = tqdm(
        total=config.steps, desc=f"warm start ({task_name})", disable=not progress, leave=False
    )
    for step in range(config.steps):
        batch = _batch(task, tokenizer, rng, config.batch_size, noise)
        loss_value = _sft_step(model, optimizer, scheduler, batch, config.grad_clip)
        steps_done = step + 1
        bar.update(1)
        if step % 20 == 0 or step == config.steps - 1:
            bar.set_postfix(loss=f"{loss_value:.3f}")
        if observe is not None:
            observe(steps_done, model)
        if stop.due(steps_done):
            model.eval()  # greedy decoding: no randomness, the data stream is untouched
            accuracy = evaluate_task(model, tokenizer, task, check, n=1, temperature=0.0)
            model.train()
            done = stop.record(steps_done, accuracy.average_at_n)
            bar.set_postfix(loss=f"{loss_value:.3f}", check=f"{stop.smoothed:.2f}")
            if done:
                break
    bar.close()
    train_seconds = time.perf_counter() - start
    info = {
        **_held_out_scores(model, tokenizer, task, config, seed),
        "steps_done": steps_done,
        "check_accuracy": stop.smoothed,
        "checks": [[step, accuracy] for step, accuracy in stop.history],
        "final_loss": loss_value,
        "train_seconds": round(train_seconds, 2),
        "num_threads": torch.get_num_threads(),
    }
    return model, tokenizer, info


def _sft_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    grad_clip: float,
) -> float:
    """One supervised step on ``(input_ids, attention_mask, labels)``; returns the loss."""
    input_ids, attention_mask, labels = batch
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (b, L, V)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()
    return float(loss.item())


def _held_out_scores(
    model: Any, tokenizer: Any, task: Any, config: WarmStartConfig, seed: int
) -> dict[str, Any]:
    """average@n and pass@n (sampled with ``seed``) and greedy accuracy on the held-out
    questions, in eval mode (training mode restored)."""
    from gmts.embedded.evaluation import evaluate_task

    held_out = task.held_out(config.eval_questions)
    model.eval()
    result = evaluate_task(model, tokenizer, task, held_out, n=config.eval_samples, seed=seed)
    greedy = evaluate_task(model, tokenizer, task, held_out, n=1, temperature=0.0)
    model.train()
    return {
        "average_at_n": result.average_at_n,
        "pass_at_n": result.pass_at_n,
        "n": result.n,
        "greedy_accuracy": greedy.average_at_n,
    }
