"""A randomly initialised model of Qwen2.5-1.5B's configuration, for the GPU benchmarks (item 6).

No weights are downloaded: the architecture is built from its configuration (hidden 1536,
intermediate 8960, 28 layers, 12 query / 2 key-value heads, vocabulary 151,936, tied
embeddings) with the embedded task's character tokenizer, whose ids are a subset of the
vocabulary. Only speed and memory are measured with it; it learns nothing in one step.

    python benchmarks/gpu_model.py OUT_DIR [--layers 28]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QWEN25_15B = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151_936,
    "max_position_embeddings": 32_768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def build(out_dir: Path, layers: int | None = None) -> Path:
    """Save the model and tokenizer to ``out_dir`` (skipped if a model is already there)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from gmts.data.tokenizer import build_char_tokenizer

    if (out_dir / "config.json").exists():
        return out_dir
    tokenizer = build_char_tokenizer()
    shape = dict(QWEN25_15B)
    if layers is not None:
        shape["num_hidden_layers"] = layers
    eos = tokenizer.eos_token_id
    config = Qwen2Config(**shape, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
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
    args = parser.parse_args(argv)
    path = build(args.out_dir, args.layers)
    print(f"model: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
