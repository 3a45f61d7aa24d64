"""Whole-step throughput on a real model (issue 27, items 4 and 1): ``gmts train`` with both
rollout engines vs TRL's GRPOTrainer, and the trainer's vLLM rollout vs plain vLLM.

Four contenders, one process (``--threads`` torch threads; vLLM's engine runs in it too, so
every contender shares its thread pool):

- ``trl``: TRL's ``GRPOTrainer`` (its ``transformers`` ``generate`` sampler);
- ``hf``: a gmts :class:`gmts.train.trainer.Trainer` with ``rollout.engine=hf``;
- ``vllm``: a gmts Trainer with ``rollout.engine=vllm`` (its colocated in-process vLLM engine);
- ``vllm_plain``: right after the ``vllm`` trainer's step, ``LLM.generate`` on that trainer's
  own ``vllm.LLM``, one plain request per row of the step's prompt token ids (the same rows,
  group size, temperature, budget and stop ids; no seeds, no log-probs; prefix cache reset
  first, as the trainer's weight sync resets it).

The gmts side is ``configs/smollm2-135m-instruct/dapo-ets.yaml`` (read by gmts's own loader,
``base:`` chain included) with held-out evaluation and the final save off. TRL's
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
order of the three (trl, hf, vllm + vllm_plain) rotating from step to step, so load changes on a
shared machine hit all alike. Recorded per contender per step: step time, completion tokens,
tokens/s, gmts's ``time/rollout_s``, ``time/update_s`` and ``time/weight_sync_s``, TRL's
generation time (its ``_generate_single_turn``, timed here: TRL logs it only to wandb/mlflow),
the vllm engine's own sampling call, and the process's peak RSS during the step (the kernel's
``VmHWM`` high-water mark, reset before each step: it is the whole process's, every contender's
model resident). Ratios are per step (paired), then median and min-max; the first step (a
warm-up) is dropped. The JSON record holds the machine, the load (``uptime``) before and after,
the command and the commit. vLLM contenders are skipped (the skip recorded) where vllm is not
installed.

The full run (SmolLM2-135M-Instruct, 3 questions x 8 answers, 64 tokens; 1 warm-up + 3 timed
steps, about 4 x (70 + 65 + 70 + 10) s + start-up: ~15 minutes on the 2-core machine):

    GMTS_CACHE=/work/.gmts-cache GMTS_SHARED_DATA=/work/shared/data HF_HUB_OFFLINE=1 \\
      .venv-vllm/bin/python benchmarks/bench_throughput_real.py --steps 4
    python benchmarks/bench_throughput_real.py --quick   # random tiny llama, under a minute

``--hf-set KEY=VALUE`` adds one to the hf trainer only (its sampler's speed settings,
``rollout.draw`` and ``rollout.prepack_weights``, which the vllm engine refuses).
``--set KEY=VALUE`` adds a gmts override (e.g. ``logging.overlap_metrics=false``: the shipped
config logs the GMTS-vs-ETS overlap, which TRL does not compute); a setting TRL cannot mirror
stops the run before any model loads.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench_common import (
    DEFAULT_RESULTS_DIR,
    REPO_ROOT,
    TRL_ON_CPU,
    child_env,
    git_commit,
    goal,
    machine_description,
    proc_status_kib,
    reset_peak_rss,
    standalone_record,
    write_result,
)
from bench_rollout_real import plain_vllm_tokens, save_quick_model

DEFAULT_CONFIG = REPO_ROOT / "configs" / "smollm2-135m-instruct" / "dapo-ets.yaml"
CONTENDERS = ("trl", "hf", "vllm")
"""The three steps of a round; ``vllm_plain`` follows ``vllm`` at once."""
QUICK_QUESTIONS = 64
"""Questions of the quick mode's dataset file (``a+b=``, from addition-2digit's train split)."""


def rotation(step: int) -> tuple[str, ...]:
    """The contenders' order at ``step``: (trl, hf, vllm) rotated by ``step``."""
    k = step % len(CONTENDERS)
    return CONTENDERS[k:] + CONTENDERS[:k]


# --------------------------------------------------------------------------------------
# the two sides' configurations


def gmts_overrides(args: argparse.Namespace, engine: str, run_dir: Path) -> list[str]:
    """``section.field=value`` overrides of ``args.config`` for the gmts trainer on ``engine``:
    no held-out evaluation, no final save, the benchmark's steps, threads and run folder."""
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
    return out + list(args.hf_set or []) if engine == "hf" else out


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


def trl_arguments(cfg: Any, out_dir: Path, steps: int) -> Any:
    """TRL's ``GRPOConfig`` mirroring gmts's ``cfg`` (see the module docstring)."""
    from trl import GRPOConfig

    r, o, obj = cfg.rollout, cfg.optim, cfg.objective
    return GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=r.questions_per_batch * r.group_size,
        num_generations=r.group_size,
        max_completion_length=r.max_response_length,
        max_steps=steps,
        temperature=r.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=o.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=o.betas[0],
        adam_beta2=o.betas[1],
        adam_epsilon=o.eps,
        weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip,
        beta=obj.kl_coef,
        loss_type="dapo",
        epsilon=obj.clip_low,
        epsilon_high=obj.clip_high,
        top_entropy_quantile=cfg.selection.ratio if cfg.selection.score == "entropy" else 1.0,
        scale_rewards="group",
        **TRL_ON_CPU,
        disable_tqdm=True,
        seed=cfg.seed,
    )


def trl_prompts(trainer: Any, steps: int) -> list[dict[str, Any]]:
    """TRL's dataset rows: the questions gmts's ``trainer`` draws in its first ``steps`` steps,
    in its order (a copy of its source), as TRL prompts: conversational (the template's
    messages) when gmts rendered them with a chat template, else the question text."""
    from gmts.data.prompts import format_prompt, get_template, has_chat_template, resolve_template
    from gmts.train.sources import load_examples, training_split

    cfg = trainer.cfg
    source = copy.deepcopy(trainer.source)
    drawn = source.next(steps * cfg.rollout.questions_per_batch)
    examples = load_examples(
        cfg.data.dataset,
        split=training_split(cfg.data.dataset, cfg.data.split),
        question_field=cfg.data.question_field,
        answer_field=cfg.data.answer_field,
    )
    template = cfg.data.template
    if template is not None:  # "auto": the template it means for this tokenizer
        template = resolve_template(template, trainer.tokenizer)
    chat = template is not None and has_chat_template(trainer.tokenizer)
    rendered = {
        (q if template is None else format_prompt(trainer.tokenizer, q, template=template)): q
        for q, _ in examples
    }
    rows = []
    for problem in drawn:
        question = rendered[problem.prompt]
        prompt = get_template(template).messages(question) if chat else question
        rows.append({"prompt": prompt, "answer": problem.answer})
    return rows


def step_prompt_ids(trainer: Any, steps: int) -> list[list[list[int]]]:
    """Per step, the token ids of the prompts gmts's ``trainer`` samples from (a copy of its
    source, encoded as its samplers encode them: no special tokens added)."""
    source = copy.deepcopy(trainer.source)
    q = trainer.cfg.rollout.questions_per_batch
    out = []
    for _ in range(steps):
        prompts = [p.prompt for p in source.next(q)]
        out.append(trainer.tokenizer(prompts, add_special_tokens=False)["input_ids"])
    return out


# --------------------------------------------------------------------------------------
# the measurement (the child process)


class PeakRSS:
    """The process's RSS high-water mark (``VmHWM``) over a span, reset at its start."""

    def start(self) -> None:
        self.reset = reset_peak_rss()
        self.before_kib = proc_status_kib("VmRSS")

    def stop(self) -> dict[str, Any]:
        return {
            "peak_rss_mib": (proc_status_kib("VmHWM") or 0) / 1024,
            "rss_before_mib": (self.before_kib or 0) / 1024,
            "peak_reset": self.reset,
        }


def skipped_contenders() -> dict[str, str]:
    """The contenders this interpreter cannot run, with the reason (vLLM's two without vllm)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {
            name: "vllm is not installed in this interpreter" for name in ("vllm", "vllm_plain")
        }
    return {}


def trl_trainer(hf: Any, work: Path, steps: int) -> Any:
    """TRL's ``GRPOTrainer`` mirroring the gmts ``hf`` trainer: its model (float32), its
    reward function, its questions in its order (see the module docstring)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    def math_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(hf.parts.data.reward_fn(text, a)) for text, a in zip(texts, answer)]

    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(
            resolved_model_path(hf.cfg), dtype=torch.float32
        ),
        reward_funcs=math_reward,
        args=trl_arguments(hf.cfg, work / "trl", steps),
        train_dataset=Dataset.from_list(trl_prompts(hf, steps)),
        processing_class=copy.deepcopy(hf.tokenizer),  # TRL may set its padding side
    )


class Contenders(NamedTuple):
    """The benchmark's trainers, built in this order: gmts's hf trainer, TRL's (before vLLM's
    engine starts), gmts's vllm trainer; the seconds each took to build, and per step the
    prompt token ids every side must sample from (gmts's)."""

    trainers: dict[str, Any]
    trl: Any
    started: dict[str, float]
    expected_ids: list[list[list[int]]]

    @property
    def hf(self) -> Any:
        return self.trainers["hf"]

    def close(self) -> None:
        for trainer in self.trainers.values():
            trainer.logger.close()
            trainer.close()


def build_contenders(cfgs: dict[str, Any], work: Path, steps: int) -> Contenders:
    """The trainers of ``cfgs`` (engine -> gmts config) and TRL's, timed one by one."""
    # imported before any timing: a build time is the build's, not its imports'
    from datasets import Dataset  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401
    from trl import GRPOTrainer  # noqa: F401

    from gmts.train.trainer import Trainer

    started: dict[str, float] = {}
    t = time.perf_counter()
    trainers = {"hf": Trainer(cfgs["hf"])}
    started["hf"] = time.perf_counter() - t
    expected_ids = step_prompt_ids(trainers["hf"], steps)
    t = time.perf_counter()
    trl = trl_trainer(trainers["hf"], work, steps)
    started["trl"] = time.perf_counter() - t
    if "vllm" in cfgs:
        t = time.perf_counter()
        trainers["vllm"] = Trainer(cfgs["vllm"])
        started["vllm"] = time.perf_counter() - t
    return Contenders(trainers, trl, started, expected_ids)


class InterleavedSteps:
    """Per TRL step, each gmts trainer's step with the same index, in :func:`rotation`'s order
    (``vllm_plain`` right after ``vllm``); every figure per step into :attr:`rows`.

    The vllm trainer's own sampling call and TRL's ``_generate_single_turn`` are wrapped to be
    timed and to keep the prompt rows they sampled from, which are checked against gmts's."""

    def __init__(self, contenders: Contenders) -> None:
        self.contenders = contenders
        self.group = contenders.hf.cfg.rollout.group_size
        self.rows: dict[str, list[dict[str, Any]]] = {
            name: [] for name in (*CONTENDERS, "vllm_plain")
        }
        self.sampled: dict[str, Any] = {}  # the vllm trainer's last sampling call
        self.trl_generation: dict[str, Any] = {}  # TRL's last generation
        self.memory = PeakRSS()
        self.pending: dict[str, Any] = {}  # the TRL step under way
        self.orders: list[list[str]] = []
        if "vllm" in contenders.trainers:
            self._time_vllm_sampling(contenders.trainers["vllm"].rollout_engine.sampler.engine)
        self._time_trl_generation(contenders.trl)

    def _time_vllm_sampling(self, engine: Any) -> None:
        """Wrap the vllm trainer's own ``engine.sample``: timed, its rows kept."""
        if engine.sleeps:
            raise RuntimeError("the vllm contender's engine sleeps between steps (GPU): CPU only")
        sample, sampled = engine.sample, self.sampled

        def timed_sample(prompts: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            out = sample(prompts, **kw)
            sampled.update(rows=[list(p) for p in prompts], s=time.perf_counter() - start, **kw)
            return out

        engine.sample = timed_sample  # the trainer's own call, timed and its rows kept

    def _time_trl_generation(self, trl: Any) -> None:
        """Wrap TRL's ``_generate_single_turn``: timed, its tokens and prompt ids kept."""
        generate, trl_generation = trl._generate_single_turn, self.trl_generation

        def timed_generate(prompt_ids: Any, *a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            out = generate(prompt_ids, *a, **kw)
            trl_generation.update(
                s=time.perf_counter() - start,
                tokens=sum(len(c) for c in out[0]),
                prompt_ids=[[int(i) for i in p] for p in prompt_ids],
            )
            return out

        trl._generate_single_turn = timed_generate

    def check_prompts(self, name: str, step: int, ids: list[list[int]]) -> None:
        """``ids``: the step's rows (each question's G answers consecutive)."""
        unique = [ids[i] for i in range(0, len(ids), self.group)]
        if unique != self.contenders.expected_ids[step]:
            raise RuntimeError(f"step {step}: {name}'s prompt token ids differ from gmts's")

    def run_gmts(self, name: str, step: int) -> None:
        """One step of gmts's ``name`` trainer (and plain vLLM after the vllm one)."""
        self.memory.start()
        metrics = self.contenders.trainers[name].train_step(step)
        row = {
            "step": step,
            "step_s": metrics["time/step_s"],
            "tokens": metrics["response/tokens"],
            "rollout_s": metrics["time/rollout_s"],
            "update_s": metrics["time/update_s"],
            "reward_mean": metrics["reward/mean"],
            **self.memory.stop(),
        }
        if name == "vllm":
            row["weight_sync_s"] = metrics["time/weight_sync_s"]
            row["engine_sample_s"] = self.sampled["s"]
            self.check_prompts("the vllm trainer", step, self.sampled["rows"])
        self.rows[name].append(row)
        if name == "vllm":
            self.run_plain(step)

    def run_plain(self, step: int) -> None:
        """Plain ``LLM.generate`` on the vllm trainer's own engine, the step's rows again."""
        engine = self.contenders.trainers["vllm"].rollout_engine.sampler.engine
        engine.llm.reset_prefix_cache()
        self.memory.start()
        start = time.perf_counter()
        tokens = plain_vllm_tokens(
            engine.llm,
            self.sampled["rows"],
            max_tokens=self.sampled["max_new_tokens"],
            temperature=self.sampled["temperature"],
            stop_ids=list(self.sampled["stop_ids"]),
        )
        self.rows["vllm_plain"].append(
            {
                "step": step,
                "step_s": time.perf_counter() - start,
                "tokens": tokens,
                **self.memory.stop(),
            }
        )

    def trl_step_begins(self, step: int) -> None:
        """The gmts steps before TRL's in this step's order, then TRL's timing starts."""
        order = [n for n in rotation(step) if n == "trl" or n in self.contenders.trainers]
        self.pending.update(step=step, after=order[order.index("trl") + 1 :])
        self.orders.append(order)
        for name in order[: order.index("trl")]:
            self.run_gmts(name, step)
        self.memory.start()
        self.pending["start"] = time.perf_counter()

    def trl_step_ended(self) -> None:
        """TRL's step recorded, then the gmts steps after it in this step's order."""
        step_s = time.perf_counter() - self.pending["start"]
        step = self.pending["step"]
        self.check_prompts("TRL", step, self.trl_generation["prompt_ids"])
        self.rows["trl"].append(
            {
                "step": step,
                "step_s": step_s,
                "tokens": self.trl_generation["tokens"],
                "generate_s": self.trl_generation["s"],
                **self.memory.stop(),
            }
        )
        for name in self.pending["after"]:
            self.run_gmts(name, step)

    def trl_logged(self, logs: dict[str, Any] | None) -> None:
        """TRL's own figure of the step, kept beside ours."""
        if logs and "step_time" in logs and self.rows["trl"]:
            self.rows["trl"][-1]["trl_logged_step_time_s"] = float(logs["step_time"])


def interleaving_callback(steps: InterleavedSteps) -> Any:
    """A TRL callback that runs ``steps``' gmts steps around each TRL step."""
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            steps.trl_step_begins(state.global_step)

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            steps.trl_step_ended()

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            steps.trl_logged(logs)

    return Interleave()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Build the three trainers (TRL's before vLLM's engine starts), run ``args.steps`` TRL
    steps with the gmts steps interleaved; every figure per step."""
    import torch

    from gmts.train.config import load_config

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    skipped = skipped_contenders()
    engines = ["hf"] if skipped else ["hf", "vllm"]
    cfgs = {
        e: load_config(args.config, gmts_overrides(args, e, work / f"gmts-{e}")) for e in engines
    }
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
        "gmts_config": gmts_config_record(args, contenders.hf, work, engines),
    }


def gmts_config_record(
    args: argparse.Namespace, hf: Any, work: Path, engines: list[str]
) -> dict[str, Any]:
    """What the record says of the gmts side's settings (the hf trainer's)."""
    return {
        "model": hf.cfg.model.path,
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
        "overrides": {e: gmts_overrides(args, e, work / f"gmts-{e}") for e in engines},
    }


def resolved_model_path(cfg: Any) -> str:
    """``model.path`` of ``cfg`` as a folder (a named model converted once into the cache)."""
    from gmts.models.loading import resolve_model_path

    return resolve_model_path(cfg.model.path)


# --------------------------------------------------------------------------------------
# the summary


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


OPTIONAL_TIMES = (
    "rollout_s",
    "update_s",
    "weight_sync_s",
    "engine_sample_s",
    "generate_s",
    "trl_logged_step_time_s",
)
"""The per-step times some contenders have (gmts's phases, the engine's call, TRL's)."""


def summarize(child: dict[str, Any]) -> dict[str, Any]:
    """Per contender: medians and min-max of the timed steps (the first dropped); per pair:
    the per-step ratio's median and min-max; the goals."""
    timed = {name: steps[1:] for name, steps in child["rows"].items()}
    if any(not steps for steps in timed.values()):
        raise RuntimeError("too few steps: the first is a warm-up, give --steps 2 or more")
    out: dict[str, Any] = {"contenders": {}, "ratios": {}}
    for name, steps in timed.items():
        row: dict[str, Any] = {
            "timed_steps": len(steps),
            "step_s": _spread([s["step_s"] for s in steps]),
            "tokens": _spread([s["tokens"] for s in steps]),
            "tokens_per_s": _spread([s["tokens"] / s["step_s"] for s in steps]),
            "peak_rss_mib": _spread([s["peak_rss_mib"] for s in steps]),
        }
        for key in OPTIONAL_TIMES:
            if all(key in s for s in steps):
                row[key] = _spread([s[key] for s in steps])
        out["contenders"][name] = row

    def paired(label: str, num: str, den: str, rate_num: Any, rate_den: Any) -> None:
        if num in timed and den in timed:
            out["ratios"][label] = _spread(
                [rate_num(a) / rate_den(b) for a, b in zip(timed[num], timed[den])]
            )

    def per_step(s: dict[str, Any]) -> float:
        return s["tokens"] / s["step_s"]

    paired("hf_vs_trl_tokens_per_s", "hf", "trl", per_step, per_step)
    paired("vllm_vs_trl_tokens_per_s", "vllm", "trl", per_step, per_step)
    for name in ("hf", "vllm"):
        paired(
            f"{name}_vs_trl_step_time", name, "trl", lambda s: s["step_s"], lambda s: s["step_s"]
        )
    paired(
        "trainer_rollout_vs_plain_vllm",
        "vllm",
        "vllm_plain",
        lambda s: s["tokens"] / s["rollout_s"],
        per_step,
    )
    paired(
        "trainer_rollout_without_sync_vs_plain_vllm",
        "vllm",
        "vllm_plain",
        lambda s: s["tokens"] / (s["rollout_s"] - s["weight_sync_s"]),
        per_step,
    )
    paired(
        "engine_sample_vs_plain_vllm",
        "vllm",
        "vllm_plain",
        lambda s: s["tokens"] / s["engine_sample_s"],
        per_step,
    )
    out["goals"] = goals(out["ratios"], quick=child.get("quick", False))
    return out


GOALS = (
    ("vllm_vs_trl_tokens_per_s", "gmts train (rollout.engine=vllm) tokens/s vs TRL", 1.5),
    ("hf_vs_trl_tokens_per_s", "gmts train (rollout.engine=hf) tokens/s vs TRL", 1.0),
    (
        "trainer_rollout_vs_plain_vllm",
        "the trainer's vllm rollout (time/rollout_s: weight sync and rewards in) vs plain vLLM",
        0.9,
    ),
)


def goals(ratios: dict[str, Any], *, quick: bool) -> list[dict[str, Any]]:
    """Issue 27's goals on the paired ratios' medians (``met`` None: not measured, or quick)."""
    out = []
    for key, name, target in GOALS:
        r = ratios.get(key)
        if r is None:
            out.append(goal(name, f">= {target}x", "not measured", None))
            continue
        measured = f"{r['median']:.2f}x (per step {r['min']:.2f}-{r['max']:.2f}x)"
        out.append(goal(name, f">= {target}x", measured, None if quick else r["median"] >= target))
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
        "settings": {"steps": args.steps, "threads": args.threads, "set": args.set or []},
        "notes": notes(args.quick),
        **summarize(child),
        "raw": child,
    }
    path = write_result(args.out, "throughput_real", record)
    for name, row in record["contenders"].items():
        print(f"{name}: tokens/s {row['tokens_per_s']['median']:.1f}")
    for label, r in record["ratios"].items():
        print(f"{label}: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
