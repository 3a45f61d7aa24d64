"""Run by test_verl_selection_is_global_over_data_parallel_ranks under torchrun (2 CPU ranks).

Each rank holds half the rows of one verl mini-batch, selects with the gloo group as the DP
group and computes the GMTS loss with dp_size=2; rank 0 also computes the single-process loss of
the whole mini-batch. Results go to ``<out_dir>/rank<r>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from gmts.core import SelectionConfig
from gmts.integrations.verl.loss import (
    gmts_ppo_loss,
    objective_from_actor_config,
    prepare_selection,
)
from gmts.integrations.verl.settings import GMTSVerlSettings

P, R, ROWS = 4, 6, 8


def _config() -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode="token-mean",
        use_kl_loss=True,
        kl_loss_coef=0.05,
        kl_loss_type="low_var_kl",
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
    )


def _full_batch():
    g = torch.Generator().manual_seed(123)
    attention_mask = torch.zeros(ROWS, P + R, dtype=torch.long)
    for i in range(ROWS):
        attention_mask[i, P - int(torch.randint(1, P + 1, (1,), generator=g)) : P] = 1
        attention_mask[i, P : P + int(torch.randint(1, R + 1, (1,), generator=g))] = 1
    adv = torch.randn(ROWS, generator=g)
    fields = {
        "prompts": torch.zeros(ROWS, P, dtype=torch.long),
        "responses": torch.zeros(ROWS, R, dtype=torch.long),
        "attention_mask": attention_mask,
        "response_mask": attention_mask[:, P:].clone(),
        "old_log_probs": -1.5 + 0.4 * torch.randn(ROWS, R, generator=g),
        "advantages": adv[:, None].expand(ROWS, R).clone(),
        "ref_log_prob": -1.5 + 0.4 * torch.randn(ROWS, R, generator=g),
    }
    total = int(attention_mask.sum())
    flat_lp = -1.5 + 0.4 * torch.randn(total, generator=g)
    flat_ent = 1.0 + torch.rand(total, generator=g)
    return fields, flat_lp, flat_ent


def _run(fields, flat_lp, flat_ent, rows, dp_size, group, n_tokens):
    from verl.workers.utils.padding import no_padding_2_padding

    lengths = fields["attention_mask"].sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    data = TensorDict({k: v[rows] for k, v in fields.items()}, batch_size=[len(rows)])
    tu.assign_non_tensor(data, dp_size=dp_size, batch_num_tokens=n_tokens, global_batch_size=ROWS)
    lp = torch.cat([flat_lp[offsets[i] : offsets[i + 1]] for i in rows]).requires_grad_(True)
    ent = torch.cat([flat_ent[offsets[i] : offsets[i + 1]] for i in rows])
    settings = GMTSVerlSettings(selection=SelectionConfig(score="gmts", ratio=0.3))
    config = _config()
    prepare_selection(
        data,
        settings,
        objective_from_actor_config(config),
        logprobs=no_padding_2_padding(lp.detach(), data),
        entropy=no_padding_2_padding(ent, data),
        process_group=group,
    )
    loss, _ = gmts_ppo_loss(config, {"log_probs": lp}, data, settings=settings)
    loss.backward()
    return {
        "selected": data["gmts_selected"],
        "num_selected": tu.get_non_tensor_data(data, "gmts_num_selected", None),
        "grad": lp.grad,
        "loss": loss.detach(),
    }


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fields, flat_lp, flat_ent = _full_batch()
    n_tokens = int(fields["response_mask"].sum())  # verl all-reduces this count itself
    rows = list(range(rank * ROWS // 2, (rank + 1) * ROWS // 2))
    result = _run(fields, flat_lp, flat_ent, rows, 2, dist.group.WORLD, n_tokens)
    if rank == 0:
        result["reference"] = _run(fields, flat_lp, flat_ent, list(range(ROWS)), 1, None, n_tokens)
    torch.save(result, Path(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
