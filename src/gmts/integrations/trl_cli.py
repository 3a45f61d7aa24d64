"""Command line for GMTS in TRL: ``accelerate launch -m gmts.integrations.trl_cli --config X.yaml``.

TRL's own ``trl grpo`` command always builds a plain ``GRPOTrainer``; this one parses the same
YAML/flags (TRL's ``TrlParser``: every ``GRPOConfig`` field, ``--config``, overrides on the
command line) into a ``GMTSGRPOConfig`` plus the few script arguments below, builds chat
prompts with the paper's templates (``gmts.data.prompts``), scores completions with a reward
from ``gmts.rewards`` and trains ``GMTSGRPOTrainer``. See configs/trl/*.yaml.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BF16_ON_CPU", "GMTSScriptArguments", "build_dataset", "build_reward", "main"]

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
BF16_ON_CPU = (
    "bf16 is on (the configs in configs/trl set it, and it is TRL's default) but this machine "
    "has no GPU that supports it; on a CPU add --use_cpu true --bf16 false (float32)"
)
"""What replaces transformers' ``Your setup doesn't support bf16/gpu`` traceback."""


@dataclass
class GMTSScriptArguments:
    """What to train and on which data (the training settings live in GMTSGRPOConfig)."""

    model_name_or_path: str = field(
        default="",
        metadata={
            "help": "Hugging Face model id, local folder, named model (smollm2-135m-instruct), "
            ".gguf file or gmts run."
        },
    )
    train_file: str = field(
        default="",
        metadata={"help": "Training questions: a .jsonl, .json, .parquet or .csv file."},
    )
    question_column: str = field(default="problem", metadata={"help": "Column with the question."})
    answer_column: str = field(default="answer", metadata={"help": "Column with the gold answer."})
    choices_column: str | None = field(
        default=None,
        metadata={"help": "Column with answer options (commonsense_choice template), or None."},
    )
    template: str = field(
        default="math",
        metadata={
            "help": "Prompt template of gmts.data.prompts (math, code, commonsense_*, plain)."
        },
    )
    reward: str = field(
        default="math", metadata={"help": "Reward of gmts.rewards (math, choice, yes_no, code)."}
    )


def build_dataset(script: GMTSScriptArguments, *, chat: bool = True) -> Any:
    """A ``datasets.Dataset`` with ``prompt`` and string ``answer`` columns.

    ``chat=True``: conversational prompts (TRL applies the model's chat template); False: the
    template's plain-text form, for tokenizers without a chat template.
    """
    from datasets import load_dataset

    from gmts.data.prompts import get_template

    path = Path(script.train_file)
    if not path.is_file():
        raise ValueError(f"train_file: no such file {script.train_file!r}")
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"train_file must end in one of {sorted(_FORMATS)}, got {path.name!r}")
    template = get_template(script.template)
    raw = load_dataset(fmt, data_files=str(path), split="train")
    for column in (script.question_column, script.answer_column, script.choices_column):
        if column is not None and column not in raw.column_names:
            raise ValueError(f"column {column!r} not in {path.name} (has {raw.column_names})")

    def to_example(row: dict[str, Any]) -> dict[str, Any]:
        choices = row[script.choices_column] if script.choices_column else None
        question = row[script.question_column]
        return {
            "prompt": (
                template.messages(question, choices)
                if chat
                else template.plain_text(question, choices)
            ),
            "answer": str(row[script.answer_column]),
        }

    return raw.map(to_example, remove_columns=raw.column_names)


def build_reward(name: str) -> Any:
    """TRL reward function ``(completions, answer, **kw) -> list[float]`` around a gmts reward."""
    from gmts.rewards.registry import get_reward

    score = get_reward(name)

    def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(score(text, gold)) for text, gold in zip(texts, answer, strict=True)]

    reward.__name__ = f"{name}_reward"
    return reward


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoTokenizer
    from trl import TrlParser

    from gmts.data.prompts import has_chat_template
    from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer
    from gmts.models.loading import ModelPathError, resolve_model_path

    parser = TrlParser((GMTSScriptArguments, GMTSGRPOConfig))
    try:
        script, training_args = parser.parse_args_and_config(
            args=None if argv is None else list(argv)
        )
    except ValueError as exc:
        if "bf16" not in str(exc):
            raise
        print(f"gmts.integrations.trl_cli: error: {BF16_ON_CPU}", file=sys.stderr)
        return 2
    if not script.model_name_or_path:
        parser.error("--model_name_or_path is required")
    try:  # a named model (smollm2-135m-instruct), a .gguf file, a gmts run: their folder
        model_path = resolve_model_path(script.model_name_or_path)
    except ModelPathError as exc:
        parser.error(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = GMTSGRPOTrainer(
        model=model_path,
        reward_funcs=build_reward(script.reward),
        args=training_args,
        train_dataset=build_dataset(script, chat=has_chat_template(tokenizer)),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
