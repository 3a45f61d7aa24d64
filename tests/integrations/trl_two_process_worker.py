"""Run by test_trl_two_processes_select_globally under torchrun (2 CPU processes, gloo).

Trains GMTSGRPOTrainer for 3 optimizer steps of 2 accumulated micro-batches (selection unit:
the whole step) and writes, per rank, the local and global token counts of every micro-batch
and a parameter checksum to ``<out_dir>/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer


class RecordingTrainer(GMTSGRPOTrainer):
    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self.records.append(dict(self.gmts_last))
        return loss


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    args = GMTSGRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        gradient_accumulation_steps=2,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-2,
        loss_type="dapo",
        beta=0.0,
        seed=0,
        gmts_score="gmts",
        gmts_ratio=0.3,
    )
    prompts = ["1+2=", "3+4=", "5*6=", "7-2=", "9+9=", "8*1="] * 4
    trainer = RecordingTrainer(
        model=model_dir,
        reward_funcs=_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.records = []
    before = sum(float(p.double().sum()) for p in trainer.model.parameters())
    trainer.train()
    after = sum(float(p.double().sum()) for p in trainer.model.parameters())
    rank = trainer.accelerator.process_index
    result = {
        "num_processes": trainer.accelerator.num_processes,
        "records": trainer.records,
        "checksum_before": before,
        "checksum_after": after,
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
