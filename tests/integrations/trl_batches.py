"""TRL micro-batches built by TRL's own ``GRPOTrainer._generate_and_score_completions``, and
TRL's own loss on them (not a test module; imported by the TRL tests).

The generation goes through TRL's ``rollout_func`` hook: :class:`SamplerRollout` plays the
inference engine, returning completions of unequal lengths and their per-token sampling
log-probs (the tiny model's own log-probs plus noise, as a vLLM engine whose numerics differ
from the trainer's). Everything else (padding, the old-policy pass, the reference pass,
rewards, advantages, ``num_items_in_batch`` and, with ``use_vllm`` and
``vllm_importance_sampling_correction`` switched on, the importance-sampling ratio of every
``vllm_importance_sampling_mode``) is TRL's code. TRL's constructor would start a vLLM server or
engine for ``use_vllm=True``; so the trainer is built with ``use_vllm=False`` and
:func:`generation_batch` switches ``use_vllm`` / ``vllm_importance_sampling_*`` on the live
trainer, the attributes TRL's generation and loss read (its weight sync is skipped by marking
the weights as loaded for the current step).

The loss side replaces TRL's forward (``_get_per_token_logps_and_entropies``) by fixed
per-token log-probs and entropies (leaves), so TRL's ``_compute_loss`` and ours are functions
of the same tensors and their gradients with respect to them can be compared.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOTrainer

from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
from gmts.embedded.tokenizer import build_char_tokenizer

PROMPTS = ("1+2=", "3+4=", "5*6=", "7-2=")
GROUP = 4  # num_generations
ROWS = 8  # rows of one generation batch (two questions)
MAX_COMPLETION = 7


def save_tiny_model(path: str) -> str:
    """A tiny Qwen2 model and the char tokenizer saved in ``path`` (no hub)."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        TinyModelConfig(architecture="qwen2", hidden_size=32, num_heads=2, num_layers=1),
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def trl_kwargs(**overrides: Any) -> dict[str, Any]:
    """GRPOConfig keyword arguments for CPU runs of the tiny model."""
    kwargs: dict[str, Any] = dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        per_device_train_batch_size=ROWS,
        num_generations=GROUP,
        max_completion_length=MAX_COMPLETION,
        save_strategy="no",
        seed=0,
        beta=0.04,  # builds the reference model; tests set trainer.beta = 0 where they need
    )
    kwargs.update(overrides)
    return kwargs


def _reward(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c) % 3) + 0.5 * float(c[:1] in "0123456789") for c in completions]


class SamplerRollout:
    """TRL ``rollout_func``: completions of random lengths 1..MAX_COMPLETION and their
    sampling log-probs = the model's own + N(0, noise^2) (an engine with other numerics)."""

    def __init__(self, seed: int = 0, noise: float = 0.4) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.noise = noise

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        tokenizer = trainer.processing_class
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        vocab = len(tokenizer)
        lengths = torch.randint(1, MAX_COMPLETION + 1, (len(prompts),), generator=self.generator)
        lengths[0] = MAX_COMPLETION  # one full-length answer
        completion_ids = [
            torch.randint(3, vocab - 2, (int(n),), generator=self.generator).tolist()
            for n in lengths
        ]
        logprobs = []
        with torch.no_grad():
            for prompt, completion in zip(prompt_ids, completion_ids, strict=True):
                ids = torch.tensor([prompt + completion])
                lp, _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, torch.ones_like(ids), len(completion)
                )
                noise = self.noise * torch.randn(len(completion), generator=self.generator)
                logprobs.append((lp[0] + noise).tolist())
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def build_trainer(cls: type, args: Any, model_dir: str, *, seed: int = 0) -> Any:
    """``cls(model=model_dir, ...)`` with :class:`SamplerRollout` as its rollout function."""
    trainer = cls(
        model=model_dir,
        reward_funcs=_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 2]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        rollout_func=SamplerRollout(seed),
    )
    trainer.current_gradient_accumulation_steps = 1  # Trainer.train() sets it otherwise
    with torch.no_grad():  # the reference model differs from the policy (a KL that matters)
        ref = getattr(trainer, "ref_model", None)
        if ref is not None:
            g = torch.Generator().manual_seed(seed + 1)
            for p in ref.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    return trainer


def set_vllm_is(trainer: Any, mode: str | None, clip_min=None, clip_max=3.0) -> None:
    """Switch TRL's vLLM importance-sampling correction on (``mode``) or off (None)."""
    trainer.use_vllm = mode is not None
    trainer.vllm_importance_sampling_correction = mode is not None
    if mode is not None:
        trainer.vllm_importance_sampling_mode = mode
        trainer.vllm_importance_sampling_clip_min = clip_min
        trainer.vllm_importance_sampling_clip_max = clip_max
        trainer._last_loaded_step = trainer.state.global_step  # no weight sync to an engine


def generation_batch(trainer: Any, *, questions: tuple[str, ...] = PROMPTS[:2]) -> dict:
    """TRL's ``_generate_and_score_completions`` on ``questions`` x GROUP answers (train mode),
    with the trainer's current vLLM importance-sampling settings."""
    trainer.model.train()
    rows = [{"prompt": q} for q in questions for _ in range(GROUP)]
    return trainer._generate_and_score_completions(rows)


def current_policy(inputs: dict, seed: int, spread: float = 0.3) -> tuple[torch.Tensor, ...]:
    """``(logprobs, entropy)`` (B, T) float64 leaves: the policy being trained, a step away from
    the old one (ratios spread around 1, some clipped), and distinct positive entropies."""
    g = torch.Generator().manual_seed(seed)
    old = inputs.get("old_per_token_logps")
    if old is None:
        old = inputs["sampling_per_token_logps"]
    shape = inputs["completion_ids"].shape
    logprobs = old.double() + spread * torch.randn(shape, generator=g, dtype=torch.float64)
    entropy = (0.05 + 2.0 * torch.rand(shape, generator=g)).double()  # float32 values
    return logprobs.clamp(max=-1e-3), entropy


@contextlib.contextmanager
def fixed_forward(trainer: Any, logprobs: torch.Tensor, entropy: torch.Tensor) -> Iterator[None]:
    """Replace TRL's forward on ``trainer`` by the given ``(B, T)`` log-probs and entropies."""

    def forward(model, input_ids, attention_mask, logits_to_keep, **kwargs):  # noqa: ARG001
        return logprobs, entropy, None

    trainer._get_per_token_logps_and_entropies = forward
    try:
        yield
    finally:
        del trainer._get_per_token_logps_and_entropies


def double(inputs: dict) -> dict:
    """The batch with its floating-point tensors in float64 (exact comparisons)."""
    return {
        k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in inputs.items()
    }


def loss_and_grads(
    compute_loss: Any,
    trainer: Any,
    inputs: dict,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, d loss / d logprobs, d loss / d entropy)`` of ``compute_loss(trainer, model,
    inputs)`` (TRL's ``GRPOTrainer._compute_loss`` or ours) with the forward fixed."""
    lp = logprobs.detach().clone().requires_grad_(True)
    ent = entropy.detach().clone().requires_grad_(True)
    with fixed_forward(trainer, lp, ent):
        loss = compute_loss(trainer, trainer.model, inputs)
    grad_lp, grad_ent = torch.autograd.grad(loss, (lp, ent), allow_unused=True)
    zeros = torch.zeros_like(lp)
    return (
        loss.detach(),
        zeros if grad_lp is None else grad_lp,
        zeros if grad_ent is None else grad_ent,
    )


def trl_compute_loss(trainer: Any, model: Any, inputs: dict) -> torch.Tensor:
    """TRL's own ``GRPOTrainer._compute_loss`` (also on a GMTSGRPOTrainer instance)."""
    return GRPOTrainer._compute_loss(trainer, model, inputs)


def gmts_compute_loss(trainer: Any, model: Any, inputs: dict) -> torch.Tensor:
    return trainer._compute_loss(model, inputs)


@contextlib.contextmanager
def row_forward(
    trainer: Any, parts: list[dict], logprobs: torch.Tensor, entropy: torch.Tensor
) -> Iterator[None]:
    """Like :func:`fixed_forward` for the consecutive micro-batches ``parts`` of one batch
    (:func:`split_rows`): a forward over part j's rows gets their rows of the ``(B, T)``
    log-probs and entropies."""
    blocks, start = [], 0
    for part in parts:
        ids = torch.cat([part["prompt_ids"], part["completion_ids"]], dim=1)
        blocks.append((ids, slice(start, start + ids.shape[0])))
        start += ids.shape[0]

    def forward(model, input_ids, attention_mask, logits_to_keep, **kwargs):  # noqa: ARG001
        found = [rows for ids, rows in blocks if torch.equal(ids, input_ids)]
        assert len(found) == 1, "the forward's rows must be exactly one micro-batch"
        return logprobs[found[0]], entropy[found[0]], None

    trainer._get_per_token_logps_and_entropies = forward
    try:
        yield
    finally:
        del trainer._get_per_token_logps_and_entropies


def split_rows(inputs: dict, parts: int) -> list[dict]:
    """``inputs`` cut into ``parts`` micro-batches of consecutive rows (TRL's buffered slices;
    scalars such as num_items_in_batch are shared)."""
    rows = inputs["completion_ids"].shape[0]
    size = rows // parts
    return [
        {
            k: v[i * size : (i + 1) * size] if isinstance(v, torch.Tensor) and v.dim() > 0 else v
            for k, v in inputs.items()
        }
        for i in range(parts)
    ]
