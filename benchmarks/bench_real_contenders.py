"""The contenders of benchmarks/bench_throughput_real.py, and their steps interleaved in one
process: TRL's ``GRPOTrainer`` mirroring the gmts config (its ``GRPOConfig``, its dataset of
the questions gmts draws, in gmts's order), the gmts trainers (:data:`CONTENDERS`: today's path
and issue 34's old one, on each engine), and :class:`InterleavedSteps`, which runs each gmts
trainer's step around TRL's, in :func:`rotation`'s order, and records every figure per step.

The old path (``hf_old``, ``vllm_old``) is the trainer before issue 34: every row of a
micro-batch runs its whole prompt and response padded to the longest
(``model.forward_layout=padded``), and the hf sampler keeps every row in its batch until the
last stops (``rollout.drop_finished_rows=false``; a vllm engine batches its own rows).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, NamedTuple

from bench_common import TRL_ON_CPU, proc_status_kib, reset_peak_rss
from bench_rollout_real import plain_vllm_tokens

CONTENDERS = ("trl", "hf", "hf_old", "vllm", "vllm_old")
"""The steps of a round; ``vllm_plain`` follows ``vllm`` at once."""
ENGINE = {"hf": "hf", "hf_old": "hf", "vllm": "vllm", "vllm_old": "vllm"}
"""Each gmts contender's ``rollout.engine``."""
OLD_PATH = {
    "hf_old": ("model.forward_layout=padded", "rollout.drop_finished_rows=false"),
    "vllm_old": ("model.forward_layout=padded",),
}
"""The overrides that make a contender run the path before issue 34 (after every other one)."""
NEW_VS_OLD = {"hf": "hf_old", "vllm": "vllm_old"}
VLLM_CONTENDERS = ("vllm", "vllm_old", "vllm_plain")


def rotation(step: int) -> tuple[str, ...]:
    """The contenders' order at ``step``: :data:`CONTENDERS` rotated by ``step``."""
    k = step % len(CONTENDERS)
    return CONTENDERS[k:] + CONTENDERS[:k]


def trl_arguments(cfg: Any, out_dir: Path, steps: int) -> Any:
    """TRL's ``GRPOConfig`` mirroring gmts's ``cfg`` (see bench_throughput_real's docstring)."""
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
    """The contenders this interpreter cannot run, with the reason (vLLM's without vllm)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {name: "vllm is not installed in this interpreter" for name in VLLM_CONTENDERS}
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
    """The benchmark's trainers, built in this order: gmts's hf trainers, TRL's (before vLLM's
    engines start), gmts's vllm trainers; the seconds each took to build, and per step the
    prompt token ids every side must sample from (gmts's hf trainer's)."""

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
    """The trainers of ``cfgs`` (contender -> gmts config; ``hf`` among them) and TRL's, timed
    one by one; every gmts trainer's questions checked equal to the hf trainer's."""
    # imported before any timing: a build time is the build's, not its imports'
    from datasets import Dataset  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401
    from trl import GRPOTrainer  # noqa: F401

    from gmts.train.trainer import Trainer

    started: dict[str, float] = {}
    trainers: dict[str, Any] = {}

    def build(name: str) -> None:
        t = time.perf_counter()
        trainers[name] = Trainer(cfgs[name])
        started[name] = time.perf_counter() - t

    for name in (n for n in CONTENDERS if ENGINE.get(n) == "hf" and n in cfgs):
        build(name)
    expected_ids = step_prompt_ids(trainers["hf"], steps)
    t = time.perf_counter()
    trl = trl_trainer(trainers["hf"], work, steps)
    started["trl"] = time.perf_counter() - t
    for name in (n for n in CONTENDERS if ENGINE.get(n) == "vllm" and n in cfgs):
        build(name)
    for name, trainer in trainers.items():  # the same seed and data: the same questions
        if step_prompt_ids(trainer, steps) != expected_ids:
            raise RuntimeError(f"the {name} trainer draws other questions than the hf one")
    return Contenders(trainers, trl, started, expected_ids)


class InterleavedSteps:
    """Per TRL step, each gmts trainer's step with the same index, in :func:`rotation`'s order
    (``vllm_plain`` right after ``vllm``); every figure per step into :attr:`rows`.

    The vllm trainers' own sampling calls and TRL's ``_generate_single_turn`` are wrapped to be
    timed and to keep the prompt rows they sampled from, which are checked against gmts's."""

    def __init__(self, contenders: Contenders) -> None:
        self.contenders = contenders
        self.group = contenders.hf.cfg.rollout.group_size
        self.rows: dict[str, list[dict[str, Any]]] = {
            name: [] for name in (*CONTENDERS, "vllm_plain")
        }
        self.sampled: dict[str, dict[str, Any]] = {}  # each vllm trainer's last sampling call
        self.trl_generation: dict[str, Any] = {}  # TRL's last generation
        self.memory = PeakRSS()
        self.pending: dict[str, Any] = {}  # the TRL step under way
        self.orders: list[list[str]] = []
        for name, trainer in contenders.trainers.items():
            if ENGINE[name] == "vllm":
                self._time_vllm_sampling(name, trainer.rollout_engine.sampler.engine)
        self._time_trl_generation(contenders.trl)

    def _time_vllm_sampling(self, name: str, engine: Any) -> None:
        """Wrap the ``name`` trainer's own ``engine.sample``: timed, its rows kept."""
        if engine.sleeps:
            raise RuntimeError(
                f"the {name} contender's engine sleeps between steps (GPU): CPU only"
            )
        sample = engine.sample
        sampled = self.sampled.setdefault(name, {})

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
            "positions_computed": metrics["update/positions_computed"],
            "positions_real": metrics["update/positions_real"],
            "reward_mean": metrics["reward/mean"],
            **self.memory.stop(),
        }
        if ENGINE[name] == "vllm":
            row["weight_sync_s"] = metrics["time/weight_sync_s"]
            row["engine_sample_s"] = self.sampled[name]["s"]
            self.check_prompts(f"the {name} trainer", step, self.sampled[name]["rows"])
        self.rows[name].append(row)
        if name == "vllm":
            self.run_plain(step)

    def run_plain(self, step: int) -> None:
        """Plain ``LLM.generate`` on the vllm trainer's own engine, the step's rows again."""
        engine = self.contenders.trainers["vllm"].rollout_engine.sampler.engine
        sampled = self.sampled["vllm"]
        engine.llm.reset_prefix_cache()
        self.memory.start()
        start = time.perf_counter()
        tokens = plain_vllm_tokens(
            engine.llm,
            sampled["rows"],
            max_tokens=sampled["max_new_tokens"],
            temperature=sampled["temperature"],
            stop_ids=list(sampled["stop_ids"]),
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


def resolved_model_path(cfg: Any) -> str:
    """``model.path`` of ``cfg`` as a folder (a named model converted once into the cache)."""
    from gmts.models.loading import resolve_model_path

    return resolve_model_path(cfg.model.path)
