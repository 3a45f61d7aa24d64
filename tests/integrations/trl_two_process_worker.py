"""Run by test_trl_two_processes_select_globally under torchrun (2 CPU processes, gloo).

1. Trains GMTSGRPOTrainer for 3 optimizer steps of 2 accumulated micro-batches (selection
   unit: the whole step) and records, per rank, the local and global token counts of every
   micro-batch and a parameter checksum.
2. Compares, on each rank's own micro-batch (different token counts per rank), the loss and
   gradients of TRL's own GRPOTrainer (loss_type bnpo, top_entropy_quantile) with
   GMTSGRPOTrainer under the "trl" preset with score entropy: bnpo divides by the LOCAL token
   count in TRL 1.16, and the entropy threshold is taken over both processes' micro-batches.
3. At rho in {0.1, 0.2, 0.3, 0.5, 0.7, 0.9}, with distinct and with tied entropies, on each
   rank's micro-batch built by TRL's own ``_generate_and_score_completions`` (trl_batches.py,
   per-rank completions): TRL's own ``get_high_entropy_mask`` (gathered over both processes)
   against the "trl" preset's selection, and TRL's ``_compute_loss`` against ours (loss and
   gradients with respect to the fixed log-probs and entropies), for grpo and dapo.

Writes ``<out_dir>/rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import trl_batches as tb  # the worker's folder is on sys.path (script directory)
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from gmts.core.config import SelectionConfig
from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer, gmts_args

RHOS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


class RecordingTrainer(GMTSGRPOTrainer):
    def _gmts_select(self, model, inputs, loss_config, mode, **stats):
        selection = super()._gmts_select(model, inputs, loss_config, mode, **stats)
        mask = self._gmts_mask(inputs)
        self.records.append(
            {
                "local_valid_tokens": int(mask.sum()),
                "local_selected_tokens": int((selection.selected & mask).sum()),
                "unit_valid_tokens": selection.counts["valid_tokens"],
                "unit_selected_tokens": selection.counts["selected_tokens"],
            }
        )
        return selection


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def _trl_kwargs(out_dir: str, **overrides) -> dict:
    """TRL arguments for a CPU run of the tiny model."""
    return dict(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        save_strategy="no",
        seed=0,
        **overrides,
    )


def _micro_batch(rank: int) -> dict[str, torch.Tensor]:
    """A micro-batch in TRL's layout whose token count differs between the ranks."""
    g = torch.Generator().manual_seed(100 + rank)
    rows, prompt, completion, vocab = 4, 3, 7, 16
    lengths = torch.tensor([7, 2, 5, 3]) if rank == 0 else torch.tensor([1, 2, 6, 1])
    mask = (torch.arange(completion)[None, :] < lengths[:, None]).long()
    return {
        "prompt_ids": torch.randint(0, vocab, (rows, prompt), generator=g),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (rows, completion), generator=g),
        "completion_mask": mask,
        "advantages": torch.randn(rows, generator=g),
        "old_per_token_logps": -2.8 + 0.3 * torch.randn(rows, completion, generator=g),
        "ref_per_token_logps": -2.8 + 0.3 * torch.randn(rows, completion, generator=g),
        "num_items_in_batch": mask.sum().float() * 2,  # not read by bnpo
    }


def compare_bnpo_with_trl(model_dir: str, out_dir: str) -> dict[str, float]:
    """Max |difference| of loss and gradients, TRL's bnpo top_entropy_quantile vs ours."""
    common = _trl_kwargs(
        out_dir, max_completion_length=7, loss_type="bnpo", beta=0.04, use_bias_correction_kl=False
    )
    data = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5*6=", "7-2="] * 2])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    preset = SelectionConfig.preset("trl", score="entropy", ratio=0.2)
    built = []
    for cls, args in (
        (GRPOTrainer, GRPOConfig(**common, top_entropy_quantile=0.2)),
        (GMTSGRPOTrainer, GMTSGRPOConfig(**common, **gmts_args(preset))),
    ):
        trainer = cls(
            model=model_dir,
            reward_funcs=_reward,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
        )
        trainer.current_gradient_accumulation_steps = 1
        built.append(trainer)
    inputs = _micro_batch(built[0].accelerator.process_index)
    results = []
    for trainer in built:
        model = trainer.model
        model.train()
        model.zero_grad()
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        results.append((loss.detach(), grads))
    (trl_loss, trl_grads), (our_loss, our_grads) = results
    grad_diff = max(float((a - b).abs().max()) for a, b in zip(trl_grads, our_grads))
    return {
        "local_tokens": float(inputs["completion_mask"].sum()),
        "trl_loss": float(trl_loss),
        "loss_diff": float((trl_loss - our_loss).abs()),
        "grad_diff": grad_diff,
        "grad_scale": max(float(g.abs().max()) for g in trl_grads),
    }


def compare_quantile_sweep(model_dir: str) -> list[dict]:
    """Per (loss_type, ties, rho): TRL's own mask and loss against the "trl" preset's."""
    rank = int(torch.distributed.get_rank())
    trainer = tb.build_trainer(
        GMTSGRPOTrainer, GMTSGRPOConfig(**tb.trl_kwargs()), model_dir, seed=100 + rank
    )
    inputs = tb.double(tb.generation_batch(trainer, questions=tb.PROMPTS[2 * rank : 2 * rank + 2]))
    logprobs, distinct = tb.current_policy(inputs, seed=200 + rank)
    g = torch.Generator().manual_seed(300 + rank)
    levels = torch.tensor([0.25, 0.5, 1.0, 1.75], dtype=torch.float64)
    tied = levels[torch.randint(0, 4, distinct.shape, generator=g)]
    mask = inputs["completion_mask"]
    records = []
    for loss_type in ("grpo", "dapo"):
        trainer.loss_type = loss_type
        for ties, entropy in ((False, distinct), (True, tied)):
            for rho in RHOS:
                trainer.gmts_selection = SelectionConfig.preset("trl", score="entropy", ratio=rho)
                picked = []
                select = trainer._gmts_select

                def recording(*a, select=select, picked=picked, **k):
                    picked.append(select(*a, **k))
                    return picked[-1]

                trainer._gmts_select = recording
                ours = tb.loss_and_grads(tb.gmts_compute_loss, trainer, inputs, logprobs, entropy)
                del trainer._gmts_select
                trl_mask = trainer.get_high_entropy_mask(entropy, mask, 1 - rho)
                trainer.top_entropy_quantile = rho
                theirs = tb.loss_and_grads(tb.trl_compute_loss, trainer, inputs, logprobs, entropy)
                trainer.top_entropy_quantile = 1.0
                records.append(
                    {
                        "loss_type": loss_type,
                        "ties": ties,
                        "rho": rho,
                        "local_valid_tokens": int(mask.sum()),
                        "local_selected_tokens": int(trl_mask.sum()),
                        "mask_equal": bool(torch.equal(picked[-1].selected, trl_mask)),
                        "loss_diff": float((ours[0] - theirs[0]).abs()),
                        "grad_diff": max(
                            float((a - b).abs().max()) for a, b in zip(ours[1:], theirs[1:])
                        ),
                        "grad_scale": float(theirs[1].abs().max()),
                    }
                )
    return records


def main(model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    args = GMTSGRPOConfig(
        **_trl_kwargs(
            out_dir,
            max_completion_length=8,
            max_steps=3,
            gradient_accumulation_steps=2,
            logging_steps=1,
            learning_rate=1e-2,
            loss_type="dapo",
            beta=0.0,
        ),
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
        "bnpo": compare_bnpo_with_trl(model_dir, out_dir),
        "quantile_sweep": compare_quantile_sweep(model_dir),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
