"""Global selection over a 2-process gloo group equals the single-process selection."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gmts

from file_modules import load_module

WORKER = Path(__file__).with_name("dist_selection_worker.py")


def _load_worker_module():
    return load_module(WORKER, "gmts_dist_selection_worker")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    port = str(_free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", port, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for rank in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            stdout, _ = proc.communicate(timeout=240)
            logs.append(stdout.decode(errors="replace"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_global_selection_equals_single_process(two_rank_results):
    worker = _load_worker_module()
    r0, r1 = two_rank_results
    checked, picked = 0, 0
    for name, seed, b, t, kind, rows0, edit in worker.cases():
        scores, mask, group_ids = worker.global_batch(seed, b, t, kind)
        if edit == "mask-rank1":
            mask[rows0:] = False
        if edit == "mask-rank0":
            mask[:rows0] = False
        for scope in ("batch", "group", "sequence"):
            for largest in (True, False):
                for ratio in (0.2, 0.5, 1.0):
                    key = (name, scope, largest, ratio)
                    sel = torch.cat([r0[key][0], r1[key][0]])
                    expected = gmts.select_tokens(
                        scores, mask, ratio, largest=largest, scope=scope, group_ids=group_ids
                    )
                    assert torch.equal(sel, expected), key
                    thr = gmts.selection_threshold(scores, expected, largest=largest)
                    if scope != "sequence":
                        for r in (r0, r1):
                            got = r[key][1]
                            assert (math.isnan(got) and math.isnan(thr)) or got == thr, key
                    checked += 1
        for rule in worker.RULES:
            for largest in (True, False):
                for ratio in (0.2, 0.7):
                    key = (name, rule, largest, ratio)
                    expected = worker.select_rule(scores, mask, ratio, largest, rule, group_ids)
                    assert torch.equal(torch.cat([r0[key], r1[key]]), expected), key
                    checked += 1
        # the whole step over ranks == one process on the concatenated batch
        lp, old, ref, adv = worker.step_inputs(seed, b, t)
        lp = lp.clone().requires_grad_(True)
        result, loss = worker.gmts_step(lp, old, ref, adv, mask, scores.abs())
        loss.backward()
        sel0, thr0, loss0, grad0 = r0[(name, "step")]
        sel1, thr1, loss1, grad1 = r1[(name, "step")]
        assert torch.equal(torch.cat([sel0, sel1]), result.selected), name
        assert thr0 == thr1 == result.threshold or math.isnan(result.threshold), name
        assert loss0 + loss1 == pytest.approx(loss.item(), rel=1e-6, abs=1e-7), name
        torch.testing.assert_close(torch.cat([grad0, grad1]), lp.grad, rtol=1e-6, atol=1e-8)
        n_valid = float(mask.sum())
        assert r0[(name, "denominator")] == r1[(name, "denominator")] == max(n_valid, 1.0)
        # clip-cov's draw and kl-cov's top-k over the ranks == over the concatenated batch
        for objective in worker.COV_OBJECTIVES:
            expected = worker.cov_picks(objective, lp, old, adv, mask, seed)
            got = torch.cat([r0[(name, objective)], r1[(name, objective)]])
            assert torch.equal(got, expected), (name, objective)
            picked += int(expected.sum())
        want = gmts.score_quantile(scores, mask, 0.8)
        for r in (r0, r1):
            assert (math.isnan(want) and math.isnan(r[(name, "quantile")])) or r[
                (name, "quantile")
            ] == want, name
        got = torch.cat([r0[(name, "top-count")], r1[(name, "top-count")]])
        assert torch.equal(got, gmts.select_top_count(scores, mask, 7)), name
    assert checked == 5 * 3 * 2 * 3 + 5 * 4 * 2 * 2
    assert picked > 0


def test_bad_input_on_one_rank_raises_on_every_rank(two_rank_results):
    r0, r1 = two_rank_results
    assert "another rank" in r0["bad-input"]
    assert "finite" in r1["bad-input"]


def test_float64_on_one_rank_uses_64_bit_keys_everywhere(two_rank_results):
    worker = _load_worker_module()
    r0, r1 = two_rank_results
    scores, mask = worker.mixed_dtype_batch()
    expected = gmts.select_tokens(scores, mask, 0.25)
    assert torch.equal(torch.cat([r0["mixed-dtype"], r1["mixed-dtype"]]), expected)
    assert expected[0].tolist() == [True, False, True]  # float64 order inside row 0
