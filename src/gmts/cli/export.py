"""``gmts export``: a checkpoint's float32 master weights as a bf16 Hugging Face folder.

    gmts export runs/qwen2.5-math-1.5b/dapo-gmts OUT_DIR            # newest checkpoint, bf16
    gmts export runs/.../checkpoints/step_000100 OUT_DIR --dtype float32

Training checkpoints keep float32 master weights (model/, 4 bytes per parameter, as the
Hugging Face Trainer does under bf16 mixed precision); serving (vLLM, gmts eval) wants bf16.
A LoRA run's checkpoints hold its adapters only: the export is the base model with the
adapters merged in (W + alpha / rank * B A), a plain Hugging Face folder.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", help="a model folder, a gmts checkpoint or a run folder (newest checkpoint)"
    )
    parser.add_argument("out", help="new folder to write (must not exist)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))


def run(args: argparse.Namespace) -> int:
    from gmts.models.loading import resolve_model_path
    from gmts.models.lora import adapter_base_path, is_adapter_folder
    from gmts.scale.precision import export_model

    try:
        source = resolve_model_path(args.source)
        merged = ""
        if is_adapter_folder(source):
            merged = f"; LoRA adapters of {source} merged into {adapter_base_path(source)}"
        out = export_model(source, args.out, args.dtype)
    except ValueError as exc:  # ModelPathError included
        print(f"gmts export: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({args.dtype}{merged})")
    return 0
