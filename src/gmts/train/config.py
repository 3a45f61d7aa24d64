"""The trainer's configuration: one typed, validated dataclass tree.

``TrainConfig`` is the single source of truth for a run. YAML files, command-line overrides
(``section.field=value``, read by :mod:`gmts.configuration`), the ``--help`` text and
docs/training.md (:mod:`gmts.cli.config_reference`) are all derived from the dataclasses below
and their ``metadata["help"]``. The objective and the token selection reuse
the core's :class:`~gmts.core.config.ObjectiveConfig` and :class:`~gmts.core.config.SelectionConfig`;
``model.lora`` is :class:`~gmts.models.lora.LoraConfig` (the adapter plumbing's own dataclass,
shared with the memory plan and the loaders).

Validation happens in ``__post_init__`` (single fields) and :func:`build_config` (types, unknown
keys), so every mistake is reported before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gmts import configuration
from gmts.core.config import SelectionConfig
from gmts.core.objectives import ObjectiveConfig
from gmts.models.defaults import BUDGET_MAX, BUDGET_RULE
from gmts.models.lora import LoraConfig
from gmts.sampling.vllm_engine import VLLMConfig

ALGORITHMS = ("grpo", "dapo")
DATASET_MAX_NEW_TOKENS = BUDGET_MAX
"""The most a dataset run's fitted budget gives (rollout.max_response_length null:
gmts.models.defaults.fit_budget); the memory plan assumes it."""
PreemptSignal = Literal["SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT"]
PREEMPT_SIGNALS: tuple[str, ...] = typing.get_args(PreemptSignal)
"""The signals ``checkpoint.preempt_signal`` may add to SIGTERM (gmts.train.preemption)."""


def _f(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:  # noqa: A002
    """A dataclass field carrying its help text (the one place it is written)."""
    if "default_factory" in kw:
        return field(default_factory=kw.pop("default_factory"), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _check(condition: bool, name: str, message: str) -> None:
    """Raise ``ValueError("<name>: <message>")`` unless ``condition``."""
    if not condition:
        raise ValueError(f"{name}: {message}")


@dataclass
class ModelConfig:
    path: str = _f(
        "embedded",
        "Local Hugging Face causal-LM directory, a hub id (only where the hub is reachable), or "
        "'embedded' for the built-in tiny model warm-started on data.task (cached).",
    )
    dtype: Literal["float32", "bfloat16", "auto"] = _f(
        "float32",
        "Compute dtype. bfloat16: bf16 forward/backward over float32 master weights, gradients "
        "and AdamW state (mixed precision); frozen weights (the reference, a LoRA base) are "
        "held in bf16. Log-probs and entropies are always float32. auto: bfloat16 where the "
        "device computes bf16 natively (a GPU of compute capability >= 8.0; a CPU with "
        "AVX512-BF16 or AMX-BF16 running torch's AVX512 kernels, so not under "
        "ATEN_CPU_CAPABILITY=avx2 or ONEDNN_MAX_CPU_ISA=AVX2), float32 elsewhere; the run "
        "prints its choice and what it read, and config.yaml records the dtype used "
        "(gmts.scale.auto_dtype). The default stays float32: a seed gives the same numbers on "
        "every machine running the same kernels (the demo, the tests and the committed "
        "figures are float32), while auto's numbers depend on the machine.",
    )
    lora: LoraConfig | None = _f(
        None,
        "LoRA adapters through peft (e.g. model.lora.rank=16): only the adapters train (float32 "
        "masters, gradients and AdamW state), the base is frozen in model.dtype, the KL "
        "reference is the base (adapters off, no second copy) and checkpoints hold the "
        "adapters. null: full fine-tuning.",
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward (saves memory).")
    forward_layout: Literal["grouped", "padded"] = _f(
        "grouped",
        "How every forward of the trainer (old and reference log-probs, selection scores, the "
        "loss) lays out a micro-batch. grouped: each distinct prompt runs once and its keys and "
        "values are shared by the answers of its group (gradients summed exactly, as Prefix "
        "Grouper, arXiv 2506.05433), and the responses run in buckets of similar length, so "
        "the positions computed are within 10% of the real ones (update/positions_computed, "
        "update/positions_real); the same log-probs and gradients as padded up to float "
        "rounding. Needs full-attention layers (else: an error naming this setting). padded: "
        "every row runs its whole prompt and response, padded to the longest row (the layout "
        "before issue 34, bit for bit).",
    )
    device: str = _f("auto", "'auto' (cuda:<local rank> when available, else cpu), 'cpu', 'cuda'.")
    trust_remote_code: bool = _f(False, "Passed to from_pretrained for custom architectures.")
    logits_chunk_size: int | None = _f(
        None, "Compute log-probs/entropies over this many positions at a time (None: all)."
    )

    def __post_init__(self) -> None:
        _check(bool(self.path), "model.path", "must not be empty")
        _check(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "model.device",
            f"expected 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}",
        )
        _check(
            self.logits_chunk_size is None or self.logits_chunk_size > 0,
            "model.logits_chunk_size",
            f"must be positive or null, got {self.logits_chunk_size}",
        )


@dataclass
class DataConfig:
    task: str = _f(
        "addition", "Built-in verifiable task (gmts.embedded.tasks) used when data.dataset is null."
    )
    dataset: str | None = _f(
        None,
        "Training questions (overrides data.task): a benchmark of gmts.data.benchmarks (e.g. "
        "math12k: from $GMTS_DATA_DIR, else the Hugging Face Hub) or a .jsonl/.jsonl.gz/.json/"
        ".parquet file. Prompts and answers must be encodable by the model's tokenizer (the "
        "embedded model reads only 0123456789+-*=>; checked before training).",
    )
    split: str | None = _f(
        None,
        "Benchmark split for data.dataset (null: its train split when it has one, else its "
        "default; a benchmark's default split is the one it is evaluated on).",
    )
    question_field: str = _f("problem", "Question field of a dataset file (not benchmarks).")
    answer_field: str = _f("answer", "Answer field of a dataset file (not benchmarks).")
    reward: str = _f(
        "math",
        "Reward from gmts.rewards for data.dataset: math, choice, yes_no, code, format, exact "
        "(the completion is the answer), or one a --plugin registered.",
    )
    template: str | None = _f(
        "auto",
        "Prompt template of gmts.data.prompts for data.dataset (math, plain, code, ...). auto: "
        "the one that fits the model: plain (the question in the model's chat template) for a "
        "model with a chat template, else math where its tokenizer reads that instruction, "
        "else plain (the embedded model). null: the raw question text, no chat template.",
    )
    sandbox: Literal["bwrap", "subprocess"] | None = _f(
        None,
        "Sandbox for a reward that runs code (data.reward=code): bwrap (bubblewrap; without a "
        "working one training stops before loading the model) or subprocess (WEAKER, no "
        "filesystem/network/process isolation: explicit opt-in). null: $GMTS_SANDBOX, else bwrap.",
    )
    shuffle: bool = _f(True, "Shuffle the dataset each pass (seeded by the run seed).")
    eval_dataset: str | None = _f(
        None,
        "Held-out questions for dataset training: a benchmark of gmts.data.benchmarks (its "
        "default split, e.g. math500) or a file read like data.dataset (same fields, template "
        "and reward); evaluated as the built-in task's held-out set is (eval.jsonl: "
        "average@k, pass@k; data.eval_* below). null: no held-out evaluation.",
    )
    eval_questions: int = _f(
        100, "Held-out questions evaluated: the built-in task's, or the first N of eval_dataset."
    )
    eval_samples: int = _f(16, "Samples per held-out question (average@k and pass@k, k = this).")
    eval_every: int = _f(0, "Evaluate every N steps (0: only before and after training).")
    eval_before: bool = _f(True, "Evaluate the starting policy before the first step.")
    eval_temperature: float = _f(
        1.0,
        "Sampling temperature of the held-out evaluation (the paper's: 1.0; 0: greedy). A "
        "model trained at a lower rollout.temperature is usually evaluated at that one.",
    )

    def __post_init__(self) -> None:
        from gmts.data.prompts import check_template
        from gmts.rewards.registry import available_rewards
        from gmts.rewards.sandbox import BACKENDS as SANDBOX_BACKENDS

        if self.dataset is None:
            from gmts.embedded.tasks import available_tasks

            _check(
                self.task in available_tasks(),
                "data.task",
                f"unknown task {self.task!r}; available: {available_tasks()}",
            )
        if self.template is not None:
            check_template(self.template, "data.template")
        _check(
            self.reward in available_rewards(),
            "data.reward",
            f"unknown reward {self.reward!r}; available: {available_rewards()}",
        )
        _check(
            self.sandbox in (None, *SANDBOX_BACKENDS),
            "data.sandbox",
            f"expected one of {SANDBOX_BACKENDS} or null, got {self.sandbox!r}",
        )
        _check(
            self.eval_dataset is None or self.dataset is not None,
            "data.eval_dataset",
            "needs data.dataset (training on data.task evaluates on the task's own held-out set)",
        )
        _check(self.eval_questions >= 0, "data.eval_questions", "must be >= 0")
        _check(self.eval_samples >= 1, "data.eval_samples", "must be >= 1")
        _check(self.eval_every >= 0, "data.eval_every", "must be >= 0")
        _check(self.eval_temperature >= 0, "data.eval_temperature", "must be >= 0")


@dataclass
class RolloutConfig:
    questions_per_batch: int = _f(32, "Questions per rollout batch (all ranks together).")
    group_size: int = _f(8, "Answers sampled per question (G).")
    temperature: float = _f(1.0, "Sampling temperature; log-probs use the same temperature.")
    max_prompt_length: int = _f(
        1024,
        "Dataset training: longer prompts are dropped at load time (logged as "
        "data/skipped_too_long).",
    )
    max_response_length: int | None = _f(
        None,
        "Max new tokens per answer. null: the task's own limit; for data.dataset fitted to the "
        f"data and the model: {BUDGET_RULE} (printed at start). Prompt + this must fit the "
        "model's context (checked at start).",
    )
    generation_batch_size: int | None = _f(
        None,
        "Sequences generated at once (null: the whole batch). The hf engine's; vllm schedules "
        "its own (rollout.vllm.max_num_seqs).",
    )
    draw: str = _f(
        "multinomial",
        "The hf engine: how a token is drawn from its probabilities (gmts.sampling.draws): "
        "multinomial (torch.multinomial, one random number per vocabulary entry, the stream "
        "of every earlier release) or inverse_cdf (one per row: the same distribution, other "
        "tokens for a seed, cheaper on a large vocabulary: docs/results.md section 8). vllm "
        "draws with its own sampler.",
    )
    prepack_weights: bool = _f(
        False,
        "The hf engine on a CPU: multiply against oneDNN-prepacked copies of the float32 "
        "linear weights while sampling (gmts.sampling.packed_linear: one more copy of them "
        "during the rollout, counted by the memory plan; logits equal up to rounding).",
    )
    drop_finished_rows: bool = _f(
        True,
        "The hf engine: answers that have stopped leave the sampler's batch (when the rows "
        "still generating are at most 3/4 of it: gmts.sampling.rollout.DROP_ROWS_AT), so later "
        "decoding steps skip them, and each distinct prompt is prefilled once for its group; "
        "the same tokens up to kernel rounding. false computes every row's prompt and keeps "
        "every row until the last stops (the loop before issue 34). vllm batches its own.",
    )
    dynamic_sampling: bool | None = _f(
        None,
        "Drop groups whose raw rewards (before the overlong penalty) are all equal and sample "
        "further batches until full (null: on for DAPO, off for GRPO).",
    )
    max_sampling_rounds: int = _f(
        4,
        "Dynamic sampling: rollout rounds per step at most; then the batch is topped up with "
        "dropped groups, at advantage 0.",
    )
    overlong_buffer: int = _f(
        0, "DAPO soft overlong punishment: buffer length L_cache in tokens (0: off)."
    )
    overlong_penalty: float = _f(1.0, "Penalty at the maximum length (linear over the buffer).")
    std_normalize: bool = _f(True, "Divide group advantages by the group's std (GRPO eq. 1).")
    advantage_std: Literal["unbiased", "population"] = _f(
        "unbiased",
        "The group std of the advantages: unbiased (divide by G - 1: torch.std, TRL, verl) or "
        "population (divide by G: np.std, the authors' GMTS code; A is sqrt(G/(G-1)) larger).",
    )
    engine: str = _f(
        "hf",
        "Who samples the rollouts: hf (the KV-cached sampler on the policy itself) or vllm (a "
        "vLLM engine per rank in the trainer's process, sent the policy's weights before "
        "every rollout that follows an update; settings in rollout.vllm). Same sampling "
        "either way: plain softmax at the temperature, EOS kept, the same Rollout record.",
    )
    vllm: VLLMConfig = _f(
        help="The vLLM engine (rollout.engine=vllm only).", default_factory=VLLMConfig
    )
    correction: Literal["none", "token", "sequence"] = _f(
        "none",
        "Rollout correction (rollout.engine=vllm): weight each token's policy term by the "
        "truncated importance ratio min(pi_old/pi_engine, correction_cap), per token or per "
        "answer (the product over its tokens), as verl's rollout_is and TRL's vLLM "
        "token_truncate / sequence_truncate; folded into omega. none: off.",
    )
    correction_cap: float = _f(
        2.0, "C of rollout.correction (verl's rollout_is_threshold default: 2.0)."
    )

    def __post_init__(self) -> None:
        from gmts.sampling.sampler import SAMPLERS

        _check(
            self.engine in SAMPLERS,
            "rollout.engine",
            f"expected one of {SAMPLERS.names()}, got {self.engine!r}",
        )
        _check(self.questions_per_batch >= 1, "rollout.questions_per_batch", "must be >= 1")
        _check(self.group_size >= 1, "rollout.group_size", "must be >= 1")
        _check(self.temperature > 0, "rollout.temperature", "must be > 0")
        _check(self.max_prompt_length >= 1, "rollout.max_prompt_length", "must be >= 1")
        _check(
            self.max_response_length is None or self.max_response_length >= 1,
            "rollout.max_response_length",
            "must be >= 1 or null",
        )
        _check(
            self.generation_batch_size is None or self.generation_batch_size >= 1,
            "rollout.generation_batch_size",
            "must be >= 1 or null",
        )
        _check(self.max_sampling_rounds >= 1, "rollout.max_sampling_rounds", "must be >= 1")
        _check(self.overlong_buffer >= 0, "rollout.overlong_buffer", "must be >= 0")
        _check(self.overlong_penalty >= 0, "rollout.overlong_penalty", "must be >= 0")
        _check(
            self.correction_cap > 0,
            "rollout.correction_cap",
            f"must be > 0, got {self.correction_cap}",
        )
        _check(
            self.correction == "none" or self.engine != "hf",
            "rollout.correction",
            "needs a separate inference engine (rollout.engine=vllm): the hf engine samples with "
            "the policy itself, so there is nothing to correct",
        )
        from gmts.sampling.draws import DRAWS

        _check(
            self.draw in DRAWS.names(),
            "rollout.draw",
            f"expected one of {DRAWS.names()}, got {self.draw!r}",
        )
        hf_only = (
            ("draw", "multinomial"),
            ("prepack_weights", False),
            ("drop_finished_rows", True),
        )
        for name, default in hf_only:
            _check(
                getattr(self, name) == default or self.engine == "hf",
                f"rollout.{name}",
                "is a setting of the hf engine; rollout.engine=vllm samples with vLLM's own "
                "sampler and weights",
            )


@dataclass
class OptimConfig:
    steps: int = _f(200, "Training steps (rollout batches).")
    lr: float = _f(2e-4, "Peak learning rate (AdamW).")
    betas: tuple[float, float] = _f((0.9, 0.99), "AdamW betas.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    grad_clip: float | None = _f(1.0, "Clip the global gradient norm to this (null: no clip).")
    schedule: Literal["constant", "cosine"] = _f("constant", "Learning-rate schedule after warmup.")
    warmup_steps: int = _f(0, "Linear warmup, in optimizer steps.")
    min_lr_ratio: float = _f(0.0, "Cosine schedule: final lr as a fraction of the peak.")
    mini_batch_questions: int | None = _f(
        None,
        "Questions per optimizer step (null: the whole rollout batch, i.e. one step per batch). "
        "The Qwen3-8B setting uses 512 questions and mini-batches of 32: 16 steps per batch.",
    )
    epochs: int = _f(1, "Passes over each rollout batch.")
    micro_batch_size: int = _f(
        32, "Sequences per forward/backward (gradient accumulation inside a mini-batch)."
    )
    adamw: Literal["auto", "fused", "foreach", "for-loop"] = _f(
        "auto",
        "AdamW's implementation in torch: auto = fused where every trainable parameter is a "
        "plain tensor on a CPU or GPU (the same update to float rounding; over SmolLM2-135M's "
        "272 tensors 0.31x the time of torch's one-tensor-at-a-time CPU default on a 2-core "
        "Intel Xeon with AMX, benchmarks/bench_adamw.py), torch's default elsewhere.",
    )

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        _check(self.steps >= 0, "optim.steps", "must be >= 0")
        _check(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        _check(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optim.betas",
            f"expected two values in [0, 1), got {self.betas}",
        )
        _check(self.eps > 0, "optim.eps", "must be > 0")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _check(
            self.grad_clip is None or self.grad_clip > 0, "optim.grad_clip", "must be > 0 or null"
        )
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]")
        _check(
            self.mini_batch_questions is None or self.mini_batch_questions >= 1,
            "optim.mini_batch_questions",
            "must be >= 1 or null",
        )
        _check(self.epochs >= 1, "optim.epochs", "must be >= 1")
        _check(self.micro_batch_size >= 1, "optim.micro_batch_size", "must be >= 1")


@dataclass
class CheckpointConfig:
    every: int = _f(0, "Save a checkpoint every N steps and after the last (0: save_final only).")
    keep: int = _f(2, "Keep the last K checkpoints.")
    save_final: bool = _f(True, "Save a checkpoint after the last step.")
    preempt_signal: PreemptSignal | None = _f(
        None,
        "A signal handled like SIGTERM (which always is): training finishes the optimizer step "
        "in progress, saves a checkpoint, writes preempted.json and exits with status 75; "
        "--resume continues exactly. E.g. SIGUSR1 for SLURM's --signal=B:USR1@300. null: "
        "SIGTERM only.",
    )

    def __post_init__(self) -> None:
        _check(self.every >= 0, "checkpoint.every", "must be >= 0")
        _check(self.keep >= 1, "checkpoint.keep", "must be >= 1")
        _check(
            self.preempt_signal in (None, *PREEMPT_SIGNALS),
            "checkpoint.preempt_signal",
            f"expected one of {list(PREEMPT_SIGNALS)} or null, got {self.preempt_signal!r}",
        )


@dataclass
class DistributedConfig:
    strategy: str = _f(
        "replicate",
        "How the policy is spread over the torchrun processes: replicate (whole model, "
        "gradients and AdamW state on every rank, one gradient all-reduce per step) or fsdp "
        "(FSDP2: weights, gradients and AdamW state sharded over the ranks).",
    )
    check_memory: bool = _f(
        True,
        "On CUDA, refuse to start when the memory plan (printed at start) exceeds the GPU's "
        "memory; false starts anyway.",
    )

    def __post_init__(self) -> None:
        from gmts.scale.strategy import available_strategies

        _check(
            self.strategy in available_strategies(),
            "distributed.strategy",
            f"expected one of {available_strategies()}, got {self.strategy!r}",
        )


@dataclass
class LoggingConfig:
    output_dir: str = _f("runs/gmts", "Run directory: metrics.jsonl, config.yaml, checkpoints/.")
    report_to: Literal["none", "tensorboard", "wandb"] = _f(
        "none", "Also log to TensorBoard or Weights & Biases (must be installed)."
    )
    wandb_project: str = _f("gmts", "W&B project name.")
    progress: bool = _f(
        True,
        "Show progress on stderr (gmts._progress): on a terminal a bar over the steps with the "
        "live reward and the phase in progress (rollout, update) with counts and the time "
        "left, and one for each held-out evaluation; in a log one line per step or phase that "
        "took 10 s or more. false: none of these (a model's conversion and a checkpoint save "
        "still show theirs).",
    )
    overlap_metrics: bool = _f(
        True, "Log the GMTS-vs-ETS selection overlap (Jaccard) and selected-token statistics."
    )

    def __post_init__(self) -> None:
        import importlib.util

        package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(self.report_to)
        _check(
            package is None or importlib.util.find_spec(package) is not None,
            "logging.report_to",
            f"{self.report_to} is not installed (pip install {package})",
        )


@dataclass
class TrainConfig:
    algorithm: Literal["grpo", "dapo"] = _f(
        "dapo",
        "Sets the objective preset (ObjectiveConfig.preset) and the dynamic-sampling default.",
    )
    seed: int = _f(0, "Seed for data order, sampling, random scores and initialisation.")
    threads: int | None = _f(
        None,
        "torch.set_num_threads for this process (null: torch's default). Results are exactly "
        "reproducible only with the same thread count.",
    )
    model: ModelConfig = _f(help="The policy model.", default_factory=ModelConfig)
    data: DataConfig = _f(help="Training and evaluation data.", default_factory=DataConfig)
    rollout: RolloutConfig = _f(help="Sampling and rewards.", default_factory=RolloutConfig)
    objective: ObjectiveConfig | None = _f(
        None,
        "Clipped surrogate and KL (gmts.core ObjectiveConfig); fields given here override the "
        "algorithm's preset (objective.preset: another ObjectiveConfig preset).",
    )
    selection: SelectionConfig = _f(
        help="Token selection (gmts.core SelectionConfig); score 'none' trains on all tokens. "
        "selection.preset (paper, reference-code, trl) starts from SelectionConfig.preset; the "
        "section's other keys override it.",
        default_factory=SelectionConfig,
    )
    optim: OptimConfig = _f(help="Optimizer and batching.", default_factory=OptimConfig)
    distributed: DistributedConfig = _f(
        help="Layout over processes.", default_factory=DistributedConfig
    )
    checkpoint: CheckpointConfig = _f(help="Checkpoints.", default_factory=CheckpointConfig)
    logging: LoggingConfig = _f(help="Logging.", default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        _check(
            self.algorithm in ALGORITHMS,
            "algorithm",
            f"expected one of {list(ALGORITHMS)}, got {self.algorithm!r}",
        )
        _check(self.threads is None or self.threads >= 1, "threads", "must be >= 1 or null")
        if self.objective is None:
            self.objective = ObjectiveConfig.preset(self.algorithm)
        if self.rollout.dynamic_sampling is None:
            self.rollout.dynamic_sampling = self.algorithm == "dapo"
        mb = self.optim.mini_batch_questions
        if mb is not None:
            _check(
                self.rollout.questions_per_batch % mb == 0,
                "optim.mini_batch_questions",
                f"must divide rollout.questions_per_batch ({self.rollout.questions_per_batch}), "
                f"got {mb}",
            )

    @property
    def mini_batch_questions(self) -> int:
        """Questions per optimizer step (``optim.mini_batch_questions`` resolved)."""
        return self.optim.mini_batch_questions or self.rollout.questions_per_batch


# --------------------------------------------------------------------------- building


def build_config(raw: dict[str, Any] | None) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from a (YAML-shaped) mapping.

    ``objective`` entries override :meth:`ObjectiveConfig.preset` of ``algorithm``.
    Raises ``ValueError`` naming the bad key or value.
    """
    if raw is not None and not isinstance(raw, dict):
        raise ValueError("config: expected a mapping at the top level")
    raw = dict(raw or {})
    objective_raw = raw.pop("objective", None)
    cfg = configuration.build(TrainConfig, raw, "")
    if objective_raw is not None:
        preset = ObjectiveConfig.preset(cfg.algorithm)
        cfg.objective = configuration.build(
            ObjectiveConfig, objective_raw, "objective", base=preset
        )
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """YAML file (optional) + overrides -> validated :class:`TrainConfig`."""
    raw = configuration.read_yaml(path) if path is not None else {}
    return build_config(configuration.apply_overrides(raw, list(overrides or [])))


def dump_yaml(cfg: TrainConfig) -> str:
    """``cfg`` as YAML that :func:`load_config` reads back to an equal config."""
    return configuration.dump_yaml(cfg)
