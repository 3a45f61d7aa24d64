"""The evaluation harness behind ``gmts eval``: sample, verify, score, resume.

For each benchmark the questions are cut, in file order, into chunks of
``max(1, batch_size // n)`` questions. Each chunk is one call of the sampler (the one sampling
protocol, :class:`gmts.sampling.sampler.Sampler`; ``gmts eval`` loads it with
:func:`gmts.eval.backends.make_backend`) with its own seed, derived from ``(seed, benchmark,
chunk index)``; so a chunk's completions do not depend on which other chunks ran in this
process, and a resumed run reproduces exactly what a one-shot run would have produced (same
hardware, same batch size). Each finished question is appended to the JSONL store
(:mod:`gmts.eval.results_store`) at once; a rerun skips the chunks whose questions are all
recorded.

Metrics: sampled benchmarks report average@n, the mean over questions of the mean reward of
the question's n samples (:func:`gmts.core.metrics.average_at_k`); greedy (code) benchmarks
report pass@1 with one greedy completion per question.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gmts._progress import Progress, count_forwards
from gmts.eval.backends import group_completions
from gmts.eval.benchmarks import (
    EvalBenchmark,
    FileFields,
    check_verifier,
    code_sandbox,
    get_spec,
    load_eval_benchmark,
    parse_benchmarks,
    verifier_override,
)
from gmts.eval.report import BenchmarkResult, EvalReport
from gmts.eval.results_store import QuestionRecord, ResultsStore
from gmts.rewards.sandbox import BACKENDS as SANDBOX_BACKENDS
from gmts.sampling.sampler import Sampler


@dataclass(frozen=True)
class EvalConfig:
    """Settings of one evaluation (the CLI flags of ``gmts eval``).

    Attributes:
        n: samples per question for sampled benchmarks (the paper: 16).
        temperature: sampling temperature (the paper: 1.0). Greedy benchmarks ignore n and
            temperature (one completion at temperature 0).
        max_new_tokens: generation budget; None = each benchmark's default.
        limit: evaluate only the first ``limit`` questions of each benchmark.
        seed: base seed of the per-chunk seeds.
        batch_size: sequences per sampler call (a chunk holds ``max(1, batch_size // n)``
            questions). Changing it changes which samples are drawn, not their distribution.
        data_dir: folder of the benchmark files (loader default when None).
        code_timeout: seconds per program for code benchmarks.
        sandbox: code benchmarks' sandbox, "bwrap" or "subprocess" (weaker: explicit opt-in);
            None = ``$GMTS_SANDBOX``, else "bwrap" (an error where bubblewrap does not work).
        file_fields: how a benchmark that is a user's file is read and scored.
        verifier: a reward of :mod:`gmts.rewards` that scores every benchmark in place of its
            own verifier (a user's file too, in place of ``file_fields.reward``); e.g. "math"
            (the last ``\\boxed{}``, else the last number) for a model that answers in prose.
            Not a reward that runs code, and a run with a code benchmark is refused (its tests
            decide). None = each benchmark's own verifier.
    """

    n: int = 16
    temperature: float = 1.0
    max_new_tokens: int | None = None
    limit: int | None = None
    seed: int = 0
    batch_size: int = 64
    data_dir: str | None = None
    code_timeout: float = 10.0
    sandbox: str | None = None
    file_fields: FileFields = field(default_factory=FileFields)
    verifier: str | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.code_timeout <= 0:
            raise ValueError(f"code_timeout must be > 0, got {self.code_timeout}")
        if self.sandbox not in (None, *SANDBOX_BACKENDS):
            raise ValueError(
                f"sandbox must be one of {SANDBOX_BACKENDS} or None, got {self.sandbox!r}"
            )
        if self.verifier is not None:
            check_verifier(self.verifier)


def derive_seed(seed: int, benchmark: str, chunk_index: int) -> int:
    """A 31-bit seed for one chunk, stable across processes and platforms."""
    digest = hashlib.sha256(f"{seed}/{benchmark}/{chunk_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def decoding_for(benchmark: str, config: EvalConfig) -> tuple[int, float, str]:
    """``(n, temperature, metric name)`` for a benchmark under ``config``."""
    spec = get_spec(benchmark)
    if spec.decoding == "greedy" or config.temperature == 0.0:
        return 1, 0.0, "pass@1"  # greedy: n identical samples would add nothing
    return config.n, config.temperature, f"average@{config.n}"


def store_settings(model_id: str, backend_name: str, config: EvalConfig) -> dict[str, Any]:
    """What must match for a results file to be resumed: everything that changes samples or
    the recorded rewards (the verifier override; how a user's file is read, prompted and
    scored). The last two appear only when set otherwise than the default, so stores written
    before they were recorded still resume."""
    settings: dict[str, Any] = {
        "model": model_id,
        "backend": backend_name,
        "n": config.n,
        "temperature": config.temperature,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "batch_size": config.batch_size,
    }
    if config.verifier is not None:
        settings["verifier"] = config.verifier
    if config.file_fields != FileFields():
        settings["file_fields"] = asdict(config.file_fields)
    return settings


def partial_results_path(out_path: str | os.PathLike[str]) -> Path:
    """The JSONL store next to a results JSON: ``results.json`` -> ``results.partial.jsonl``."""
    out = Path(out_path)
    return out.with_name(out.stem + ".partial.jsonl")


def evaluate_benchmark(
    sampler: Sampler,
    bench: EvalBenchmark,
    config: EvalConfig,
    store: ResultsStore | None = None,
    *,
    progress: bool = True,
) -> BenchmarkResult:
    """Generate (inside one ``sampler.session()``), verify and score every question of
    ``bench`` not yet in ``store``."""
    from gmts.core.metrics import average_at_k

    spec = bench.spec
    n, temperature, metric = decoding_for(spec.name, config)
    max_new_tokens = config.max_new_tokens or spec.max_new_tokens
    per_chunk = max(1, config.batch_size // n)
    items = bench.items
    done: dict[str, QuestionRecord] = {}
    if store is not None:
        for item in items:
            record = store.get(spec.name, item.id)
            if record is not None:
                done[item.id] = record

    bar = Progress(spec.display, len(items), "questions", initial=len(done), enabled=progress)
    with contextlib.closing(bar), sampler.session():
        for chunk_index, start in enumerate(range(0, len(items), per_chunk)):
            chunk = items[start : start + per_chunk]
            if all(item.id in done for item in chunk):
                continue
            # a sampler with a torch model (hf) runs one forward per sampled token and
            # generation chunk: the chunk's progress; others show its time
            rows = len(chunk) * n
            bar.stage("sampling", math.ceil(rows / config.batch_size) * max_new_tokens)
            with count_forwards(getattr(sampler, "model", None), bar.advance_stage):
                rollout = sampler.sample(
                    [item.prompt for item in chunk],
                    num_samples=n,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                    seed=derive_seed(config.seed, spec.name, chunk_index),
                )
            bar.end_stage()
            outputs = group_completions(rollout.completions, rollout.group_ids, len(chunk), n)
            new_records = []
            for item, completions in zip(chunk, outputs):
                if item.id in done:
                    continue
                scored = [bench.score(c, item) for c in completions]
                record = QuestionRecord(
                    benchmark=spec.name,
                    id=item.id,
                    question=item.question,
                    answer=item.answer,
                    completions=list(completions),
                    rewards=[float(r) for r, _ in scored],
                    extracted=[e for _, e in scored],
                )
                done[item.id] = record
                new_records.append(record)
            if store is not None:
                store.add(new_records)
            bar.update(len(new_records))

    import torch

    records = [done[item.id] for item in items]
    rewards = torch.tensor([r.rewards for r in records], dtype=torch.float64).reshape(-1, n)
    score = float(average_at_k(rewards)) if records else 0.0
    return BenchmarkResult(
        name=spec.name,
        display=spec.display,
        metric=metric,
        score=score,
        num_questions=len(records),
        samples_per_question=n,
        records=records,
        verifier_override=bench.verifier_override,
    )


def evaluate(
    sampler: Sampler,
    benchmarks: Sequence[str] | str,
    config: EvalConfig | None = None,
    *,
    model_name: str = "model",
    model_id: str | None = None,
    results_path: str | os.PathLike[str] | ResultsStore | None = None,
    fresh: bool = False,
    progress: bool = True,
) -> EvalReport:
    """Evaluate ``sampler`` on ``benchmarks`` and return the report (table + per question).

    Args:
        sampler: a :class:`gmts.sampling.sampler.Sampler` (``make_backend`` loads one; its
            tokenizer, or None, formats the prompts; its name is recorded as the backend).
        benchmarks: names (or one comma-separated string) of :func:`available_eval_benchmarks`.
        config: sampling settings; defaults to the paper's (n=16, temperature 1.0).
        model_name: the row label of the table.
        model_id: identifies the model in the resume file (default: ``model_name``).
        results_path: the JSONL store (a path, or a :class:`ResultsStore` opened with
            :func:`store_settings`); None = keep nothing on disk (no resume).
        fresh: discard an existing store at ``results_path``.
        progress: show each benchmark's progress on stderr (a bar on a terminal, with the
            sampling of the chunk in progress; a line in a log: :mod:`gmts._progress`).
    """
    config = config or EvalConfig()
    names = parse_benchmarks(
        list(benchmarks) if not isinstance(benchmarks, str) else benchmarks, config.file_fields
    )
    for name in names:  # a code benchmark under a verifier override fails before generating
        verifier_override(name, config.verifier)
    sandbox = code_sandbox(names, config.sandbox)  # fails before generating anything
    settings = store_settings(model_id or model_name, sampler.name, config)
    if isinstance(results_path, ResultsStore):
        store: ResultsStore | None = results_path
        if store.settings != ResultsStore.normalise(settings):
            raise ValueError("results_path: the store was opened with other settings")
    elif results_path is not None:
        store = ResultsStore(results_path, settings, fresh=fresh)
    else:
        store = None
    results = []
    for name in names:
        bench = load_eval_benchmark(
            name,
            tokenizer=sampler.tokenizer,
            data_dir=config.data_dir,
            limit=config.limit,
            code_timeout=config.code_timeout,
            sandbox=sandbox,
            verifier=config.verifier,
        )
        results.append(evaluate_benchmark(sampler, bench, config, store, progress=progress))
    settings = {**settings, **{k: v for k, v in asdict(config).items() if k not in settings}}
    settings["benchmarks"] = names
    settings["sandbox"] = sandbox  # the backend the code ran in (None: no code benchmark)
    return EvalReport(model=model_name, benchmarks=results, settings=settings)
