"""Check the memory plan (gmts.scale.memory_plan) against measured peaks on the CPU.

    python benchmarks/memory_check.py [--out benchmarks/results/memory_check.json] [--quick]

A small Qwen2-architecture model (random weights; hidden 512, 8 layers, vocabulary 32,000) is
trained with the trainer's own pieces. Each (precision, strategy, phase) runs in a fresh process:
the weights and the AdamW state are set up first, the peak resident set (``VmHWM``) is reset,
the phase runs (rollout: sampling with the KV cache; scoring: no-grad log-probs; update: one
micro-batched forward + backward + step), and the growth of the peak over the baseline is
compared with the plan's bytes for that phase minus what was resident at the baseline
(weights + AdamW state). glibc is told to serve every block above 64 KiB with mmap
(``MALLOC_MMAP_THRESHOLD_``) so that freed tensors leave the resident set and it tracks live
bytes. Batches are unpadded: on the CPU a padded batch takes SDPA's math path, which keeps a
length x length attention matrix that the plan (made for CUDA's fused kernels) does not count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
MODES = (  # (model.dtype, distributed.strategy, gradient checkpointing)
    ("float32", "replicate", False),
    ("float32", "replicate", True),
    ("bfloat16", "replicate", True),
    ("bfloat16", "fsdp", True),
)
PHASES = ("rollout", "scoring", "update")
SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
}
QUICK_SHAPE = {**SHAPE, "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4}


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1))


def child(
    phase: str, dtype: str, strategy: str, checkpointing: bool, model_dir: str, sizes: dict
) -> dict:
    """Run one phase in this process; returns planned and measured growth in bytes."""
    import gc

    import torch
    from transformers import AutoConfig

    from gmts.core.config import SelectionConfig
    from gmts.core.loss import LossConfig
    from gmts.core.objectives import ObjectiveConfig
    from gmts.models.loading import load_model, load_tokenizer
    from gmts.sampling.rollout import generate_rollouts
    from gmts.scale.distributed import DistInfo
    from gmts.scale.memory_plan import PlanSettings, plan_memory
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import make_strategy
    from gmts.train.batch import TrainBatch
    from gmts.train.config import load_config
    from gmts.train.scoring import TokenScorer
    from gmts.train.update import select_minibatch, update_minibatch

    torch.set_num_threads(1)
    P, T, mb, rows = sizes["prompt"], sizes["response"], sizes["micro"], sizes["rows"]
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            f"model.dtype={dtype}",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
            f"distributed.strategy={strategy}",
            f"optim.micro_batch_size={mb}",
        ],
    )
    info, device = DistInfo(), torch.device("cpu")
    precision = Precision.from_name(dtype)
    strat = make_strategy(strategy, info, precision, device)
    model = strat.prepare_policy(load_model(model_dir, cfg, torch.float32))
    tokenizer = load_tokenizer(model_dir, cfg)
    optimizer = torch.optim.AdamW(list(model.parameters()), lr=1e-6)
    for p in optimizer.param_groups[0]["params"]:  # allocate the AdamW state now
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    settings = PlanSettings(
        world_size=1,
        strategy=strategy,
        dtype=dtype,
        micro_batch_size=mb,
        prompt_length=P,
        response_length=T,
        generation_rows=rows,
        gradient_checkpointing=checkpointing,
    )
    plan = plan_memory(AutoConfig.from_pretrained(model_dir), settings)

    g = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    batch = TrainBatch(  # unpadded rows of random tokens, every token a response token
        prompt_ids=torch.randint(3, vocab, (2 * mb, P), generator=g),
        prompt_mask=torch.ones(2 * mb, P, dtype=torch.bool),
        response_ids=torch.randint(3, vocab, (2 * mb, T), generator=g),
        response_mask=torch.ones(2 * mb, T, dtype=torch.bool),
        rewards=torch.zeros(2 * mb),
        advantages=torch.randn(2 * mb, generator=g),
        group_ids=torch.arange(2 * mb) // 2,
    )
    scorer = TokenScorer(autocast=strat.autocast)
    if phase == "update":
        batch = batch.scored(scorer.no_grad(model, batch, micro_batch_size=mb), None)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    baseline = _status_kib("VmRSS") * 1024
    if phase == "rollout":
        prompts = ["1" * P] * (rows // 2)
        with strat.sampling(model):
            generate_rollouts(
                model,
                tokenizer,
                prompts,
                num_samples=2,
                max_new_tokens=T,
                batch_size=rows,
                seed=0,
                stop_token_ids=[vocab + 7],  # never sampled: every row runs T steps
            )
    elif phase == "scoring":
        scorer.no_grad(model, batch.rows(slice(0, mb)), micro_batch_size=mb)
    else:  # the rollout policy's scores, one selection, one update of two micro-batches
        objective, selection = ObjectiveConfig.preset("dapo"), SelectionConfig(score="gmts")
        selected = select_minibatch(
            batch, batch.old, selection, objective, micro_batch_size=mb, info=info, step=0
        )
        update_minibatch(
            model,
            optimizer,
            batch,
            selected,
            scorer=scorer,
            loss=LossConfig.of(objective, selection),
            micro_batch_size=mb,
            grad_clip=1.0,
            strategy=strat,
        )
    measured = _status_kib("VmHWM") * 1024 - baseline
    resident = plan.phases[phase]["weights"] + plan.phases[phase]["optimizer"]
    return {
        "phase": phase,
        "dtype": dtype,
        "strategy": strategy,
        "gradient_checkpointing": checkpointing,
        "planned_bytes": plan.total(phase) - resident,
        "measured_bytes": measured,
        "planned_parts": {
            k: v for k, v in plan.phases[phase].items() if k not in ("weights", "optimizer")
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "memory_check.json")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--child", nargs=5, metavar=("PHASE", "DTYPE", "STRATEGY", "GC", "SIZES"))
    args = parser.parse_args(argv)
    if args.child:
        phase, dtype, strategy, gc_flag, sizes = args.child
        print(
            json.dumps(
                child(
                    phase, dtype, strategy, gc_flag == "1", str(args.model_dir), json.loads(sizes)
                )
            )
        )
        return 0

    import tempfile

    from gpu_model import build

    shape = QUICK_SHAPE if args.quick else SHAPE
    sizes = (
        {"prompt": 32, "response": 32, "micro": 2, "rows": 4}
        if args.quick
        else {"prompt": 128, "response": 384, "micro": 4, "rows": 16}
    )
    model_dir = args.model_dir or Path(tempfile.mkdtemp()) / "model"
    build(model_dir, **shape)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    rows = []
    for dtype, strategy, checkpointing in MODES:
        for phase in PHASES:
            cmd = [
                sys.executable,
                __file__,
                "--model-dir",
                str(model_dir),
                "--child",
                phase,
                dtype,
                strategy,
                "1" if checkpointing else "0",
                json.dumps(sizes),
            ]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            rows.append(row)
            ratio = row["measured_bytes"] / row["planned_bytes"]
            print(
                f"{dtype:>8} {strategy:>9} gc={int(checkpointing)} {phase:>8}: planned "
                f"{row['planned_bytes'] / 2**20:8.1f} MiB, measured {row['measured_bytes'] / 2**20:8.1f} "
                f"MiB, measured/planned {ratio:.2f}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"shape": shape, "sizes": sizes, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
