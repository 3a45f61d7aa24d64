"""Whole-step throughput on a real model (issue 27, items 4 and 1; issue 34, item 6): ``gmts
train`` with both rollout engines, today's path and the one before issue 34, vs TRL's
GRPOTrainer, and the trainer's vLLM rollout vs plain vLLM.

Six contenders, one process (``--threads`` torch threads; vLLM's engines run in it too, so
every contender shares its thread pool):

- ``trl``: TRL's ``GRPOTrainer`` (its ``transformers`` ``generate`` sampler);
- ``hf``: a gmts :class:`gmts.train.trainer.Trainer` with ``rollout.engine=hf``, as shipped
  (``model.forward_layout=grouped``: each prompt computed once per group, no padding; finished
  rows leave the sampler's batch);
- ``hf_old``: the same with the path before issue 34 (``model.forward_layout=padded``,
  ``rollout.drop_finished_rows=false``);
- ``vllm``: a gmts Trainer with ``rollout.engine=vllm`` (its colocated in-process vLLM engine);
- ``vllm_old``: the same with ``model.forward_layout=padded`` (a second engine in the process;
  vLLM batches its own rows);
- ``vllm_plain``: right after the ``vllm`` trainer's step, ``LLM.generate`` on that trainer's
  own ``vllm.LLM``, one plain request per row of the step's prompt token ids (the same rows,
  group size, temperature, budget and stop ids; no seeds, no log-probs; prefix cache reset
  first, as the trainer's weight sync resets it).

The contenders are built and stepped by :mod:`bench_real_contenders`; this file configures
them, measures and summarizes. The gmts side is ``configs/smollm2-135m-instruct/dapo-ets.yaml``
(read by gmts's own loader, ``base:`` chain included) with held-out evaluation and the final
save off; every gmts trainer has the same seed and data, so each draws the same questions
(checked) and the old path samples the new one's tokens up to kernel rounding. TRL's
``GRPOConfig`` is derived from that config: batch = questions x group size, the same
generation budget, temperature, lr, betas, eps, weight decay, gradient clip, KL coefficient,
DAPO loss with its two clip ranges, ETS (``top_entropy_quantile`` = ``selection.ratio``), float32
on the CPU, no gradient checkpointing. TRL trains on the questions gmts draws, in gmts's order,
with gmts's reward function (``math``), and its prompt token ids are checked against gmts's at
every step (the run stops if they differ). With a chat template the prompts are conversational
(``data.template=plain``: the model's own template, its default system turn); ``--quick``'s
random tiny llama has a one-character tokenizer without one, so there the prompts are plain
text (``a+b=``, the same questions) on both sides.

Per TRL step (a callback around it), each gmts trainer runs one step with the same index, the
contenders' order (trl, hf, hf_old, vllm + vllm_plain, vllm_old) rotating from step to step, so
load changes on a shared machine hit all alike. Recorded per contender per step: step time,
completion tokens, tokens/s, gmts's ``time/rollout_s``, ``time/update_s``,
``time/weight_sync_s``, ``update/positions_computed`` and ``update/positions_real``, TRL's
generation time (its ``_generate_single_turn``, timed here: TRL logs it only to wandb/mlflow),
the vllm engines' own sampling calls, and the process's peak RSS during the step (the kernel's
``VmHWM`` high-water mark, reset before each step: it is the whole process's, every contender's
model resident). Ratios are per step (paired), then median and min-max; the first step (a
warm-up) is dropped. Issue 34's ratios are new / old (``hf_vs_hf_old_*``,
``vllm_vs_vllm_old_*``: step, rollout and update time, positions computed, tokens/s) and each
contender's tokens/s against TRL's; ``goals`` holds issue 27's and issue 34's targets (new step
<= 0.4x the old with hf in float32, <= 0.45x with vllm; tokens/s >= 3x TRL's with hf, >= 5x
with vllm), judged on the medians, not in quick mode. The JSON record holds the machine, the
load (``uptime``) before and after, the command and the commit. vLLM contenders are skipped
(the skip recorded) where vllm is not installed.

The full run (SmolLM2-135M-Instruct, 3 questions x 8 answers, 64 tokens; 1 warm-up + 5 timed
steps, so that each contender holds each place of the rotation once; a round took about 180 s
with trl, hf and vllm before issue 34, the old-path contenders add up to about 95 s: ~30
minutes with start-up on the idle 2-core machine; every model in one process, about 16-21 GiB
peak RSS). Run it in the vllm venv, nothing else running:

    GMTS_CACHE=/work/.gmts-cache GMTS_SHARED_DATA=/work/shared/data HF_HUB_OFFLINE=1 \\
      .venv-vllm/bin/python benchmarks/bench_throughput_real.py --steps 6
    python benchmarks/bench_throughput_real.py --quick   # random tiny llama, under a minute

``--contenders`` names the gmts contenders to run (default all; ``hf`` always, TRL mirrors it):
where memory is short, run ``--contenders hf,hf_old`` and ``--contenders hf,vllm,vllm_old``
one after the other (each pair still interleaved in one process). ``--hf-set KEY=VALUE`` adds
one to the hf trainers only (their sampler's speed settings, ``rollout.draw`` and
``rollout.prepack_weights``, which the vllm engine refuses; ``hf_old``'s own settings come
last). ``--set KEY=VALUE`` adds a gmts override (e.g. ``logging.overlap_metrics=false``: the
shipped config logs the GMTS-vs-ETS overlap, which TRL does not compute); a setting TRL cannot
mirror stops the run before any model loads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import (
    DEFAULT_RESULTS_DIR,
    REPO_ROOT,
    child_env,
    git_commit,
    goal,
    machine_description,
    standalone_record,
    write_result,
)
from bench_real_contenders import (
    CONTENDERS,
    ENGINE,
    NEW_VS_OLD,
    OLD_PATH,
    InterleavedSteps,
    build_contenders,
    interleaving_callback,
    rotation,
    skipped_contenders,
)
from bench_rollout_real import save_quick_model

DEFAULT_CONFIG = REPO_ROOT / "configs" / "smollm2-135m-instruct" / "dapo-ets.yaml"
QUICK_QUESTIONS = 64
"""Questions of the quick mode's dataset file (``a+b=``, from addition-2digit's train split)."""
GMTS_CONTENDERS = tuple(ENGINE)
"""What ``--contenders`` chooses from (TRL always runs: its steps drive the rounds)."""
__all__ = ["CONTENDERS", "main", "rotation"]
# --------------------------------------------------------------------------------------
# the two sides' configurations


def gmts_overrides(args: argparse.Namespace, name: str, run_dir: Path) -> list[str]:
    """``section.field=value`` overrides of ``args.config`` for the gmts contender ``name``
    (its engine, :data:`ENGINE`): no held-out evaluation, no final save, the benchmark's steps,
    threads and run folder, ``--set``, ``--hf-set`` on the hf engine, and last the old path's
    settings (:data:`OLD_PATH`)."""
    engine = ENGINE[name]
    out = [
        f"rollout.engine={engine}",
        "model.device=cpu",
        f"threads={args.threads}",
        f"optim.steps={args.steps}",
        "checkpoint.save_final=false",
        "data.eval_dataset=null",
        "data.eval_before=false",
        "data.eval_questions=0",
        f"logging.output_dir={run_dir}",
        "logging.progress=false",
        "logging.report_to=none",
    ]
    if args.model:
        out.append(f"model.path={args.model}")
    if args.dataset:  # the quick mode's file: plain-text prompts
        out += [f"data.dataset={args.dataset}", "data.template=null"]
    shape = {
        "rollout.questions_per_batch": args.questions,
        "rollout.group_size": args.group_size,
        "rollout.max_response_length": args.new_tokens,
        "rollout.max_prompt_length": args.max_prompt_length,
    }
    out += [f"{k}={v}" for k, v in shape.items() if v is not None]
    if args.questions is not None or args.group_size is not None:
        out.append("optim.micro_batch_size=1000000")  # one micro-batch: a single pass, as TRL
    out += list(args.set or [])
    if engine == "hf":
        out += list(args.hf_set or [])
    return out + list(OLD_PATH.get(name, ()))


def check_trl_can_match(cfg: Any) -> None:
    """ValueError unless TRL's GRPOTrainer has every setting of ``cfg`` that the pairing
    mirrors (one update per batch, DAPO token-mean, ETS or all tokens, group-std advantages)."""
    problems = []
    if cfg.selection.score not in ("entropy", "none"):
        problems.append(f"selection.score={cfg.selection.score} (TRL has ETS only)")
    if cfg.mini_batch_questions != cfg.rollout.questions_per_batch or cfg.optim.epochs != 1:
        problems.append("more than one optimizer step per rollout batch")
    if cfg.objective.aggregation != "token-mean" or cfg.objective.name != "ppo":
        problems.append(f"objective {cfg.objective.name}/{cfg.objective.aggregation}")
    if not cfg.rollout.std_normalize or cfg.rollout.advantage_std != "unbiased":
        problems.append("advantages not divided by the unbiased group std")
    if cfg.rollout.overlong_buffer or cfg.optim.warmup_steps or cfg.optim.schedule != "constant":
        problems.append("overlong penalty, warmup or a non-constant schedule")
    if cfg.rollout.dynamic_sampling and cfg.rollout.max_sampling_rounds > 1:
        problems.append("dynamic sampling over more than one round (TRL samples once)")
    if problems:
        raise ValueError(f"TRL's GRPOTrainer cannot mirror this config: {'; '.join(problems)}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the trainers (TRL's before vLLM's engines start), run ``args.steps`` TRL steps
    with the gmts steps interleaved; every figure per step."""
    import torch

    from gmts.train.config import load_config

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    chosen = [*args.contenders, *(["vllm_plain"] if "vllm" in args.contenders else [])]
    skipped = {n: why for n, why in skipped_contenders().items() if n in chosen}
    names = [n for n in args.contenders if n not in skipped]
    cfgs = {n: load_config(args.config, gmts_overrides(args, n, work / f"gmts-{n}")) for n in names}
    check_trl_can_match(cfgs["hf"])
    contenders = build_contenders(cfgs, work, args.steps)
    threads_after_start = torch.get_num_threads()
    steps = InterleavedSteps(contenders)
    contenders.trl.add_callback(interleaving_callback(steps))
    try:
        contenders.trl.train()
    finally:
        contenders.close()
    return {
        "rows": {k: v for k, v in steps.rows.items() if v},
        "skipped": skipped,
        "left_out": [n for n in GMTS_CONTENDERS if n not in args.contenders],
        "orders": steps.orders,
        "start_s": contenders.started,
        "threads": args.threads,
        "torch_threads_after_start": threads_after_start,
        "torch_threads_after_run": torch.get_num_threads(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "prompt_tokens_checked": True,
        "prompt_example": {
            "ids": contenders.expected_ids[0][0],
            "text": contenders.hf.tokenizer.decode(contenders.expected_ids[0][0]),
        },
        "gmts_config": gmts_config_record(args, contenders.hf, work, names),
    }


def gmts_config_record(
    args: argparse.Namespace, hf: Any, work: Path, names: list[str]
) -> dict[str, Any]:
    """What the record says of the gmts side's settings (the hf trainer's), and every
    contender's overrides."""
    return {
        "model": hf.cfg.model.path,
        "dtype": hf.cfg.model.dtype,
        "questions": hf.cfg.rollout.questions_per_batch,
        "group_size": hf.cfg.rollout.group_size,
        "max_new_tokens": hf.parts.data.max_new_tokens,
        "temperature": hf.cfg.rollout.temperature,
        "dynamic_sampling": hf.cfg.rollout.dynamic_sampling,
        "max_sampling_rounds": hf.cfg.rollout.max_sampling_rounds,
        "selection": f"{hf.cfg.selection.score} {hf.cfg.selection.ratio}",
        "kl_coef": hf.cfg.objective.kl_coef,
        "template": hf.cfg.data.template,
        "reward": hf.cfg.data.reward,
        "dataset": hf.cfg.data.dataset,
        "overlap_metrics": hf.cfg.logging.overlap_metrics,
        "overrides": {n: gmts_overrides(args, n, work / f"gmts-{n}") for n in names},
    }


# --------------------------------------------------------------------------------------
# the summary


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


OPTIONAL_FIGURES = (
    "rollout_s",
    "update_s",
    "positions_computed",
    "positions_real",
    "weight_sync_s",
    "engine_sample_s",
    "generate_s",
    "trl_logged_step_time_s",
)
"""The per-step figures some contenders have (gmts's phases and the positions its update
computed, the engine's call, TRL's)."""


def summarize(child: dict[str, Any]) -> dict[str, Any]:
    """Per contender: medians and min-max of the timed steps (the first dropped); per pair:
    the per-step ratio's median and min-max; the goals."""
    timed = {name: steps[1:] for name, steps in child["rows"].items()}
    if any(not steps for steps in timed.values()):
        raise RuntimeError("too few steps: the first is a warm-up, give --steps 2 or more")
    out: dict[str, Any] = {
        "contenders": {name: contender_summary(steps) for name, steps in timed.items()},
        "ratios": paired_ratios(timed),
    }
    out["goals"] = goals(out["ratios"], quick=child.get("quick", False))
    return out


def contender_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's timed steps: each figure's median and min-max."""
    row: dict[str, Any] = {
        "timed_steps": len(steps),
        "step_s": _spread([s["step_s"] for s in steps]),
        "tokens": _spread([s["tokens"] for s in steps]),
        "tokens_per_s": _spread([s["tokens"] / s["step_s"] for s in steps]),
        "peak_rss_mib": _spread([s["peak_rss_mib"] for s in steps]),
    }
    for key in OPTIONAL_FIGURES:
        if all(key in s for s in steps):
            row[key] = _spread([s[key] for s in steps])
    return row


def _tokens_per_s(s: dict[str, Any]) -> float:
    return s["tokens"] / s["step_s"]


def _figure(key: str) -> Any:
    return lambda s: s[key]


def paired_ratios(timed: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per-step (paired) ratios between contenders, each a median and min-max: tokens/s and
    step time against TRL; issue 34's new path against its old one (step, rollout and update
    time, positions computed, tokens/s); the vllm trainer's rollout against plain vLLM."""
    out: dict[str, dict[str, float]] = {}

    def paired(label: str, num: str, den: str, rate_num: Any, rate_den: Any) -> None:
        if num in timed and den in timed:
            out[label] = _spread(
                [rate_num(a) / rate_den(b) for a, b in zip(timed[num], timed[den])]
            )

    for name in GMTS_CONTENDERS:
        paired(f"{name}_vs_trl_tokens_per_s", name, "trl", _tokens_per_s, _tokens_per_s)
    for name in ("hf", "vllm"):
        paired(f"{name}_vs_trl_step_time", name, "trl", _figure("step_s"), _figure("step_s"))
    for new, old in NEW_VS_OLD.items():
        for key in ("step_s", "rollout_s", "update_s", "positions_computed"):
            label = f"{new}_vs_{old}_{key.removesuffix('_s')}"
            paired(
                label + ("_time" if key.endswith("_s") else ""),
                new,
                old,
                _figure(key),
                _figure(key),
            )
        paired(f"{new}_vs_{old}_tokens_per_s", new, old, _tokens_per_s, _tokens_per_s)
    plain = ("vllm", "vllm_plain")
    paired(
        "trainer_rollout_vs_plain_vllm",
        *plain,
        lambda s: s["tokens"] / s["rollout_s"],
        _tokens_per_s,
    )
    paired(
        "trainer_rollout_without_sync_vs_plain_vllm",
        *plain,
        lambda s: s["tokens"] / (s["rollout_s"] - s["weight_sync_s"]),
        _tokens_per_s,
    )
    paired(
        "engine_sample_vs_plain_vllm",
        *plain,
        lambda s: s["tokens"] / s["engine_sample_s"],
        _tokens_per_s,
    )
    return out


GOALS = (
    (
        "vllm_vs_trl_tokens_per_s",
        "issue 27: gmts train (rollout.engine=vllm) tokens/s vs TRL",
        ">=",
        1.5,
    ),
    (
        "hf_vs_trl_tokens_per_s",
        "issue 27: gmts train (rollout.engine=hf) tokens/s vs TRL",
        ">=",
        1.0,
    ),
    (
        "trainer_rollout_vs_plain_vllm",
        "issue 27: the trainer's vllm rollout (time/rollout_s: weight sync and rewards in) vs "
        "plain vLLM",
        ">=",
        0.9,
    ),
    (
        "hf_vs_hf_old_step_time",
        "issue 34: step time, new path / old (hf engine, float32)",
        "<=",
        0.4,
    ),
    ("vllm_vs_vllm_old_step_time", "issue 34: step time, new path / old (vllm engine)", "<=", 0.45),
    (
        "hf_vs_trl_tokens_per_s",
        "issue 34: gmts train (rollout.engine=hf) tokens/s vs TRL",
        ">=",
        3.0,
    ),
    (
        "vllm_vs_trl_tokens_per_s",
        "issue 34: gmts train (rollout.engine=vllm) tokens/s vs TRL",
        ">=",
        5.0,
    ),
)
"""(ratio, goal, comparison, target): issue 27's goals and issue 34's done-when targets."""


def goals(ratios: dict[str, Any], *, quick: bool) -> list[dict[str, Any]]:
    """The goals on the paired ratios' medians (``met`` None: not measured, or quick)."""
    out = []
    for key, name, op, target in GOALS:
        r = ratios.get(key)
        if r is None:
            out.append(goal(name, f"{op} {target}x", "not measured", None))
            continue
        measured = f"{r['median']:.2f}x (per step {r['min']:.2f}-{r['max']:.2f}x)"
        met = r["median"] >= target if op == ">=" else r["median"] <= target
        out.append(goal(name, f"{op} {target}x", measured, None if quick else met))
    return out


# --------------------------------------------------------------------------------------
# the parent


def write_quick_dataset(path: Path) -> Path:
    """addition-2digit's first train questions as ``a+b=`` (the quick model's alphabet), one
    JSON object per line with ``problem`` and ``answer``."""
    from gmts.data.benchmarks import load_benchmark

    examples = load_benchmark("addition-2digit", split="train", limit=QUICK_QUESTIONS)
    lines = [
        json.dumps({"problem": f"{e.meta['a']}+{e.meta['b']}=", "answer": e.answer})
        for e in examples
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


SHAPE_ARGS = ("questions", "group_size", "new_tokens", "max_prompt_length")


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--quick", action="store_true", help="a random tiny llama, < 1 minute")
    parser.add_argument("--steps", type=int, default=4, help="TRL steps; the first is a warm-up")
    parser.add_argument("--questions", type=int, help="questions per step (default: config's)")
    parser.add_argument("--group-size", type=int, help="answers per question (config's)")
    parser.add_argument("--new-tokens", type=int, help="generation budget (config's)")
    parser.add_argument("--max-prompt-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--contenders",
        type=lambda text: [n.strip() for n in text.split(",") if n.strip()],
        default=list(GMTS_CONTENDERS),
        help=f"the gmts contenders, comma-separated, hf among them (default: all, "
        f"{','.join(GMTS_CONTENDERS)}; TRL always runs); fewer where memory is short",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a further override of the gmts config (repeatable; TRL mirrors what it can and "
        "the run stops where it cannot), e.g. logging.overlap_metrics=false",
    )
    parser.add_argument(
        "--hf-set",
        action="append",
        metavar="KEY=VALUE",
        help="an override of the hf trainer only (repeatable), e.g. its sampler's speed "
        "settings rollout.draw=inverse_cdf, rollout.prepack_weights=true",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--model", help=argparse.SUPPRESS)  # set by --quick (internal)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)  # set by --quick (internal)
    parser.add_argument("--work", help=argparse.SUPPRESS)  # the child's folder (internal)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # json path (internal)
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``parser.error`` on a bad argument, config or ``--set`` (before any model loads)."""
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (the first is a warm-up), got {args.steps}")
    for name in ("questions", "group_size", "new_tokens", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not args.config.is_file():
        parser.error(f"--config: no such file {args.config}")
    unknown = sorted(set(args.contenders) - set(GMTS_CONTENDERS))
    if unknown or "hf" not in args.contenders:
        parser.error(
            f"--contenders: expected names among {','.join(GMTS_CONTENDERS)} with hf among "
            f"them (TRL mirrors the hf trainer), got {','.join(args.contenders)}"
        )
    from gmts.train.config import load_config

    try:  # a bad config or --set fails here, before any model loads
        overrides = [*(args.set or []), "rollout.engine=hf", *(args.hf_set or [])]
        check_trl_can_match(load_config(args.config, overrides))
    except ValueError as exc:
        parser.error(str(exc))


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`measure` in a child process (its own thread settings) over a temporary folder
    (``--quick``: the random tiny llama and its questions written there first)."""
    with tempfile.TemporaryDirectory(prefix="gmts-bench-throughput-real-") as tmp:
        command = [sys.executable, __file__, "--config", str(args.config), "--work", tmp]
        if args.quick:
            model = save_quick_model(Path(tmp) / "model")
            dataset = write_quick_dataset(Path(tmp) / "questions.jsonl")
            command += ["--model", str(model), "--dataset", str(dataset)]
        command += ["--contenders", ",".join(args.contenders)]
        for name in ("steps", "threads", *SHAPE_ARGS):
            if getattr(args, name) is not None:
                command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        for override in args.set or []:
            command += ["--set", override]
        for override in args.hf_set or []:
            command += ["--hf-set", override]
        path = Path(tmp) / "child.json"
        subprocess.run([*command, "--child", str(path)], check=True, env=child_env(args.threads))
        return json.loads(path.read_text())


def notes(quick: bool) -> list[str]:
    """What a reader of the record needs to know to read its figures."""
    return [
        "one process: every contender shares its torch threads; vLLM runs in-process",
        "peak_rss_mib: the whole process's VmHWM during the step (every model resident)",
        "hf_old, vllm_old: the trainer before issue 34 (model.forward_layout=padded; hf_old "
        "also rollout.drop_finished_rows=false), fed the same questions; *_vs_*_old ratios "
        "are per step, new / old",
        "TRL's generate_s: its _generate_single_turn, timed by this benchmark",
        "quick: plain-text prompts (the quick tokenizer has no chat template)"
        if quick
        else "conversational TRL prompts: token ids checked equal to gmts's every step",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.child:
        result = measure(args)
        Path(args.child).write_text(json.dumps(result))
        return 0
    check_arguments(parser, args)
    if args.quick:
        args.steps, args.questions, args.group_size, args.new_tokens = 3, 2, 2, 8
        args.max_prompt_length, args.threads = 16, 1
    commit = git_commit()
    before = machine_description()
    load_before = os.getloadavg()
    started = time.perf_counter()
    child = run_child(args)
    child["quick"] = args.quick
    config = args.config.resolve()
    record = {
        **standalone_record(
            "throughput_real",
            quick=args.quick,
            commit=commit,
            machine_before=before,
            load_before=load_before,
            started=started,
            argv=sys.argv if argv is None else ["bench_throughput_real.py", *argv],
            executable=sys.executable,
        ),
        "model": "random tiny llama (quick)" if args.quick else child["gmts_config"]["model"],
        "config": str(config.relative_to(REPO_ROOT))
        if config.is_relative_to(REPO_ROOT)
        else str(args.config),
        "settings": {
            "steps": args.steps,
            "threads": args.threads,
            "set": args.set or [],
            "hf_set": args.hf_set or [],
            "contenders": args.contenders,
        },
        "notes": notes(args.quick),
        **summarize(child),
        "raw": child,
    }
    path = write_result(args.out, "throughput_real", record)
    for name, row in record["contenders"].items():
        print(f"{name}: tokens/s {row['tokens_per_s']['median']:.1f}")
    for label, r in record["ratios"].items():
        print(f"{label}: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    for g in record["goals"]:
        print(f"goal {g['name']}: {g['target']}, measured {g['measured']}, met {g['met']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
