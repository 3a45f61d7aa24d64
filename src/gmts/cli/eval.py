"""``gmts eval``: average@n of a model on benchmarks, as a paper-style table plus a JSON file.

Examples::

    gmts eval --model Qwen2.5-Math-1.5B-GMTS \\
        --benchmarks aime24,amc23,math500,minerva,olympiadbench --n 16 --temperature 1.0 \\
        --data-dir ../shared/data --out results/gmts.json --backend vllm
    gmts eval --model runs/demo/gmts --benchmarks builtin:addition   # CPU, seconds; after
        # gmts train --config configs/demo.yaml checkpoint.save_final=true (the demo keeps none)
    gmts eval --table results/grpo.json results/gmts.json           # rows = models
    gmts eval --model RUN --benchmarks mine.jsonl --question-field q --answer-field a \
        --reward math --template math                               # your own file
    gmts eval --model smollm2-135m-instruct --benchmarks gsm8k --verifier math  # prose answers

Results are appended per question to ``<out stem>.partial.jsonl`` as they finish; running the
same command again continues where a killed run stopped. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gmts.eval.harness import EvalConfig
    from gmts.eval.report import EvalReport
    from gmts.eval.results_store import ResultsStore

DEFAULT_BATCH_SIZE = {"hf": 64, "vllm": 8192}
"""Sequences per generation call: vLLM schedules its own batches, so it gets many prompts."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``gmts eval``'s options, in four groups of ``--help``."""
    _what_and_how_scored(parser.add_argument_group("what is evaluated and how it is scored"))
    _your_file(
        parser.add_argument_group(
            "your own benchmark file (a .jsonl/.json/.parquet in --benchmarks)"
        )
    )
    _how_it_runs(parser.add_argument_group("how it runs"))
    _results(parser.add_argument_group("results"))


def _what_and_how_scored(group: argparse._ArgumentGroup) -> None:
    from gmts.models.defaults import BUDGET_RULE

    group.add_argument(
        "--model",
        help="Hugging Face model folder, a gmts checkpoint (holding model/) or a gmts run "
        "folder (latest checkpoints/step_*/model)",
    )
    group.add_argument(
        "--benchmarks",
        default="aime24,amc23,math500,minerva,olympiadbench",
        help="comma-separated names (default: the paper's five math benchmarks); "
        "builtin:<task> for the embedded tasks; a .jsonl/.jsonl.gz/.json/.parquet file of your "
        "own (see --question-field, --answer-field, --reward, --template)",
    )
    group.add_argument("--n", type=int, default=16, help="samples per question (average@n)")
    group.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (pass@1)")
    group.add_argument("--limit", type=int, default=None, help="first K questions per benchmark")
    group.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="new tokens per answer, for every benchmark of the run (default: each benchmark's "
        f"own; your file: fitted, {BUDGET_RULE})",
    )
    group.add_argument("--seed", type=int, default=0)
    group.add_argument(
        "--data-dir",
        default=None,
        help="folder of the benchmark files, in the layout of docs/evaluation.md (default: "
        "$GMTS_DATA_DIR; neither: the Hugging Face Hub copies, cached by datasets)",
    )
    group.add_argument(
        "--verifier",
        default=None,
        metavar="REWARD",
        help="score every benchmark of the run (your file too) with this reward of "
        "gmts.rewards instead of its own verifier; e.g. math (the last \\boxed{}, else the "
        "last number) for a model that answers in prose where gsm8k and the paper's math "
        "benchmarks read only \\boxed{}. Refused for code benchmarks (humaneval, mbpp: their "
        "tests decide) and rewards that run code. Recorded in the results; a table cell it "
        "scored reads '12.50 [math]' (default: each benchmark's own verifier)",
    )


def _your_file(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--question-field", default="problem", help="your file: the question's field"
    )
    group.add_argument("--answer-field", default="answer", help="your file: the gold's field")
    group.add_argument(
        "--id-field", default=None, help="your file: a row id field (default: the row number)"
    )
    group.add_argument(
        "--reward",
        default=None,
        help="your file: the reward of gmts.rewards that scores a completion against the gold "
        "(math, choice, yes_no, code, format, exact; default: math)",
    )
    group.add_argument(
        "--template",
        default="auto",
        help="your file: the prompt template of gmts.data.prompts (math, plain, code, ...); "
        "auto (default): plain (the question in the model's chat template) for a model with a "
        "chat template, else math where its tokenizer reads that instruction, else plain",
    )


def _how_it_runs(group: argparse._ArgumentGroup) -> None:
    from gmts.eval.backends import available_backends  # light: torch loads on first use
    from gmts.rewards.sandbox import BACKENDS as SANDBOX_BACKENDS

    group.add_argument("--backend", default="hf", choices=available_backends())
    group.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="sequences per generation call (default: 64 with hf, 8192 with vllm)",
    )
    group.add_argument("--device", default="auto", help="hf backend: cpu, cuda, cuda:1, auto")
    group.add_argument(
        "--keep-finished-rows",
        action="store_true",
        help="hf backend: compute every answer's prompt and keep answers that have stopped "
        "in the batch until the last stops (the sampler before issue 34; by default a "
        "question's prompt is prefilled once and stopped answers leave the batch: the same "
        "tokens up to kernel rounding, fewer positions computed)",
    )
    group.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    group.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: torch's)"
    )
    group.add_argument(
        "--code-timeout", type=float, default=10.0, help="seconds per program (code benchmarks)"
    )
    group.add_argument(
        "--sandbox",
        choices=SANDBOX_BACKENDS,
        default=None,
        help="code benchmarks (humaneval, mbpp): bwrap = bubblewrap, the default, an error where "
        "it does not work; subprocess = the WEAKER sandbox (no filesystem, network or process "
        "isolation), an explicit opt-in (default: $GMTS_SANDBOX, else bwrap)",
    )


def _results(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--out",
        default=None,
        help="results JSON (default: eval-<model name>.json); the resumable per-question log "
        "goes next to it as <stem>.partial.jsonl",
    )
    group.add_argument("--name", default=None, help="row label in the table (default: folder)")
    group.add_argument(
        "--fresh", action="store_true", help="discard earlier partial results and start over"
    )
    group.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    group.add_argument(
        "--table",
        nargs="+",
        metavar="RESULTS_JSON",
        default=None,
        help="print one table from earlier results files (one row each) and exit",
    )


def _error(message: str) -> int:
    print(f"gmts eval: error: {message}", file=sys.stderr)
    return 2


def _default_name(model: str) -> str:
    """Row label: the folder name; ``<run>/step_000100`` for a gmts checkpoint."""
    path = Path(model).resolve()
    if path.name == "model":
        path = path.parent
    if path.parent.name == "checkpoints":
        return f"{path.parent.parent.name}/{path.name}"
    return path.name


class _Refused(Exception):
    """A bad argument or input, reported as one line before any model loads."""


@dataclass(frozen=True)
class _Plan:
    """What one checked ``gmts eval`` run will do."""

    model_path: str
    benchmarks: list[str]
    config: EvalConfig
    name: str
    out: Path


def run(args: argparse.Namespace) -> int:
    """The command: print tables, or check everything cheap, load the model and evaluate."""
    try:
        if args.table:
            return _print_tables(args.table)
        plan = _checked_plan(args)
        store = _results_store(args, plan)
        if args.threads is not None:
            _set_threads(args.threads)
        report = _evaluate(args, plan, store)
    except _Refused as err:
        return _error(str(err))
    from gmts.eval.report import write_report

    write_report(report, plan.out)
    print(report.table())
    print(f"per-question results: {plan.out}", file=sys.stderr)
    return 0


def _print_tables(paths: list[str]) -> int:
    from gmts.eval.report import format_table, load_summary

    try:
        summaries = [load_summary(p) for p in paths]
    except (OSError, ValueError, KeyError) as err:
        raise _Refused(str(err)) from err
    print(format_table(summaries))
    return 0


def _checked_plan(args: argparse.Namespace) -> _Plan:
    """The run's settings, with every check that needs no model weights made now: the threads,
    the model folder, the benchmarks and their files, the sandbox, the context fit and the
    vLLM start."""
    if args.threads is not None and args.threads < 1:
        raise _Refused(f"--threads must be >= 1, got {args.threads}")
    if args.keep_finished_rows and args.backend != "hf":
        raise _Refused(
            f"--keep-finished-rows is a setting of the hf backend; --backend {args.backend} "
            "batches its rows itself"
        )
    model_path, benchmarks, config = _settings(args)
    _check_data_files(args, benchmarks)
    benchmarks, config = _fitted_and_announced(args, model_path, benchmarks, config)
    _check_context_fit(args, model_path, benchmarks)
    name = args.name or _default_name(args.model)
    out = Path(args.out) if args.out else Path(f"eval-{name}.json")
    if args.backend == "vllm":  # the checks the backend makes too, before any file is written
        _check_vllm_can_start()
    return _Plan(model_path, benchmarks, config, name, out)


def _settings(args: argparse.Namespace) -> tuple[str, list[str], EvalConfig]:
    """The model folder, the benchmark names and the harness's config, each checked."""
    from gmts.eval.benchmarks import FileFields, code_sandbox, parse_benchmarks, verifier_override
    from gmts.eval.harness import EvalConfig
    from gmts.models.loading import ModelPathError, resolve_model_path
    from gmts.rewards import SandboxUnavailableError

    if not args.model:
        raise _Refused("--model is required (a model folder, checkpoint or run folder)")
    if args.verifier is not None and args.reward not in (None, args.verifier):
        raise _Refused(
            f"--reward {args.reward} and --verifier {args.verifier} both say how your file "
            "is scored (--verifier scores every benchmark of the run); give one"
        )
    try:
        model_path = resolve_model_path(args.model)
        if args.backend == "vllm":
            from gmts.eval.backends import check_whole_model

            check_whole_model(model_path, "the vllm backend")
        file_fields = FileFields(
            question_field=args.question_field,
            answer_field=args.answer_field,
            id_field=args.id_field,
            reward=args.reward or FileFields.reward,
            template=args.template,
        )
        benchmarks = parse_benchmarks(args.benchmarks, file_fields)
        sandbox = code_sandbox(benchmarks, args.sandbox)  # code benchmarks: fail closed now
        config = EvalConfig(
            n=args.n,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            limit=args.limit,
            seed=args.seed,
            batch_size=args.batch_size or DEFAULT_BATCH_SIZE[args.backend],
            data_dir=args.data_dir,
            code_timeout=args.code_timeout,
            sandbox=sandbox or args.sandbox,
            file_fields=file_fields,
            verifier=args.verifier,
        )
        for bench in benchmarks:  # a code benchmark under --verifier is refused now
            verifier_override(bench, config.verifier)
    except (ModelPathError, SandboxUnavailableError, ValueError) as err:
        raise _Refused(str(err)) from err
    return model_path, benchmarks, config


def _fitted_and_announced(
    args: argparse.Namespace, model_path: str, benchmarks: list[str], config: EvalConfig
) -> tuple[list[str], EvalConfig]:
    """Your file's budget fitted to the model (:mod:`gmts.eval.settings`), then one line per
    benchmark: its template, temperature and budget, and the size of the work."""
    import dataclasses

    from gmts.eval.benchmarks import parse_benchmarks
    from gmts.eval.settings import benchmark_settings, fit_file_budget
    from gmts.models.context import read_limit
    from gmts.models.loading import load_tokenizer

    try:
        tokenizer = load_tokenizer(model_path, pad_token=False)
        fitted = fit_file_budget(tokenizer, read_limit(model_path, tokenizer), benchmarks, config)
        if fitted is not None:  # the files are registered again, with their budget
            fields = dataclasses.replace(config.file_fields, max_new_tokens=fitted.tokens)
            config = dataclasses.replace(config, file_fields=fields)
            benchmarks = parse_benchmarks(args.benchmarks, fields)
        described = benchmark_settings(tokenizer, benchmarks, config, fitted)
    except (OSError, ValueError) as err:
        raise _Refused(str(err)) from err
    for one in described:
        print(one.line(), file=sys.stderr)
    return benchmarks, config


def _check_data_files(args: argparse.Namespace, benchmarks: list[str]) -> None:
    """Find every dataset file now, rather than after minutes of loading."""
    from gmts.eval.benchmarks import BUILTIN_PREFIX, get_spec

    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise _Refused(f"--data-dir {args.data_dir} is not a folder")
    dataset_names = [b for b in benchmarks if not b.startswith(BUILTIN_PREFIX)]
    if not dataset_names:
        return
    import warnings

    from gmts.data.benchmarks import read_benchmark

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bad rows are reported once, by the real load
            for bench in dataset_names:
                read_benchmark(get_spec(bench), data_dir=args.data_dir, limit=1)
    except (OSError, ValueError) as err:
        raise _Refused(str(err)) from err


def _check_context_fit(args: argparse.Namespace, model_path: str, benchmarks: list[str]) -> None:
    """Prompt + budget must fit the model's context: checked before loading weights."""
    from gmts.eval.backends import check_benchmarks_fit

    try:
        check_benchmarks_fit(
            model_path,
            benchmarks,
            max_new_tokens=args.max_new_tokens,
            data_dir=args.data_dir,
            limit=args.limit,
        )
    except (OSError, ValueError) as err:
        raise _Refused(str(err)) from err


def _check_vllm_can_start() -> None:
    import torch

    from gmts.sampling.vllm_engine import VLLMConfig, check_engine_can_start

    try:
        check_engine_can_start(VLLMConfig(), on_gpu=torch.cuda.is_available(), who="--backend vllm")
    except ValueError as err:
        raise _Refused(f"{err}; or use --backend hf") from err


def _results_store(args: argparse.Namespace, plan: _Plan) -> ResultsStore:
    """The per-question results file a killed run continues from (its settings must match)."""
    from gmts.eval.harness import partial_results_path, store_settings
    from gmts.eval.results_store import ResultsStore

    settings = store_settings(str(Path(plan.model_path).resolve()), args.backend, plan.config)
    try:
        return ResultsStore(partial_results_path(plan.out), settings, fresh=args.fresh)
    except ValueError as err:  # other settings, or not a results file
        raise _Refused(str(err)) from err


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _dtype_words(args: argparse.Namespace) -> str:
    """The dtype the model runs in and why, for the loading line (``--dtype`` changes it)."""
    if args.backend != "hf":
        return f"--dtype {args.dtype}" + (": the engine's choice" if args.dtype == "auto" else "")
    from gmts.models.loading import pick_device, torch_dtype
    from gmts.scale.auto_dtype import bf16_note

    try:
        device = pick_device(args.device)
        dtype = str(torch_dtype(args.dtype, device)).removeprefix("torch.")
    except ValueError:  # a device or dtype the backend refuses, with its own message
        return f"--dtype {args.dtype}"
    auto = " (auto: bfloat16 on a GPU, float32 on a CPU)" if args.dtype == "auto" else ""
    return f"{dtype}{auto}, --dtype to change; {bf16_note(device)}"


def _evaluate(args: argparse.Namespace, plan: _Plan, store: ResultsStore) -> EvalReport:
    """Load the model on the chosen backend and evaluate every benchmark."""
    from gmts.eval.backends import BackendOptions, make_backend
    from gmts.eval.harness import evaluate

    options = BackendOptions(
        plan.model_path,
        device=args.device,
        dtype=args.dtype,
        batch_size=plan.config.batch_size,
        seed=args.seed,
        drop_finished_rows=not args.keep_finished_rows,
    )
    print(
        f"loading {plan.model_path} ({args.backend} backend, {_dtype_words(args)})", file=sys.stderr
    )
    backend = make_backend(args.backend, options)
    try:
        report = evaluate(
            backend,
            plan.benchmarks,
            plan.config,
            model_name=plan.name,
            model_id=str(Path(plan.model_path).resolve()),
            results_path=store,
            progress=not args.no_progress,
        )
    except (OSError, ValueError) as err:  # unreadable data files, reported by the loaders
        raise _Refused(str(err)) from err
    _warn_misleading(report, backend.tokenizer, plan.config)
    return report


def _warn_misleading(report: EvalReport, tokenizer: Any, config: EvalConfig) -> None:
    """A line for each benchmark where most answers ran into the budget, and for each where
    no answer scored (:func:`gmts.eval.settings.misleading_results`)."""
    from gmts.eval.settings import misleading_results

    for line in misleading_results(report, tokenizer, config):
        print(f"gmts eval: {line}", file=sys.stderr)
