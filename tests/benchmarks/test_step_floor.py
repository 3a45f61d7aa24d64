"""benchmarks/step_floor.py: its decoding floor counts the batches the sampler really runs when
a row leaves as soon as it stops, and its quick mode runs end to end (no timing asserted)."""

from __future__ import annotations

import functools
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from file_modules import load_module

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH_DIR))
    return load_module(BENCH_DIR / "step_floor.py", "gmts_step_floor")


def test_decode_batches_by_hand():
    bench = _bench()
    # steps 1..4: rows longer than 1 (3 rows), than 2 (3), than 3 (1), than 4 (1)
    assert bench.decode_batches([1, 3, 3, 5]) == Counter({3: 2, 1: 2})
    assert bench.decode_batches([1, 1]) == Counter()


def test_decode_batches_match_the_sampler(tmp_path, monkeypatch):
    """With the drop rule at every stopped row, the sampler's decoding calls have exactly the
    batch sizes the floor counts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import gmts.sampling.rollout as rollout_module

    bench = _bench()
    from bench_rollout_real import save_quick_model

    path = save_quick_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    monkeypatch.setattr(rollout_module, "DROP_ROWS_AT", 1.0)
    seen: list[int] = []
    forward = model.forward

    @functools.wraps(forward)  # the sampler reads the forward's parameters
    def counting(*args, **kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] == 1:  # a decoding step (the prompts are longer)
            seen.append(ids.shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    for seed in range(3):
        seen.clear()
        rows = bench.sample(model, tokenizer, seed, True, 12)
        lengths = rows.response_lengths.tolist()
        assert len(set(lengths)) > 1, "the check needs rows of different lengths"
        assert Counter(seen) == bench.decode_batches(lengths)


def test_quick_mode(tmp_path):
    bench = _bench()
    out = tmp_path / "floor.json"
    assert bench.main(["--quick", "--rounds", "1", "--reps", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["quick"] is True and record["commit"] and record["command"]
    assert len(record["machine"]["load_before"]) == 3
    for part in ("rollout", "update", "step"):
        for path in ("new", "old", "floor"):
            assert record["medians"][f"{path} {part}"] > 0
    assert 0 < record["response_tokens"][0] <= 24 * 4
