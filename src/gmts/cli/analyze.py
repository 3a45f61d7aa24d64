"""``gmts analyze``: per-token entropy / true gradient-norm analysis (the paper's Fig. 2-3).

Samples G answers for K questions of a built-in task with a model (a Hugging Face model folder,
the newest checkpoint of a training run, or by default the task's warm-start checkpoint),
measures every response token (entropy, p, eps, G, omega, ETS / GMTS / logit-grad scores and the
exact per-token gradient norms over all parameters) and writes into ``--out``:

    report.json        the five report sections (see gmts.analysis.report)
    tokens.jsonl       one line per answer with its per-token numbers
    *.png              the figures (gmts.analysis.plots)
    tokens.html        with --html: the token viewer (gmts.analysis.html)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16", "float64")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gmts.models.defaults import BUDGET_RULE

    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="a local Hugging Face model folder (with its tokenizer)")
    source.add_argument(
        "--run",
        help="a training run folder: its newest checkpoint's model is analysed "
        "(or a checkpoint folder / model folder itself)",
    )
    parser.add_argument(
        "--task",
        default="addition",
        help="built-in task to sample questions from (default: addition); without --model/--run "
        "the task's warm-start checkpoint is used",
    )
    parser.add_argument(
        "--dataset",
        default=None,
        help="sample questions from a benchmark (e.g. addition-2digit, gsm8k) or a .jsonl file "
        "(problem/answer fields) instead of --task, rendered through the model's chat template "
        "(for a real model, e.g. --model smollm2-135m-instruct)",
    )
    parser.add_argument(
        "--template",
        default=None,
        help="--dataset: prompt template (default: the benchmark's; a file's: auto, plain (the "
        "question in the model's chat template) for a model with one)",
    )
    parser.add_argument(
        "--reward", default=None, help="--dataset: reward of gmts.rewards (default: math)"
    )
    parser.add_argument("--questions", "-K", type=int, default=8, help="questions K (default 8)")
    parser.add_argument(
        "--samples", "-G", type=int, default=8, help="answers per question G (default 8)"
    )
    parser.add_argument("--out", default=None, help="output folder (default runs/analyze/<task>)")
    parser.add_argument("--html", action="store_true", help="also write the HTML token viewer")
    parser.add_argument(
        "--ratio", type=float, default=0.2, help="rho of the top-rho selections (0.2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for the questions and sampling")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (1.0)")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="default: the task's; a --dataset benchmark's 256; a --dataset file's fitted: "
        f"{BUDGET_RULE}",
    )
    parser.add_argument(
        "--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ..."
    )
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="model dtype (float32)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help="tokens per batched backward pass (default: as many as fit in --chunk-mib)",
    )
    parser.add_argument(
        "--chunk-mib",
        type=int,
        default=256,
        help="memory budget of one chunk of per-token gradients",
    )
    parser.add_argument(
        "--method",
        default="auto",
        choices=("auto", "batched", "loop"),
        help="true-norm engine: batched VJPs, one backward per token, or auto (batched, falling "
        "back to the loop if the model's backward cannot be vmapped)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 for models under 10M parameters on the CPU, where "
        "threads only add synchronisation; otherwise torch's default)",
    )


def _validate(args: argparse.Namespace) -> str | None:
    if args.dataset and not (args.model or args.run):
        return "--dataset needs --model or --run (the embedded model reads digits only)"
    if args.questions < 1:
        return f"--questions must be >= 1, got {args.questions}"
    if args.samples < 2:
        return f"--samples must be >= 2 (advantages need a group), got {args.samples}"
    if not 0.0 < args.ratio <= 1.0:
        return f"--ratio must be in (0, 1], got {args.ratio}"
    if args.temperature <= 0:
        return f"--temperature must be > 0, got {args.temperature}"
    if args.chunk_size is not None and args.chunk_size < 1:
        return f"--chunk-size must be >= 1, got {args.chunk_size}"
    if args.chunk_mib < 1:
        return f"--chunk-mib must be >= 1, got {args.chunk_mib}"
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        return f"--max-new-tokens must be >= 1, got {args.max_new_tokens}"
    return None


def resolve_model_dir(args: argparse.Namespace) -> Path:
    """The model folder to load: --model, --run (the same layouts), or the task's warm start."""
    from gmts.models.loading import EMBEDDED, ModelPathError, resolve_model_path

    flag, value = ("--model", args.model) if args.model else ("--run", args.run)
    try:
        path = resolve_model_path(
            value or EMBEDDED, task=args.task, seed=0, progress=sys.stderr.isatty()
        )
    except ModelPathError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    return Path(path)


SMALL_MODEL_PARAMETERS = 10_000_000


def _default_threads(model: Any, device: Any) -> int | None:
    """1 CPU thread for small models, else torch's default (None).

    On small models every op is tiny, so intra-op threads only add synchronisation
    (measurements: docs/analysis.md).
    """
    if device.type != "cpu":
        return None
    size = sum(p.numel() for p in model.parameters())
    return 1 if size < SMALL_MODEL_PARAMETERS else None


def _token_records(analysis: Any) -> list[dict[str, Any]]:
    a = analysis
    records = []
    for b in range(a.num_rows):
        n = int(a.response_mask[b].sum())

        def row(x, n=n, b=b):
            return [round(float(v), 7) for v in x[b, :n]]

        records.append(
            {
                "row": b,
                "group": int(a.group_ids[b]),
                "prompt": a.prompts[b],
                "completion": a.completions[b],
                "answer": a.answers[b],
                "reward": float(a.rewards[b]),
                "advantage": float(a.advantages[b]),
                "tokens": a.token_text[b],
                "entropy": row(a.entropy),
                "prob": row(a.prob),
                "eps": row(a.eps),
                "logit_grad_norm": row(a.logit_grad_norm),
                "omega": row(a.omega),
                "grad_logprob_norm": row(a.grad_logprob_norm),
                "grad_objective_norm": row(a.grad_objective_norm),
                "scores": {name: row(s) for name, s in a.scores.items()},
            }
        )
    return records


def _check_context(model_dir: Path, tokenizer: Any, task: Any, args: argparse.Namespace) -> None:
    """The task's longest prompt + the budget must fit the model (config.json only)."""
    import random

    from gmts.models.context import check_fits, longest_prompt, read_limit

    prompts = [p.prompt for p in task.sample(64, random.Random(args.seed))]
    settings = "--max-new-tokens" if args.max_new_tokens else "--max-new-tokens or --task"
    if args.dataset:  # the template's text is part of every prompt
        from gmts.data.prompts import resolve_template

        settings = f"--template (now {resolve_template(task.template, tokenizer)}), {settings}"
    check_fits(
        prompt_tokens=longest_prompt(tokenizer, prompts),
        new_tokens=args.max_new_tokens or task.max_new_tokens,
        limit=read_limit(str(model_dir), tokenizer),
        what=f"task {task.name}",
        settings=settings,
    )


def _settings(args: argparse.Namespace, model_dir: Path, tokenizer: Any, task: Any) -> Any:
    """The questions with their budget (a ``--dataset`` file's fitted to the model when
    ``--max-new-tokens`` is not given), after printing the template, temperature and budget."""
    from gmts.models.defaults import Setting, settings_line, template_setting

    budget_note = "the task's own"
    if args.dataset:
        from gmts.eval.benchmarks import is_data_file

        budget_note = "the --dataset default"
        if is_data_file(args.dataset) and args.max_new_tokens is None:
            from gmts.cli.analyze_questions import fitted_questions
            from gmts.models.context import read_limit

            task, fitted = fitted_questions(task, tokenizer, read_limit(str(model_dir), tokenizer))
            budget_note = fitted.reason
        template = template_setting(task.template, tokenizer, "--template")
    else:
        template = Setting("template", "none", "--dataset", f"--task {task.name}'s prompts")
    budget = args.max_new_tokens or task.max_new_tokens
    line = settings_line(
        "gmts analyze",
        [
            template,
            Setting("temperature", str(float(args.temperature)), "--temperature"),
            Setting(
                "budget",
                f"{budget} new tokens",
                "--max-new-tokens",
                "" if args.max_new_tokens else budget_note,
            ),
        ],
    )
    print(line, file=sys.stderr)
    return task


def run(args: argparse.Namespace) -> int:
    """``gmts analyze``: sample, measure, write the report, token records and figures into
    ``--out``; returns the exit status (2 for a setting that cannot run)."""
    error = _validate(args)
    if error:
        print(f"gmts analyze: {error}", file=sys.stderr)
        return 2
    from gmts.analysis.collect import sample_and_analyze
    from gmts.analysis.report import build_report
    from gmts.embedded.tasks import get_task
    from gmts.models.loading import pick_device

    try:
        task = None if args.dataset else get_task(args.task)
        device = pick_device(args.device)
        model_dir = resolve_model_dir(args)
        started = time.perf_counter()
        tokenizer, task = _questions(args, model_dir, task)
    except ValueError as exc:
        print(f"gmts analyze: {exc}", file=sys.stderr)
        return 2
    analysis = sample_and_analyze(
        _load_model(args, model_dir, device),
        tokenizer,
        task,
        questions=args.questions,
        samples=args.samples,
        seed=args.seed,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        chunk_size=args.chunk_size,
        max_chunk_bytes=args.chunk_mib * 2**20,
        method=args.method,
        progress=True,
    )
    analysis.meta.update(model=str(model_dir), device=str(device), dtype=args.dtype)
    report = build_report(analysis, ratio=args.ratio)
    out = Path(args.out or Path("runs") / "analyze" / Path(args.dataset or args.task).stem)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        out / "report.json",
        *_write_tokens_and_figures(args, analysis, report, out, model_dir),
    ]
    report["meta"]["timings"]["total_seconds"] = time.perf_counter() - started
    report["meta"]["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(_summary_text(report))
    for path in written:
        print(f"wrote {path}")
    return 0


def _questions(args: argparse.Namespace, model_dir: Path, task: Any) -> tuple[Any, Any]:
    """The model's tokenizer and the questions (``task``, or ``--dataset``'s rendered for the
    tokenizer), their settings printed and their prompts checked against the model's context;
    a setting that cannot run raises ``ValueError``."""
    from gmts.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model_dir, pad_token=False)
    if args.dataset:
        from gmts.cli.analyze_questions import dataset_questions

        task = dataset_questions(
            args.dataset, tokenizer, template=args.template, reward=args.reward
        )
    task = _settings(args, model_dir, tokenizer, task)
    _check_context(model_dir, tokenizer, task, args)
    return tokenizer, task


def _load_model(args: argparse.Namespace, model_dir: Path, device: Any) -> Any:
    """The model in ``--dtype`` on ``device`` (the line saying so printed), torch's CPU threads
    set as ``--threads`` asks (or :func:`_default_threads`)."""
    import torch

    from gmts.models.loading import load_model, torch_dtype
    from gmts.scale.auto_dtype import bf16_note

    print(
        f"gmts analyze: {model_dir} in {args.dtype} (--dtype; {bf16_note(device)})", file=sys.stderr
    )
    model = load_model(model_dir, dtype=torch_dtype(args.dtype), training=False).to(device)
    threads = args.threads or _default_threads(model, device)
    if threads:
        torch.set_num_threads(threads)
    return model


def _write_tokens_and_figures(
    args: argparse.Namespace, analysis: Any, report: dict[str, Any], out: Path, model_dir: Path
) -> list[Path]:
    """Write the figures, ``tokens.jsonl`` and (``--html``) the token viewer into ``out``;
    returns their paths."""
    from gmts.analysis.plots import write_figures

    figures = write_figures(analysis, report, out)
    written = [out / "tokens.jsonl", *figures]
    with open(out / "tokens.jsonl", "w", encoding="utf-8") as fh:
        for record in _token_records(analysis):
            fh.write(json.dumps(record) + "\n")
    if args.html:
        from gmts.analysis.html import write_html
        from gmts.analysis.report import selections

        title = f"gmts analyze: {args.dataset or args.task}, {model_dir.name}"
        written.append(
            write_html(
                analysis,
                selections(analysis, args.ratio),
                out / "tokens.html",
                title=title,
                ratio=args.ratio,
            )
        )
    return written


def _summary_text(report: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    meta, wa, pg, ov = (
        report["meta"],
        report["within_answer"],
        report["per_group"],
        report["overlap"],
    )
    jac = ov["batch"]["jaccard"]
    lines = [
        f"{meta['answers']} answers, {meta['tokens']} tokens, mean reward {f(meta['mean_reward'])}, "
        f"{meta['timings'].get('total_seconds', 0):.1f} s",
        f"within answer: median Pearson(log E, log ||grad log pi||) = {f(wa['pearson'].get('median'))}"
        f", median slope = {f(wa['slope'].get('median'))} ({wa['pearson']['count']} answers)",
        f"per group Spearman with ||grad l||: GMTS {f(pg['summary']['gmts'].get('mean'))}, "
        f"entropy {f(pg['summary']['entropy'].get('mean'))}, logit-grad "
        f"{f(pg['summary']['logit-grad'].get('mean'))} (mean over {pg['summary']['gmts']['count']} "
        f"groups; {pg['skipped_groups']} skipped with zero advantage)",
        f"pooled Spearman with ||grad l||: GMTS {f(pg['pooled']['gmts'])}, entropy "
        f"{f(pg['pooled']['entropy'])}, logit-grad {f(pg['pooled']['logit-grad'])}",
        f"eps < 0.1 for {f(report['eps']['fraction_below']['0.1'])} of tokens",
        f"Jaccard top-{meta['ratio']:g}: ETS/GMTS {f(jac['entropy|gmts'])}, ETS/oracle "
        f"{f(jac['entropy|oracle'])}, GMTS/oracle {f(jac['gmts|oracle'])}, logit-grad/oracle "
        f"{f(jac['logit-grad|oracle'])}",
    ]
    return "\n".join(lines)
