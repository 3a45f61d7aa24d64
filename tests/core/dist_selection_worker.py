"""Worker for test_core_distributed.py: one rank of a 2-process gloo group.

Usage: python dist_selection_worker.py RANK WORLD PORT OUT_DIR
Runs every case of ``cases()`` on this rank's share of the rows and saves inputs and outputs
to OUT_DIR/rank{RANK}.pt; the test compares them with the single-process selection of the
concatenated batch.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import gmts


def global_batch(seed: int, b: int, t: int, kind: str):
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":
        scores = torch.where(
            torch.rand(b, t, generator=g) < 0.9, 0.0, torch.rand(b, t, generator=g)
        )
    else:
        scores = torch.randn(b, t, generator=g)
    lengths = torch.randint(0, t + 1, (b, 1), generator=g)
    mask = torch.arange(t)[None, :] < lengths
    group_ids = torch.arange(b) // 3 + 100  # groups of 3 rows that straddle the rank boundary
    return scores, mask, group_ids


def step_inputs(seed: int, b: int, t: int):
    g = torch.Generator().manual_seed(seed + 1000)
    old = -torch.rand(b, t, generator=g) * 3
    lp = old + 0.2 * torch.randn(b, t, generator=g)
    ref = old + 0.2 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    return lp, old, ref, adv


def mixed_dtype_batch():
    """Rows 0-1 (rank 0) in float64 differ only below float32 precision; rows 2-3 float32."""
    scores = torch.full((4, 3), 1.0, dtype=torch.float64)
    scores[0] += torch.tensor([3e-12, 1e-12, 2e-12], dtype=torch.float64)
    scores[2:] = torch.tensor([[1.0, 0.5, 2.0], [1.0, 1.0, 0.25]], dtype=torch.float64)
    return scores, torch.ones(4, 3, dtype=torch.bool)


def cases():
    """(name, seed, B, T, kind, rows of rank 0, what to do to rank 1's mask)."""
    return [
        ("even", 0, 8, 11, "continuous", 4, None),
        ("uneven-ties", 1, 9, 13, "ties", 2, None),
        ("rank1-all-masked", 2, 6, 7, "ties", 3, "mask-rank1"),
        ("rank0-no-rows", 3, 5, 9, "continuous", 0, None),
        ("rank0-all-masked", 4, 7, 10, "continuous", 4, "mask-rank0"),
    ]


RULES = ("ties-last-batch", "ties-last-group", "quantile", "index")
# objectives whose batch-level pick is global over the ranks (arXiv 2505.22617's covariance)
COV_OBJECTIVES = {
    "clip-cov": gmts.ObjectiveConfig(
        name="clip-cov", clip_cov_ratio=0.3, clip_cov_lb=-0.5, clip_cov_ub=0.5
    ),
    "kl-cov": gmts.ObjectiveConfig(name="kl-cov", kl_cov_ratio=0.3),
}


def cov_picks(name, lp, old, adv, mask, seed, process_group=None):
    """The objective's pick (shared by the ranks and the single-process reference)."""
    inputs = gmts.ObjectiveInputs.of(lp.detach(), old, adv, mask)
    return gmts.objective_picks(
        COV_OBJECTIVES[name], inputs, seed=seed, process_group=process_group
    )


def select_rule(scores, mask, ratio, largest, rule, group_ids, process_group=None):
    """One of RULES (shared by the ranks and the test's single-process reference)."""
    if rule.startswith("ties-last"):
        scope = rule.rsplit("-", 1)[1]
        return gmts.select_tokens(
            scores,
            mask,
            ratio,
            largest=largest,
            scope=scope,
            group_ids=group_ids,
            ties="last",
            process_group=process_group,
        )
    return gmts.select_tokens(
        scores, mask, ratio, largest=largest, count=rule, process_group=process_group
    )


def share(rank: int, b: int, rows0: int) -> slice:
    return slice(0, rows0) if rank == 0 else slice(rows0, b)


def gmts_step(lp, old, ref, adv, mask, entropy, process_group=None):
    """GMTS selection + the eq. 2 loss (global denominator over ranks): ``(selection, loss)``.

    Shared by the ranks (with ``process_group``) and the test's single-process reference.
    """
    objective = gmts.ObjectiveConfig(kl_coef=0.05)
    result = gmts.select_for_update(
        gmts.SelectionConfig(ratio=0.3),
        objective,
        logprobs=lp,
        old_logprobs=old,
        advantages=adv,
        response_mask=mask,
        entropy=entropy,
        ref_logprobs=ref,
        process_group=process_group,
    )
    config = gmts.LossConfig(objective)
    sums = gmts.TokenSums.count(mask, result.selected).all_reduce(process_group)
    loss, _ = gmts.policy_loss(
        lp,
        old,
        adv,
        mask,
        config,
        ref_logprobs=ref,
        selected=result.selected,
        denominators=config.denominators(sums),
    )
    return result, loss


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    pg = dist.group.WORLD
    results = {}
    for name, seed, b, t, kind, rows0, edit in cases():
        scores, mask, group_ids = global_batch(seed, b, t, kind)
        if edit == "mask-rank1":
            mask[rows0:] = False
        if edit == "mask-rank0":
            mask[:rows0] = False
        rows = share(rank, b, rows0)
        s, m, gid = scores[rows], mask[rows], group_ids[rows]
        for scope in ("batch", "group", "sequence"):
            for largest in (True, False):
                for ratio in (0.2, 0.5, 1.0):
                    sel = gmts.select_tokens(
                        s, m, ratio, largest=largest, scope=scope, group_ids=gid, process_group=pg
                    )
                    thr = gmts.selection_threshold(s, sel, largest=largest, process_group=pg)
                    results[(name, scope, largest, ratio)] = (sel, thr)
        for rule in RULES:  # ties='last' and the threshold rules, global over the ranks
            for largest in (True, False):
                for ratio in (0.2, 0.7):
                    key = (name, rule, largest, ratio)
                    results[key] = select_rule(s, m, ratio, largest, rule, gid, pg)
        den = gmts.LossConfig().denominators(gmts.TokenSums.count(m).all_reduce(pg)).policy
        results[(name, "denominator")] = den
        # the whole step: GMTS selection + eq. 2 loss with the global denominator
        lp, old, ref, adv = step_inputs(seed, b, t)
        lp, old, ref, adv = lp[rows].clone().requires_grad_(True), old[rows], ref[rows], adv[rows]
        result, loss = gmts_step(lp, old, ref, adv, m, s.abs(), process_group=pg)
        loss.backward()
        results[(name, "step")] = (result.selected, result.threshold, float(loss), lp.grad)
        for objective in COV_OBJECTIVES:
            results[(name, objective)] = cov_picks(objective, lp, old, adv, m, seed, pg)
        results[(name, "quantile")] = gmts.score_quantile(s, m, 0.8, process_group=pg)
        results[(name, "top-count")] = gmts.select_top_count(s, m, 7, process_group=pg)
    # float64 scores on one rank only: both ranks switch to 64-bit keys (same passes)
    s, m = mixed_dtype_batch()
    rows = share(rank, s.shape[0], 2)
    local = s[rows] if rank == 0 else s[rows].float()
    results["mixed-dtype"] = gmts.select_tokens(local, m[rows], 0.25, process_group=pg)
    # bad input on one rank: every rank raises, nobody hangs
    scores = torch.randn(2, 3)
    if rank == 1:
        scores[0, 0] = float("nan")
    try:
        gmts.select_tokens(scores, torch.ones(2, 3, dtype=torch.bool), 0.5, process_group=pg)
        results["bad-input"] = "no error"
    except ValueError as err:
        results["bad-input"] = str(err)
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
