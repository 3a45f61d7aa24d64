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
from pathlib import Path

DEFAULT_BATCH_SIZE = {"hf": 64, "vllm": 8192}
"""Sequences per generation call: vLLM schedules its own batches, so it gets many prompts."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        help="Hugging Face model folder, a gmts checkpoint (holding model/) or a gmts run "
        "folder (latest checkpoints/step_*/model)",
    )
    parser.add_argument(
        "--benchmarks",
        default="aime24,amc23,math500,minerva,olympiadbench",
        help="comma-separated names (default: the paper's five math benchmarks); "
        "builtin:<task> for the embedded tasks; a .jsonl/.jsonl.gz/.json/.parquet file of your "
        "own (see --question-field, --answer-field, --reward, --template)",
    )
    parser.add_argument("--n", type=int, default=16, help="samples per question (average@n)")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (pass@1)")
    parser.add_argument("--limit", type=int, default=None, help="first K questions per benchmark")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder of the benchmark files, in the layout of docs/evaluation.md (default: "
        "$GMTS_DATA_DIR; neither: the Hugging Face Hub copies, cached by datasets)",
    )
    parser.add_argument(
        "--question-field", default="problem", help="your file: the question's field"
    )
    parser.add_argument("--answer-field", default="answer", help="your file: the gold's field")
    parser.add_argument(
        "--id-field", default=None, help="your file: a row id field (default: the row number)"
    )
    parser.add_argument(
        "--reward",
        default=None,
        help="your file: the reward of gmts.rewards that scores a completion against the gold "
        "(math, choice, yes_no, code, format, exact; default: math)",
    )
    parser.add_argument(
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
    parser.add_argument(
        "--template",
        default="math",
        help="your file: the prompt template of gmts.data.prompts (plain: the question as is)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="results JSON (default: eval-<model name>.json); the resumable per-question log "
        "goes next to it as <stem>.partial.jsonl",
    )
    from gmts.eval.backends import available_backends  # light: torch loads on first use
    from gmts.rewards.sandbox import BACKENDS as SANDBOX_BACKENDS

    parser.add_argument("--backend", default="hf", choices=available_backends())
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="sequences per generation call (default: 64 with hf, 8192 with vllm)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="budget (default: per benchmark)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="hf backend: cpu, cuda, cuda:1, auto")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: torch's)"
    )
    parser.add_argument("--name", default=None, help="row label in the table (default: folder)")
    parser.add_argument(
        "--code-timeout", type=float, default=10.0, help="seconds per program (code benchmarks)"
    )
    parser.add_argument(
        "--sandbox",
        choices=SANDBOX_BACKENDS,
        default=None,
        help="code benchmarks (humaneval, mbpp): bwrap = bubblewrap, the default, an error where "
        "it does not work; subprocess = the WEAKER sandbox (no filesystem, network or process "
        "isolation), an explicit opt-in (default: $GMTS_SANDBOX, else bwrap)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="discard earlier partial results and start over"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
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


def run(args: argparse.Namespace) -> int:
    from gmts.eval.report import format_table, load_summary

    if args.table:
        try:
            summaries = [load_summary(p) for p in args.table]
        except (OSError, ValueError, KeyError) as err:
            return _error(str(err))
        print(format_table(summaries))
        return 0

    from gmts.eval.benchmarks import (
        BUILTIN_PREFIX,
        FileFields,
        code_sandbox,
        get_spec,
        parse_benchmarks,
        verifier_override,
    )
    from gmts.eval.harness import EvalConfig, evaluate, partial_results_path, store_settings
    from gmts.eval.results_store import ResultsStore
    from gmts.models.loading import ModelPathError, resolve_model_path
    from gmts.rewards import SandboxUnavailableError

    # Validate everything cheap before loading a model.
    if not args.model:
        return _error("--model is required (a model folder, checkpoint or run folder)")
    try:
        model_path = resolve_model_path(args.model)
        if args.backend == "vllm":
            from gmts.eval.backends import check_whole_model

            check_whole_model(model_path, "the vllm backend")
        if args.verifier is not None and args.reward not in (None, args.verifier):
            return _error(
                f"--reward {args.reward} and --verifier {args.verifier} both say how your file "
                "is scored (--verifier scores every benchmark of the run); give one"
            )
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
    except (ModelPathError, SandboxUnavailableError) as err:
        return _error(str(err))
    except ValueError as err:
        return _error(str(err))
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        return _error(f"--data-dir {args.data_dir} is not a folder")
    dataset_names = [b for b in benchmarks if not b.startswith(BUILTIN_PREFIX)]
    if dataset_names:  # find every file now rather than after minutes of loading
        import warnings

        from gmts.data.benchmarks import read_benchmark

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # bad rows are reported once, by the real load
                for bench in dataset_names:
                    read_benchmark(get_spec(bench), data_dir=args.data_dir, limit=1)
        except (OSError, ValueError) as err:
            return _error(str(err))

    from gmts.eval.backends import check_benchmarks_fit

    try:  # prompt + budget must fit the model's context: checked before loading weights
        check_benchmarks_fit(
            model_path,
            benchmarks,
            max_new_tokens=args.max_new_tokens,
            data_dir=args.data_dir,
            limit=args.limit,
        )
    except (OSError, ValueError) as err:
        return _error(str(err))

    name = args.name or _default_name(args.model)
    out = Path(args.out) if args.out else Path(f"eval-{name}.json")
    if args.backend == "vllm":  # the checks the backend makes too, before any file is written
        import torch

        from gmts.sampling.vllm_engine import VLLMConfig, check_engine_can_start

        try:
            check_engine_can_start(
                VLLMConfig(), on_gpu=torch.cuda.is_available(), who="--backend vllm"
            )
        except ValueError as err:
            return _error(f"{err}; or use --backend hf")

    try:
        store = ResultsStore(
            partial_results_path(out),
            store_settings(str(Path(model_path).resolve()), args.backend, config),
            fresh=args.fresh,
        )
    except ValueError as err:  # other settings, or not a results file
        return _error(str(err))

    if args.threads is not None:
        if args.threads < 1:
            return _error(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)

    from gmts.eval.backends import BackendOptions, make_backend

    options = BackendOptions(
        model_path,
        device=args.device,
        dtype=args.dtype,
        batch_size=config.batch_size,
        seed=args.seed,
    )
    print(f"loading {model_path} ({args.backend} backend)", file=sys.stderr)
    backend = make_backend(args.backend, options)
    try:
        report = evaluate(
            backend,
            benchmarks,
            config,
            model_name=name,
            model_id=str(Path(model_path).resolve()),
            results_path=store,
            progress=not args.no_progress,
        )
    except (OSError, ValueError) as err:  # unreadable data files, reported by the loaders
        return _error(str(err))

    from gmts.eval.report import write_report

    write_report(report, out)
    print(report.table())
    print(f"per-question results: {out}", file=sys.stderr)
    return 0
