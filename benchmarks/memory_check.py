"""Check the trainer's memory plan (gmts.scale.memory_plan) against measured peaks on the CPU.

    python benchmarks/memory_check.py [--quick] [--rows NAME,...] [--out FILE] [KEY=VALUE ...]

A row is a list of trainer settings (``section.field=value``, what ``gmts train`` takes; see
:data:`ROWS`). Positional ``KEY=VALUE`` items are added to every row and win over it, so a
setting is checked without touching this file (``--rows bf16-gc model.logits_chunk_size=256``);
a row kept for the docs is one more line in :data:`ROWS`. Every setting is validated by the
trainer's config schema before anything is built.

For each row and phase a fresh process builds the real ``gmts.train.trainer.Trainer`` from
those settings: it checks the context, makes its memory plan from ``config.json`` before
loading the weights (``Trainer.memory_plan``, the plan it prints and enforces on CUDA), loads
the model (float32 master weights), lays it out with the strategy and precision, and builds its
AdamW optimizer and scorer. The AdamW state is then allocated (one zero-gradient step), the peak
resident set (``VmHWM``) is reset to the current one, and one phase runs with the trainer's own
methods:

- ``rollout``: ``Trainer.collect`` (KV-cached sampling of every answer to the budget, rewards,
  advantages); the batch is saved for the other two phases;
- ``scoring``: ``Trainer.scorer.no_grad`` over that batch (the old log-probs pass);
- ``update``: ``Trainer.train_step`` with that rollout given (old log-probs, one selection per
  mini-batch, micro-batched forward + backward, optimizer steps): the rest of a real step.

The growth of ``VmHWM`` over the baseline is compared with the plan's bytes for the phase minus
what the plan counts as resident at the baseline (weights, AdamW state, a reference model); the
update is compared with the largest of the plan's scoring, update and step phases, since the
rest of a step passes through all three. ``resident`` compares the resident set's growth from
before the ``Trainer`` was built to the baseline with those resident parts.

The model is a randomly initialised Qwen2 (benchmarks/gpu_model.py) with one character per
vocabulary id; the prompts are digit strings of one length, and the reward is a hash of the
completion (benchmarks/gpu_train.py), so advantages are real and no group is dropped. A random
model almost never samples the end token, so every answer runs to the budget and no row is
padded: on the CPU a padded batch takes SDPA's math path, a length x length attention matrix
the plan (made for CUDA's fused kernels) does not count. A rollout in which an answer ended
early is reported as an error (change ``seed=``). glibc is told to serve every block above
64 KiB with mmap (``MALLOC_MMAP_THRESHOLD_``), so freed tensors leave the resident set and it
tracks live bytes. ``--quick`` uses tiny shapes (seconds; its ratios mean little, the bytes are
small); the full run refreshes the table in docs/training.md unless ``--no-report``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
DOC = BENCH_DIR.parent / "docs" / "training.md"
BLOCK = ("<!-- memory-check:begin -->", "<!-- memory-check:end -->")
MIB = 2**20


@dataclass(frozen=True)
class Row:
    """One configuration measured: trainer settings over :data:`BASE` and the size's."""

    name: str
    overrides: tuple[str, ...]


ROWS: tuple[Row, ...] = (
    Row("fp32", ("model.dtype=float32", "model.gradient_checkpointing=false")),
    Row("fp32-gc", ("model.dtype=float32", "model.gradient_checkpointing=true")),
    Row("bf16-gc", ("model.dtype=bfloat16", "model.gradient_checkpointing=true")),
    Row(
        "bf16-fsdp-gc",
        (
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "distributed.strategy=fsdp",
        ),
    ),
    Row(
        "fp32-lora16",
        ("model.dtype=float32", "model.gradient_checkpointing=false", "model.lora.rank=16"),
    ),
    Row(
        "bf16-gc-lora16",
        ("model.dtype=bfloat16", "model.gradient_checkpointing=true", "model.lora.rank=16"),
    ),
)
PHASES = ("rollout", "scoring", "update")
TRANSIENT_STEP_PARTS = ("gradients", "working set")
"""What the plan's step phase holds besides the resident parts (weights, AdamW state, frozen
weights, a reference model: allocated before a phase starts, the baseline)."""
UPDATE_PLAN_PHASES = ("scoring", "update", "step")
"""What the rest of a step (``Trainer.train_step`` after the rollout) passes through."""

BASE = (  # every row: DAPO + GMTS top 20%, one rollout round, nothing evaluated or saved
    "algorithm=dapo",
    "selection.score=gmts",
    "selection.ratio=0.2",
    "rollout.max_sampling_rounds=1",
    "data.template=null",
    "data.shuffle=false",
    "data.eval_questions=0",
    "data.eval_before=false",
    "model.device=cpu",
    "threads=1",
    "checkpoint.save_final=false",
    "logging.progress=false",
)


@dataclass(frozen=True)
class Size:
    """The model's shape (Qwen2 ``config.json`` fields), the prompt length in tokens, and the
    batch settings (trainer overrides)."""

    model: dict[str, int]
    prompt_tokens: int
    overrides: tuple[str, ...]


FULL = Size(  # 40M parameters; 16 rows of 128 + 384 tokens; 2 mini-batches of 2 x 4 rows
    model={
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    },
    prompt_tokens=128,
    overrides=(
        "rollout.questions_per_batch=8",
        "rollout.group_size=2",
        "rollout.max_response_length=384",
        "optim.micro_batch_size=4",
        "optim.mini_batch_questions=4",
    ),
)
QUICK = Size(  # 8.6M parameters; 8 rows of 32 + 64 tokens; 2 mini-batches of 2 x 2 rows
    model={
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    },
    prompt_tokens=32,
    overrides=(
        "rollout.questions_per_batch=4",
        "rollout.group_size=2",
        "rollout.max_response_length=64",
        "optim.micro_batch_size=2",
        "optim.mini_batch_questions=2",
    ),
)
SMOLLM2 = Size(  # SmolLM2-135M-Instruct's shapes and its shipped config's batch (issue 27, 6)
    model={  # config.json of the converted model (gmts.models.named), as a Qwen2 (+ qkv biases)
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
    },
    prompt_tokens=96,  # configs/smollm2-135m-instruct/base.yaml: rollout.max_prompt_length
    overrides=(
        "rollout.questions_per_batch=3",
        "rollout.group_size=8",
        "rollout.max_response_length=64",
        "optim.micro_batch_size=24",
    ),
)
SIZES = {"full": FULL, "smollm2": SMOLLM2}
"""``--size``: the model and batch measured (``--quick`` uses :data:`QUICK`)."""


# --------------------------------------------------------------------------- one phase (child)


def _status_bytes(field: str) -> int:
    from bench_common import proc_status_kib

    value = proc_status_kib(field)
    if value is None:
        raise RuntimeError(f"/proc/self/status has no {field}: memory_check needs Linux")
    return value * 1024


def trainer_at_baseline(cfg: Any) -> tuple[Any, int]:
    """(the trainer of ``cfg`` with its AdamW state allocated and every weight read once, the
    resident set before it was built). A first trainer is built and dropped before: what
    building one imports and initialises once is then resident before the set is read."""
    import gc

    import torch
    from gpu_train import hashed_reward

    from gmts.train.trainer import Trainer

    # a first trainer, dropped: what building one imports and initialises once (modules,
    # kernels, the plan's probe) is then resident before ``before`` is read
    Trainer(cfg, reward_fn=hashed_reward)
    gc.collect()
    before = _status_bytes("VmRSS")
    trainer = Trainer(cfg, reward_fn=hashed_reward)
    if trainer.memory_plan is None:
        raise RuntimeError("the trainer made no memory plan (see its message above)")
    optimizer = trainer.optimizer
    for group in optimizer.param_groups:  # allocate the AdamW state now: part of the baseline
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():  # read every weight once: a frozen base (LoRA) in the checkpoint's
        for t in (*trainer.model.parameters(), *trainer.model.buffers()):  # dtype may still be
            t.sum()  # mapped from its file and would be paged in during the phase measured
    return trainer, before


def run_phase(phase: str, trainer: Any, collected: Any) -> Any:
    """``phase`` with the trainer's own methods (``collected``: the saved rollout, None for
    the rollout phase); returns the rollout (the one collected, or ``collected``)."""
    from gmts.train.scoring import needs_logit_grad_norm

    cfg = trainer.cfg
    if phase == "rollout":
        collected = trainer.collect(0)
    elif phase == "scoring":
        trainer.scorer.no_grad(
            trainer.model,
            collected.batch,
            micro_batch_size=cfg.optim.micro_batch_size,
            logit_grad_norm=needs_logit_grad_norm(cfg.selection),
        )
    elif phase == "update":
        trainer.collect = lambda step: collected  # type: ignore[method-assign]
        trainer.train_step(0)
    else:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    return collected


def check_unpadded(collected: Any) -> None:
    """RuntimeError unless every answer of the rollout ran to the budget (none padded)."""
    stats = collected.stats
    if stats.truncated != stats.answers:
        raise RuntimeError(
            f"{int(stats.answers - stats.truncated)} of {int(stats.answers)} answers sampled "
            "the end token before rollout.max_response_length: the batch would be padded "
            "(SDPA's math path on the CPU); choose another seed=N"
        )


def measure_phase(phase: str, overrides: list[str], batch_file: Path) -> dict[str, Any]:
    """Build the trainer of ``overrides``, then run and measure ``phase`` in this process.

    Returns planned and measured bytes (growth over the baseline) and what they are made of.
    """
    import gc

    import torch
    import transformers  # noqa: F401  (imported before the resident set is read)
    from bench_common import reset_peak_rss

    from gmts.train.config import load_config

    cfg = load_config(None, overrides)
    trainer, before = trainer_at_baseline(cfg)
    plan = trainer.memory_plan
    collected = None if phase == "rollout" else torch.load(batch_file, weights_only=False)
    gc.collect()
    baseline = _status_bytes("VmRSS")
    if not reset_peak_rss():
        raise RuntimeError("cannot reset VmHWM (/proc/self/clear_refs): memory_check needs Linux")
    start = time.perf_counter()
    collected = run_phase(phase, trainer, collected)
    seconds = time.perf_counter() - start
    measured = _status_bytes("VmHWM") - baseline
    if phase == "rollout":
        check_unpadded(collected)
        torch.save(collected, batch_file)

    step = plan.phases["step"]  # resident parts + the step's own (gradients, temporaries)
    resident = {k: v for k, v in step.items() if k not in TRANSIENT_STEP_PARTS}
    planned_phase = phase
    if phase == "update":
        planned_phase = max(UPDATE_PLAN_PHASES, key=plan.total)
    parts = {k: v for k, v in plan.phases[planned_phase].items() if k not in resident}
    return {
        "phase": phase,
        "planned_phase": planned_phase,
        "planned_bytes": plan.total(planned_phase) - sum(resident.values()),
        "measured_bytes": measured,
        "planned_parts": parts,
        "resident_planned_bytes": sum(resident.values()),
        "resident_measured_bytes": baseline - before,
        "resident_parts": resident,
        "plan_settings": dataclasses.asdict(plan.settings),  # nested configs as mappings
        "parameters": plan.shape.params,
        "seconds": round(seconds, 2),
    }


# --------------------------------------------------------------------------- the run (parent)


def select_rows(text: str | None) -> list[Row]:
    """``--rows`` (comma-separated names; None: all) -> rows of :data:`ROWS`, in its order."""
    if text is None:
        return list(ROWS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {row.name for row in ROWS}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--rows: unknown row(s) {unknown}; valid: {', '.join(sorted(known))}")
    return [row for row in ROWS if row.name in names]


def row_settings(row: Row, size: Size, extra: list[str]) -> list[str]:
    """The row's trainer settings without the run's paths: base, size, row, then ``extra``."""
    return [
        *BASE,
        *size.overrides,
        f"rollout.max_prompt_length={size.prompt_tokens}",
        *row.overrides,
        *extra,
    ]


def run_paths(work: Path, model_dir: Path, row: Row) -> list[str]:
    """The settings that point a row's trainer at this run's model, data and folder."""
    return [
        f"model.path={model_dir}",
        f"data.dataset={work / 'prompts.jsonl'}",
        f"logging.output_dir={work / row.name / 'run'}",
    ]


def write_prompts(path: Path, prompt_tokens: int, count: int = 64) -> None:
    """``count`` questions of ``prompt_tokens`` digits (one token each with the character
    tokenizer), so that no prompt is padded."""
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(count):
            problem = "".join(rng.choice("0123456789") for _ in range(prompt_tokens))
            handle.write(json.dumps({"problem": problem, "answer": "0"}) + "\n")


def check_settings(rows: list[Row], size: Size, extra: list[str], work: Path, model: Path) -> None:
    """Every row's settings through the trainer's schema (ValueError naming the bad key)."""
    from gmts.train.config import load_config

    for row in rows:
        load_config(None, [*row_settings(row, size, extra), *run_paths(work, model, row)])


def run_child(phase: str, settings: list[str], batch_file: Path) -> dict[str, Any]:
    """One phase in a fresh process; its JSON result (RuntimeError with its stderr if it fails)."""
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [sys.executable, __file__, "--child", phase, "--batch", str(batch_file), *settings]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {phase} process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE trainer settings for every row")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (checks the script)")
    parser.add_argument(
        "--rows", help=f"comma-separated subset of: {','.join(r.name for r in ROWS)}"
    )
    parser.add_argument(
        "--out", type=Path, help="result JSON (default benchmarks/results/memory_check.json)"
    )
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="full",
        help="model and batch: 'full' (40M parameters, the docs table) or 'smollm2' "
        "(SmolLM2-135M-Instruct's shapes, randomly initialised, its shipped config's batch)",
    )
    parser.add_argument("--no-report", action="store_true", help="do not refresh docs/training.md")
    parser.add_argument("--model-dir", type=Path, help="reuse (or keep) the random model here")
    parser.add_argument("--child", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    return parser


def phase_line(row: Row, phase: str, result: dict[str, Any]) -> str:
    """What is printed of one row's phase: measured vs planned, resident, seconds."""
    return (
        f"{row.name:>14} {phase:>8}: measured {result['measured_bytes'] / MIB:8.1f} MiB, "
        f"planned {result['planned_bytes'] / MIB:8.1f} MiB ({result['planned_phase']}), "
        f"ratio {result['measured_bytes'] / result['planned_bytes']:.2f}; resident "
        f"{result['resident_measured_bytes'] / MIB:.1f} / "
        f"{result['resident_planned_bytes'] / MIB:.1f} MiB; {result['seconds']:.1f} s"
    )


def measure_rows(
    rows: list[Row], size: Size, extra: list[str], work: Path, model_dir: Path
) -> list[dict[str, Any]]:
    """Every phase of every row, each in a fresh process (printed as it ends)."""
    results = []
    for row in rows:
        (work / row.name).mkdir()
        batch_file = work / row.name / "rollout.pt"
        settings = [*row_settings(row, size, extra), *run_paths(work, model_dir, row)]
        phases = {}
        for phase in PHASES:
            phases[phase] = result = run_child(phase, settings, batch_file)
            print(phase_line(row, phase, result), flush=True)
        results.append({"name": row.name, "overrides": [*row.overrides, *extra], "phases": phases})
    return results


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    if args.child:
        print(json.dumps(measure_phase(args.child, args.overrides, args.batch), default=str))
        return 0

    size = QUICK if args.quick else SIZES[args.size]
    work = Path(tempfile.mkdtemp(prefix="gmts-memory-check-"))
    model_dir = args.model_dir or work / "model"
    try:
        rows = select_rows(args.rows)
        check_settings(rows, size, args.overrides, work, model_dir)
    except ValueError as error:
        print(f"memory_check: {error}", file=sys.stderr)
        return 2
    default_out = (
        BENCH_DIR
        / "results"
        / ("memory_check.json" if args.size == "full" else f"memory_check_{args.size}.json")
    )
    out = args.out or (work / "memory_check.json" if args.quick else default_out)
    from bench_common import git_commit, machine_description, utc_now
    from gpu_model import build

    started = time.perf_counter()
    commit = git_commit()
    machine = machine_description()
    build(model_dir, full_vocabulary=True, **size.model)
    write_prompts(work / "prompts.jsonl", size.prompt_tokens)
    results = measure_rows(rows, size, args.overrides, work, model_dir)
    command = "python benchmarks/memory_check.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    record = {
        "command": command.strip(),
        "date": utc_now(),
        "commit": commit,
        "wall_s": round(time.perf_counter() - started, 1),
        "quick": args.quick,
        "size": "quick" if args.quick else args.size,
        "model": size.model,
        "prompt_tokens": size.prompt_tokens,
        "settings": [*BASE, *size.overrides],
        "machine": machine,
        "rows": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(render(record))
    print(f"wrote {out} ({record['wall_s']:.0f} s)")
    if not (args.quick or args.no_report or args.size != "full"):
        update_doc(record)  # the docs table is the 'full' size's
    return 0


# --------------------------------------------------------------------------- the docs table


def _ratio_text(result: dict[str, Any], key: str = "") -> str:
    measured, planned = result[f"{key}measured_bytes"], result[f"{key}planned_bytes"]
    return f"{measured / MIB:.1f} / {planned / MIB:.1f} ({measured / planned:.2f})"


def ratios(record: dict[str, Any]) -> list[float]:
    """measured / planned of every row and phase (resident not included)."""
    return [
        p["measured_bytes"] / p["planned_bytes"]
        for r in record["rows"]
        for p in r["phases"].values()
    ]


def render(record: dict[str, Any]) -> str:
    """The markdown table of a result record (what docs/training.md shows)."""
    lines = [
        "| row: settings | resident (weights, AdamW state) | rollout | scoring | update (rest of the step) |",
        "|---|---|---|---|---|",
    ]
    for row in record["rows"]:
        phases = row["phases"]
        settings = " ".join(f"`{o}`" for o in row["overrides"])
        cells = [_ratio_text(phases["rollout"], "resident_")]
        cells += [_ratio_text(phases[p]) for p in PHASES]
        lines.append(f"| {row['name']}: {settings} | " + " | ".join(cells) + " |")
    values = ratios(record)
    resident = [
        p["resident_measured_bytes"] / p["resident_planned_bytes"]
        for r in record["rows"]
        for p in r["phases"].values()
    ]
    plan_phases = sorted({r["phases"]["update"]["planned_phase"] for r in record["rows"]})
    m = record["machine"]
    lines += [
        "",
        f"Measured / planned MiB (ratio). In every row and phase the measured growth is "
        f"{min(values):.2f}-{max(values):.2f} times the plan's, the resident set "
        f"{min(resident):.2f}-{max(resident):.2f} times its resident parts; the rest of the "
        f"step is compared with the plan's {', '.join(plan_phases)} phase (the largest of "
        "scoring, update and step).",
        "",
        f"_Run finished {record['date']}, code at commit `{record['commit']}`, `{record['command']}`: "
        f"{record['wall_s']:.0f} s wall on {m['nproc']} cores ({m['model_name']}), torch "
        f"{m['torch']}; load before: `{m['uptime'].split('load average:')[-1].strip()}`._",
    ]
    return "\n".join(lines)


def update_doc(record: dict[str, Any], doc: Path = DOC) -> None:
    """Replace the table between :data:`BLOCK`'s markers in ``doc`` with :func:`render`."""
    text = doc.read_text()
    begin, end = BLOCK
    if begin not in text or end not in text:
        raise ValueError(f"{doc} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{begin}\n{render(record)}\n{end}{tail}")
    print(f"refreshed the memory-check table in {doc}")


if __name__ == "__main__":
    raise SystemExit(main())
