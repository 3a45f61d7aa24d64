"""The trainer's configuration: one typed, validated dataclass tree.

``TrainConfig`` is the single source of truth for a run. YAML files, command-line overrides
(``section.field=value``), the ``--help`` text and docs/training.md are all derived from the
dataclasses below and their ``metadata["help"]``. The objective and the token selection reuse
the core's :class:`~gmts.core.config.ObjectiveConfig` and :class:`~gmts.core.config.SelectionConfig`.

Validation happens in ``__post_init__`` (single fields) and :func:`build_config` (types, unknown
keys), so every mistake is reported before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gmts.core.config import SelectionConfig
from gmts.core.objectives import ObjectiveConfig

ALGORITHMS = ("grpo", "dapo")
DATASET_MAX_NEW_TOKENS = 1024
"""Generation budget of dataset training when rollout.max_response_length is null."""


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
    dtype: Literal["float32", "bfloat16"] = _f(
        "float32",
        "Compute dtype. bfloat16: bf16 forward/backward over float32 master weights, gradients "
        "and AdamW state (mixed precision). Log-probs and entropies are always float32.",
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in backward (saves memory).")
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
        "Training questions (overrides data.task): a benchmark of gmts.data.datasets (e.g. "
        "math12k, read from $GMTS_DATA_DIR or ../shared/data) or a .jsonl/.jsonl.gz/.json/"
        ".parquet file.",
    )
    split: str | None = _f(None, "Benchmark split for data.dataset (null: its default).")
    question_field: str = _f("problem", "Question field of a dataset file (not benchmarks).")
    answer_field: str = _f("answer", "Answer field of a dataset file (not benchmarks).")
    reward: str = _f(
        "math", "Reward from gmts.rewards for data.dataset: math, choice, yes_no, code, format."
    )
    template: str | None = _f(
        "math",
        "Prompt template name for gmts.data.prompts.format_prompt (dataset training only; "
        "null: raw question text).",
    )
    sandbox: Literal["bwrap", "subprocess"] | None = _f(
        None,
        "Sandbox for a reward that runs code (data.reward=code): bwrap (bubblewrap; without a "
        "working one training stops before loading the model) or subprocess (WEAKER, no "
        "filesystem/network/process isolation: explicit opt-in). null: $GMTS_SANDBOX, else bwrap.",
    )
    shuffle: bool = _f(True, "Shuffle the dataset each pass (seeded by the run seed).")
    eval_questions: int = _f(100, "Held-out questions for the built-in task's evaluation.")
    eval_samples: int = _f(16, "Samples per held-out question (average@k and pass@k, k = this).")
    eval_every: int = _f(0, "Evaluate every N steps (0: only before and after training).")
    eval_before: bool = _f(True, "Evaluate the starting policy before the first step.")

    def __post_init__(self) -> None:
        from gmts.data.prompts import available_templates
        from gmts.rewards.registry import available_rewards
        from gmts.rewards.sandbox import BACKENDS as SANDBOX_BACKENDS

        if self.dataset is None:
            from gmts.embedded.tasks import available_tasks

            _check(
                self.task in available_tasks(),
                "data.task",
                f"unknown task {self.task!r}; available: {available_tasks()}",
            )
        _check(
            self.template is None or self.template in available_templates(),
            "data.template",
            f"unknown template {self.template!r}; available: {available_templates()}",
        )
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
        _check(self.eval_questions >= 0, "data.eval_questions", "must be >= 0")
        _check(self.eval_samples >= 1, "data.eval_samples", "must be >= 1")
        _check(self.eval_every >= 0, "data.eval_every", "must be >= 0")


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
        f"Max new tokens per answer (null: the task's own limit; {DATASET_MAX_NEW_TOKENS} for "
        "datasets). Prompt + this must fit the model's context (checked at start).",
    )
    generation_batch_size: int | None = _f(
        None, "Sequences generated at once (null: the whole batch)."
    )
    dynamic_sampling: bool | None = _f(
        None,
        "Drop groups whose rewards are all equal and sample further batches until full "
        "(null: on for DAPO, off for GRPO).",
    )
    max_sampling_rounds: int = _f(
        4, "Dynamic sampling: rollout rounds per step at most; then the batch is topped up."
    )
    overlong_buffer: int = _f(
        0, "DAPO soft overlong punishment: buffer length L_cache in tokens (0: off)."
    )
    overlong_penalty: float = _f(1.0, "Penalty at the maximum length (linear over the buffer).")
    std_normalize: bool = _f(True, "Divide group advantages by the group's std (GRPO eq. 1).")

    def __post_init__(self) -> None:
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
    every: int = _f(0, "Save a checkpoint every N steps (0: only at the end).")
    keep: int = _f(2, "Keep the last K checkpoints.")
    save_final: bool = _f(True, "Save a checkpoint after the last step.")

    def __post_init__(self) -> None:
        _check(self.every >= 0, "checkpoint.every", "must be >= 0")
        _check(self.keep >= 1, "checkpoint.keep", "must be >= 1")


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
    progress: bool = _f(True, "Show a progress bar with the live reward.")
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
        "algorithm's preset.",
    )
    selection: SelectionConfig = _f(
        help="Token selection (gmts.core SelectionConfig); score 'none' trains on all tokens.",
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


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in typing.get_args(tp)) + "]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` (parsed YAML) against the annotation ``tp``; return the converted value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ValueError(f"{key}: must not be null (expected {_type_name(tp)})")
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ValueError:
                pass  # try the next member of the union
        raise ValueError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"{key}: expected one of {list(allowed)}, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ValueError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}: expected a string, got {value!r}")
        return value
    if _is_dataclass_type(tp):
        return _build(tp, value, key)
    if tp is Any:
        return value
    raise ValueError(f"{key}: unsupported field type {tp!r}")  # pragma: no cover


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _unknown_key_error(cls: type, key: str, prefix: str) -> ValueError:
    where = f"'{prefix}'" if prefix else "the top level"
    valid = ", ".join(_field_types(cls))
    full = f"{prefix}.{key}" if prefix else key
    return ValueError(f"unknown config key '{full}'; valid keys at {where}: {valid}")


def _build(cls: type, raw: Any, prefix: str, base: Any = None) -> Any:
    """Build dataclass ``cls`` from the mapping ``raw``; ``base`` supplies defaults if given."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{prefix or 'config'}: expected a mapping of keys, got {raw!r}")
    types_ = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in types_:
            raise _unknown_key_error(cls, key, prefix)
        full = f"{prefix}.{key}" if prefix else key
        kwargs[key] = _coerce(value, types_[key], full)
    try:
        if base is not None:
            return dataclasses.replace(base, **kwargs)
        return cls(**kwargs)
    except ValueError as exc:
        msg = str(exc)
        # Name the section for the core's own validation messages.
        if prefix and not msg.startswith(prefix):
            msg = f"{prefix}: {msg}"
        raise ValueError(msg) from None


def build_config(raw: dict[str, Any] | None) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from a (YAML-shaped) mapping.

    ``objective`` entries override :meth:`ObjectiveConfig.preset` of ``algorithm``.
    Raises ``ValueError`` naming the bad key or value.
    """
    if raw is not None and not isinstance(raw, dict):
        raise ValueError("config: expected a mapping at the top level")
    raw = dict(raw or {})
    objective_raw = raw.pop("objective", None)
    cfg = _build(TrainConfig, raw, "")
    if objective_raw is not None:
        preset = ObjectiveConfig.preset(cfg.algorithm)
        cfg.objective = _build(ObjectiveConfig, objective_raw, "objective", base=preset)
    return cfg


# --------------------------------------------------------------------------- YAML + overrides


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config; a top-level ``base: other.yaml`` (relative to this file) is merged
    underneath, so variants can hold only their differences."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ValueError(f"config 'base' cycle through {path}")
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    base = data.pop("base", None)
    if base is not None:
        parent = read_yaml(path.parent / base, (*_seen, path.resolve()))
        data = _deep_merge(parent, data)
    return data


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.field=value`` overrides (values parsed as YAML: ``0.1``, ``true``,
    ``null``, ``[0.9, 0.99]``)."""
    import yaml

    raw = _deep_merge({}, raw)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected section.field=value")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ValueError(f"override {item!r}: bad key {key!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ValueError(f"override {item!r}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """YAML file (optional) + overrides -> validated :class:`TrainConfig`."""
    raw = read_yaml(path) if path is not None else {}
    return build_config(apply_overrides(raw, list(overrides or [])))


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain-Python (YAML-safe) form of a config; tuples become lists."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        if isinstance(v, tuple | list):
            return [plain(x) for x in v]
        return v

    return plain(cfg)


def dump_yaml(cfg: TrainConfig) -> str:
    """``cfg`` as YAML that :func:`load_config` reads back to an equal config."""
    import yaml

    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


# --------------------------------------------------------------------------- reference


def config_reference(cls: type = TrainConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every leaf field, from the dataclass metadata.

    Defaults are the fields' own (``null`` where the algorithm decides); ``objective.*`` shows
    ``ObjectiveConfig``'s defaults, which the default algorithm's (DAPO) preset keeps.
    """
    rows: list[tuple[str, str, str, str]] = []
    types_ = _field_types(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = types_[f.name]
        if key == "objective":
            tp = ObjectiveConfig
        if _is_dataclass_type(tp):
            rows.extend(config_reference(tp, key))
            continue
        default = getattr(defaults, f.name)
        if isinstance(default, tuple):
            default = list(default)
        help_text = f.metadata.get("help", "") if f.metadata else ""
        rows.append((key, _type_name(tp), repr(default), help_text))
    return rows


def config_help_text() -> str:
    """Every key with its type, default and help: the epilog of ``gmts train --help``."""
    lines = ["config keys (override as section.field=value):"]
    for key, tp, default, help_text in config_reference():
        lines.append(f"  {key} = {default}  [{tp}]")
        if help_text:
            lines.append(f"      {help_text}")
    return "\n".join(lines)


def config_markdown_table() -> str:
    """The config reference as a Markdown table (docs/training.md)."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, tp, default, help_text in config_reference():
        esc_help = help_text.replace("|", "\\|")
        esc_type = tp.replace("|", "\\|")
        rows.append(f"| `{key}` | {esc_type} | `{default}` | {esc_help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m gmts.train.config > table (docs/training.md reference)
    print(config_markdown_table())
