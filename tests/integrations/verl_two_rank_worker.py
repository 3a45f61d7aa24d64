"""Run by test_verl_selection_is_global_over_data_parallel_ranks under torchrun (2 CPU ranks).

One actor mini-batch built along verl's V1 (nested) or legacy (padded) code path
(``verl_batches``); each rank holds half its rows, selects with the gloo group as the DP group
and computes the GMTS loss with dp_size=2; rank 0 also computes the single-process loss of the
whole mini-batch. Once per loss mode of :data:`LOSS_MODES` (vanilla; geo_mean, whose eq. 2
divisor the plugin applies itself; sapo, whose divisor goes in verl's row-count slot).
Results go to ``<out_dir>/rank<r>.pt``, a dict loss mode -> result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

import verl_batches as vb  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.padding import no_padding_2_padding  # noqa: E402

from gmts.core import SelectionConfig  # noqa: E402
from gmts.integrations.verl.loss import (  # noqa: E402
    gmts_ppo_loss,
    objective_from_actor_config,
    padded_response_fields,
    prepare_selection,
)
from gmts.integrations.verl.settings import GMTSVerlSettings  # noqa: E402

ROWS = 8
LOSS_MODES = ("vanilla", "geo_mean", "sapo")


def _config(loss_mode: str) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode="token-mean" if loss_mode == "vanilla" else "seq-mean-token-mean",
        use_kl_loss=True,
        kl_loss_coef=0.05,
        kl_loss_type="low_var_kl",
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )


def _run(answers, full, rows, dp_size, group, n_tokens, loss_mode):
    data = tu.index_select_tensor_dict(full, torch.tensor(rows))
    vb.engine_info(data, dp_size=dp_size, batch_num_tokens=n_tokens, global_batch_size=ROWS)
    leaf = torch.cat(answers.current_logprobs).clone().requires_grad_(True)
    settings = GMTSVerlSettings(selection=SelectionConfig(score="gmts", ratio=0.3))
    config = _config(loss_mode)
    prepare_selection(
        data,
        settings,
        objective_from_actor_config(config),
        actor_config=config,
        logprobs=no_padding_2_padding(vb.model_output(answers, data), data),
        entropy=no_padding_2_padding(vb.model_output(answers, data, "current_entropy"), data),
        process_group=group,
    )
    output = {"log_probs": vb.model_output(answers, data, leaf=leaf)}
    loss, _ = gmts_ppo_loss(config, output, data, settings=settings)
    loss.backward()
    selected = padded_response_fields(data, ["gmts_selected"])["gmts_selected"]
    width = max(len(r) for r in answers.response_ids)
    return {
        "selected": torch.nn.functional.pad(selected, (0, width - selected.shape[1])),
        "nested": data["gmts_selected"].is_nested,
        "num_selected": tu.get_non_tensor_data(data, "gmts_num_selected", None),
        "grad": leaf.grad,  # over every answer's tokens, zero for the other rank's rows
        "loss": loss.detach(),
    }


def main(out_dir: str, layout: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    answers = vb.make_answers(123, groups=ROWS // 2, n=2)
    full = vb.BUILDERS[layout](answers)
    n_tokens = int(full["loss_mask"].sum())  # verl all-reduces this count itself
    rows = list(range(rank * ROWS // 2, (rank + 1) * ROWS // 2))
    results = {}
    for mode in LOSS_MODES:
        results[mode] = _run(answers, full, rows, 2, dist.group.WORLD, n_tokens, mode)
        if rank == 0:
            everything = list(range(ROWS))
            results[mode]["reference"] = _run(answers, full, everything, 1, None, n_tokens, mode)
    torch.save(results, Path(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
