"""A randomly initialised model of Qwen2.5-1.5B's configuration, for the GPU benchmarks (item 6).

No weights are downloaded: the architecture is built from its configuration (hidden 1536,
intermediate 8960, 28 layers, 12 query / 2 key-value heads, vocabulary 151,936, tied
embeddings) with the embedded task's character tokenizer, whose ids are a subset of the
vocabulary. Only speed and memory are measured with it; it learns nothing in one step.

    python benchmarks/gpu_model.py OUT_DIR [--layers 28] [--tiny]

``--tiny`` builds the same architecture in :data:`TINY`'s shape (the dry runs of
benchmarks/gpu.sh and benchmarks/gpu_train.py: seconds on a CPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QWEN25_15B = "Qwen/Qwen2.5-1.5B"
"""The shape used (gmts.scale.known_models.KNOWN_MODELS holds its config.json fields)."""
TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
"""The dry runs' shape: Qwen2.5-1.5B's architecture, 2 layers of width 128 (1.1M parameters)."""


def full_vocabulary_tokenizer(vocab_size: int):
    """The character tokenizer with one character per id of the model's vocabulary.

    The task's characters keep their ids; every further id is a distinct Unicode character.
    A random model samples ids across the whole vocabulary; with the plain task tokenizer
    (17 ids) almost every sampled id would decode to nothing, so every completion would be
    the same empty string. With this one every sampled id shows up in the text.
    """
    from gmts.embedded.tokenizer import END_TOKEN, TASK_ALPHABET, UNK_TOKEN, build_char_tokenizer

    extra, code = [], 0x100
    while len(extra) < vocab_size - len(TASK_ALPHABET) - 2:
        if not 0xD800 <= code <= 0xDFFF and chr(code) not in (END_TOKEN, UNK_TOKEN):
            extra.append(chr(code))
        code += 1
    return build_char_tokenizer(TASK_ALPHABET + "".join(extra))


def build(
    out_dir: Path, layers: int | None = None, full_vocabulary: bool = False, **shape: int
) -> Path:
    """Save the model and tokenizer to ``out_dir`` (skipped if a model is already there).

    ``shape`` overrides fields of Qwen2.5-1.5B's configuration (``hidden_size=512``, ...);
    ``full_vocabulary`` gives it :func:`full_vocabulary_tokenizer`.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from gmts.embedded.tokenizer import build_char_tokenizer
    from gmts.scale.known_models import KNOWN_MODELS

    if (out_dir / "config.json").exists():
        return out_dir
    fields = {k: v for k, v in KNOWN_MODELS[QWEN25_15B].items() if k != "model_type"}
    fields.update(shape)
    if full_vocabulary:
        tokenizer = full_vocabulary_tokenizer(fields["vocab_size"])
    else:
        tokenizer = build_char_tokenizer()
    if layers is not None:
        fields["num_hidden_layers"] = layers
    eos = tokenizer.eos_token_id
    config = Qwen2Config(**fields, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    staging = out_dir.with_name(out_dir.name + ".partial")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(out_dir)  # atomic: a half-written folder is never taken for a model
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (tests)")
    parser.add_argument("--tiny", action="store_true", help="the dry runs' tiny shape (TINY)")
    args = parser.parse_args(argv)
    path = build(args.out_dir, args.layers, **(TINY if args.tiny else {}))
    print(f"model: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
