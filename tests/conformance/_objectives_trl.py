"""The TRL column of the objective rows (tests/conformance/_objectives.py): ``trl_cell(row)``.

``GMTSGRPOTrainer`` built from ``row.trl`` (TRL 1.16 ``GRPOConfig`` keyword arguments) with the
paper preset (GMTS, ``RATIO``, eq. 2), its ``_compute_loss`` on the objective batch as one
micro-batch with TRL's forward replaced by the fixed log-probs (the approach of the preset
matrix's ``trl`` engine, tests/conformance/_matrix.py). A configuration the trainer refuses
gives ``Cell(refused=...)``. Not a test module.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch


def _objectives() -> Any:
    """tests/conformance/_objectives.py as the module ``_objectives`` (loaded once)."""
    if "_objectives" not in sys.modules:  # e.g. _objectives.py itself runs as __main__
        path = Path(__file__).resolve().with_name("_objectives.py")
        spec = importlib.util.spec_from_file_location("_objectives", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["_objectives"] = module
        spec.loader.exec_module(module)
    return sys.modules["_objectives"]


objectives = _objectives()
matrix = objectives.matrix
B, T, DTYPE = objectives.B, objectives.T, objectives.DTYPE


def trl_cell(row: Any) -> Any:
    """The TRL integration's loss and d loss / d logprobs for ``row`` (or its refusal)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer
    from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer, gmts_args

    batch = objectives.objective_batch()
    model_dir = matrix._tiny_model_dir(build_tiny_model, build_char_tokenizer, TinyModelConfig)
    try:
        args = GMTSGRPOConfig(
            output_dir=tempfile.mkdtemp(),
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            report_to="none",
            per_device_train_batch_size=B,
            num_generations=objectives.GROUP_SIZE,
            max_completion_length=T,
            save_strategy="no",
            seed=0,
            **row.trl,
            **gmts_args(objectives.selection()),
        )
        engine = GMTSGRPOTrainer(
            model=model_dir,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "1+1="}] * B),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
        )
    except ValueError as err:
        return matrix.Cell(refused=matrix._first_problem(err))
    engine.current_gradient_accumulation_steps = 1
    leaf = batch.logprobs.clone().requires_grad_(True)
    engine._gmts_forward = lambda model, inputs, **kw: (leaf, batch.entropy, None)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": batch.mask.long(),
        "advantages": batch.advantages,
        "old_per_token_logps": batch.old_logprobs,
        "num_items_in_batch": batch.mask.sum().to(DTYPE),
    }
    if engine.beta != 0.0:
        inputs["ref_per_token_logps"] = batch.ref_logprobs
    engine.model.train()
    loss = engine._compute_loss(engine.model, inputs)
    loss.backward()
    return matrix.Cell(float(loss.detach()), leaf.grad)
