"""Item 4: whole-step throughput of the standalone trainer vs TRL's GRPOTrainer (CPU, tiny model).

Both trainers start from the same warm-started tiny model and train on the same embedded task
with the same batch (questions x samples per question), the same maximum completion length,
temperature 1.0, one optimizer step per rollout batch, no KL, the DAPO token-mean loss with
clip 0.2 / 0.28 and no dynamic sampling (TRL has none). Two pairs are measured:

- all tokens: ``selection.score=none`` vs TRL's default,
- ETS top 20%: ``selection.score=entropy`` vs TRL's ``top_entropy_quantile=0.2``.

The steps interleave: a TRL callback times each TRL step (``on_step_begin`` .. ``on_step_end``:
generation, rewards, loss, backward, optimizer step) and, right after it, runs and times one step
of our trainer, so load changes on the shared machine hit both alike. Throughput = generated
completion tokens per second of a whole step; the mean completion lengths are reported too,
because a policy that answers in fewer tokens does less work per step.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import TRL_ON_CPU, BenchOptions, goal, ratio, summarize_times
from tiny_setup import TASK, StepShape, train_config, warm_model_path

PAIRS = {"all tokens": ("none", 1.0), "ETS top 20%": ("entropy", 0.2)}
LR = 2e-4


def _trl_trainer(model_path: Path, out_dir: Path, shape: StepShape, steps: int, quantile: float):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gmts.embedded.tasks import get_task

    task = get_task(TASK)
    problems = task.sample(shape.questions * steps, random.Random(f"bench-trl/{TASK}"))
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [float(task.reward(c, a)) for c, a in zip(completions, answer)]

    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=shape.questions * shape.group_size,
        num_generations=shape.group_size,
        max_completion_length=task.max_new_tokens,
        max_steps=steps,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta2=0.99,
        max_grad_norm=1.0,
        temperature=1.0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        top_entropy_quantile=quantile,
        **TRL_ON_CPU,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def _measure_pair(
    model_path: Path, tmp: Path, shape: StepShape, score: str, quantile: float, steps: int
) -> dict[str, Any]:
    """Interleaved steps of TRL and of our trainer; the first step of each is a warm-up."""
    from transformers import TrainerCallback

    from gmts.train.trainer import Trainer

    ours = Trainer(
        train_config(
            model_path,
            tmp / f"ours-{score}",
            score=score,
            ratio=0.2,
            shape=shape,
            steps=steps,
            lr=LR,
            dynamic_sampling=False,
        )
    )
    record: dict[str, list[float]] = {
        "trl_step_s": [],
        "trl_tokens": [],
        "ours_step_s": [],
        "ours_tokens": [],
    }
    pending: dict[str, float] = {}

    class Interleave(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            pending["start"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            record["trl_step_s"].append(time.perf_counter() - pending["start"])
            metrics = ours.train_step(len(record["ours_step_s"]))
            record["ours_step_s"].append(metrics["time/step_s"])
            record["ours_tokens"].append(metrics["response/tokens"])

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
            if logs and "completions/mean_length" in logs:
                record["trl_tokens"].append(
                    logs["completions/mean_length"] * shape.questions * shape.group_size
                )

    trl = _trl_trainer(model_path, tmp / f"trl-{score}", shape, steps, quantile)
    trl.add_callback(Interleave())
    trl.train()
    ours.logger.close()
    n = min(len(record["trl_step_s"]), len(record["trl_tokens"]), len(record["ours_step_s"]))
    if n < 2:
        raise RuntimeError(f"too few steps recorded: {n}")
    out: dict[str, Any] = {}
    for side in ("trl", "ours"):
        times = record[f"{side}_step_s"][1:n]  # drop the warm-up step
        tokens = record[f"{side}_tokens"][1:n]
        per_step_tps = [k / t for k, t in zip(tokens, times)]
        out[side] = {
            "step": summarize_times(times),
            "tokens_per_step_mean": statistics.fmean(tokens),
            "mean_completion_length": statistics.fmean(tokens)
            / (shape.questions * shape.group_size),
            "tokens_per_s_median": statistics.median(per_step_tps),
        }
    out["throughput_vs_trl"] = ratio(
        out["ours"]["tokens_per_s_median"], out["trl"]["tokens_per_s_median"]
    )
    out["step_time_vs_trl"] = ratio(out["ours"]["step"]["median_s"], out["trl"]["step"]["median_s"])
    out["paired_throughput_vs_trl_median"] = statistics.median(
        (ko / to) / (kt / tt)
        for ko, to, kt, tt in zip(
            record["ours_tokens"][1:n],
            record["ours_step_s"][1:n],
            record["trl_tokens"][1:n],
            record["trl_step_s"][1:n],
        )
    )
    return out


def run(options: BenchOptions) -> dict[str, Any]:
    import torch

    torch.set_num_threads(options.threads)
    shape = StepShape(questions=4, group_size=4) if options.quick else StepShape()
    steps = 3 if options.quick else 1 + int(options.extra.get("throughput_repeats", 12))
    model_path = warm_model_path()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gmts-bench-throughput-") as tmp:
        for label, (score, quantile) in PAIRS.items():
            result = _measure_pair(model_path, Path(tmp), shape, score, quantile, steps)
            rows.append(
                {"setting": label, "score": score, "trl_top_entropy_quantile": quantile, **result}
            )
    goals = []
    if not options.quick:
        for row in rows:
            value = row["throughput_vs_trl"]
            goals.append(
                goal(
                    f"trainer tokens/s vs TRL GRPOTrainer ({row['setting']})",
                    ">= 1.0x",
                    f"{value:.2f}x (paired {row['paired_throughput_vs_trl_median']:.2f}x)",
                    value >= 1.0,
                )
            )
    return {
        "settings": {
            "model": "embedded warm start (GPT-2, 2 layers, width 128)",
            "task": TASK,
            "questions": shape.questions,
            "group_size": shape.group_size,
            "timed_steps": steps - 1,
            "lr": LR,
        },
        "rows": rows,
        "goals": goals,
    }
