"""GMTS with verl's ``use_remove_padding`` on and off: the same tokens, the same loss.

verl 0.9.1's own FSDP actor engine (``FSDPEngineWithLMHead``, FSDP2 on one gloo rank, the
"cpu" platform of ``verl_cpu/``) runs the plugin's whole actor update twice on the same
mini-batch and weights: with ``use_remove_padding=False`` (each micro-batch padded to its longest
row, an attention mask) and ``True`` (the micro-batch's rows packed into one row, no mask,
positions restarting per row). ``scripts/gpu/verl_remove_padding.py`` is the run (the same
script runs on a GPU); this test runs it on the CPU in float32 and checks its records, for both
trainer layouts (V1 nested, legacy padded) with fixed and dynamic micro-batch sizes:

- the exact pass's current log-probs and entropies, which GMTS scores, agree between the paths
  and with each answer run alone through plain transformers (1e-5; measured 4.8e-7);
- the same tokens are selected (exactly, ``ceil(ratio N)`` of them);
- the loss of every micro-batch and every parameter's gradient agree (relative 1e-5);
- a control, packed rows whose positions do not restart, is caught by the same checks.

CPU only: flash-attention (verl's varlen kernel on a GPU) has no CPU build; here the packed
row is kept apart by transformers' sdpa mask, built from the positions that restart per row.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl.workers.engine", reason="verl is installed in .venv-verl only")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu" / "verl_remove_padding.py"
sys.path.insert(0, str(SCRIPT.parent))

import verl_remove_padding as rmpad  # noqa: E402

pytestmark = pytest.mark.slow  # one run of verl's engine, 8 updates: ~20 s on 2 shared cores
CASES = [(layout, micro) for layout in rmpad.LAYOUTS for micro in rmpad.MICRO]
ATOL = 1e-5


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    """The script's records on the CPU, float32 (its own process: verl's platform and the
    process group are process-wide)."""
    out = tmp_path_factory.mktemp("rmpad") / "records.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--check", "--logprob-atol", str(ATOL)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    print(done.stdout)
    return torch.load(out, weights_only=False)


def test_both_of_verls_forward_paths_ran(records):
    """Padded: micro-batches of several rows with an attention mask; packed: one row of every
    token of the micro-batch, no mask. Each path: the exact pass, then the update's forward."""
    for layout, micro in CASES:
        padded, packed = (records["cases"][(layout, micro)][flag] for flag in (False, True))
        assert len(padded["calls"]) == len(packed["calls"]) >= 4
        assert all(rows > 1 and mask for (rows, _), mask in padded["calls"])
        assert all(rows == 1 and not mask for (rows, _), mask in packed["calls"])
        tokens = sum(
            int(len(p) + len(r)) for p, r in zip(*records["answers"].values(), strict=True)
        )
        for path in (padded, packed):  # the exact pass, then the update: the same micro-batches
            half = len(path["calls"]) // 2
            assert path["calls"][:half] == path["calls"][half:]
        lengths = [shape[1] for shape, _ in packed["calls"][:half]]
        assert sum(lengths) == tokens
        if micro == "dynamic":  # micro-batches cut by the token budget, not by 4 rows
            assert max(lengths) <= rmpad.MAX_TOKEN_LEN
            assert any(rows != 4 for (rows, _), _ in padded["calls"])


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(case))
def test_gmts_sees_the_same_statistics_on_both_paths(records, case):
    padded, packed = (records["cases"][case][flag] for flag in (False, True))
    assert torch.equal(padded["row_id"], packed["row_id"])  # the same mini-batch order
    mask = padded["response_mask"]
    for key in ("logprobs", "entropy"):
        want = rmpad.padded_reference(records, padded["row_id"], key)  # each answer alone
        for path in (padded, packed):
            assert path[key].shape == mask.shape  # (B, R): verl re-pads the packed output
            assert torch.allclose(path[key][mask], want[mask], atol=ATOL, rtol=0), key
        assert torch.allclose(padded[key][mask], packed[key][mask], atol=ATOL, rtol=0), key


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(case))
def test_gmts_selects_the_same_tokens_on_both_paths(records, case):
    padded, packed = (records["cases"][case][flag] for flag in (False, True))
    n_valid = int(padded["response_mask"].sum())
    k = math.ceil(records["ratio"] * n_valid)
    for path in (padded, packed):
        assert int(path["selected"].sum()) == k == path["num_selected"]
        assert not bool((path["selected"] & ~path["response_mask"]).any())
        assert all(f == pytest.approx(k / n_valid) for f in path["selected_fraction"])
    assert torch.equal(padded["selected"], packed["selected"])


@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(case))
def test_loss_and_gradients_agree_on_both_paths(records, case):
    padded, packed = (records["cases"][case][flag] for flag in (False, True))
    assert len(padded["losses"]) == len(packed["losses"])
    assert padded["losses"] == pytest.approx(packed["losses"], rel=1e-5, abs=1e-7)
    assert any(abs(loss) > 1e-3 for loss in padded["losses"])  # a real loss was compared
    assert padded["grad_norm"] == pytest.approx(packed["grad_norm"], rel=1e-5)
    assert padded["grad_norm"] > 0
    for name, grad in padded["grads"].items():
        scale = float(grad.abs().max())
        assert float((grad - packed["grads"][name]).abs().max()) <= 1e-5 * max(scale, 1e-6), name


def test_the_checks_catch_packed_rows_without_boundaries(records):
    """The control: positions that run on across the packed rows (so the attention crosses
    them) move the log-probs far off the reference, and the selection with them."""
    padded = records["cases"][("v1", "fixed")][False]
    broken = records["broken"]
    mask = padded["response_mask"]
    want = rmpad.padded_reference(records, broken["row_id"])
    assert float((broken["logprobs"] - want)[mask].abs().max()) > 1e3 * ATOL
    assert not torch.equal(broken["selected"], padded["selected"])
