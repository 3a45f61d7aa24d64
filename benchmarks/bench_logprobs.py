"""Item 2: per-token log-probs + entropy over a large vocabulary, forward + backward.

Shapes (default): N = 4096 tokens, V = 151,936, H = 1536 (Qwen2.5-1.5B's LM head). Variants:
- ``naive``: full logits = hidden @ W.T, ``log_softmax`` over V, gather the label log-prob,
  entropy = -(p * log p).sum under no_grad (what most RL code writes),
- ``chunked``: full logits, then ``gmts.token_logprobs_and_entropy`` (chunked over tokens),
- ``from_hidden``: ``gmts.token_logprobs_and_entropy_from_hidden`` (never builds (N, V) logits).

All variants back-propagate ``(logprobs * weights).sum()`` into the hidden states and the LM-head
weight (gradients flow through the log-probs only, as the core's contract says).

Peak memory: each variant runs in its own process. After the inputs and a small warm-up exist,
the process resets its kernel high-water mark (``/proc/self/clear_refs`` <- 5), reads VmRSS as
the baseline, runs one forward + backward and reads VmHWM. "Peak beyond parameters and their
gradients" = VmHWM - baseline - bytes(W.grad) - bytes(hidden.grad): the baseline already holds
W and hidden, and the two gradients are what any variant must produce. Large tensors are
mmap-backed by glibc, so RSS falls when they are freed and the HWM is a true peak.
On CUDA (``--device cuda``) the same quantity is read from the caching allocator instead:
``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus the memory
allocated before the step and the two gradients.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("naive", "chunked", "from_hidden")


# --------------------------------------------------------------------------------------
# the measured functions (run inside the worker process)


def naive_logprobs_and_entropy(hidden, weight, labels):
    """Full (N, V) logits and log-softmax; returns (logprobs (N,), entropy (N,))."""
    import torch

    logits = hidden @ weight.T  # (N, V)
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    del logits
    logprobs = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (N,)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)  # (N,)
    return logprobs, entropy


def chunked_logprobs_and_entropy(hidden, weight, labels):
    from bench_common import core_api

    token_logprobs_and_entropy = core_api("token_logprobs_and_entropy")

    logits = hidden @ weight.T  # (N, V)
    return token_logprobs_and_entropy(logits, labels)


def from_hidden_logprobs_and_entropy(hidden, weight, labels):
    from bench_common import core_api

    token_logprobs_and_entropy_from_hidden = core_api("token_logprobs_and_entropy_from_hidden")

    return token_logprobs_and_entropy_from_hidden(hidden, weight, labels)


FUNCTIONS = {
    "naive": naive_logprobs_and_entropy,
    "chunked": chunked_logprobs_and_entropy,
    "from_hidden": from_hidden_logprobs_and_entropy,
}


def worker(
    variant: str, n: int, v: int, h: int, repeats: int, threads: int, device: str = "cpu"
) -> dict[str, Any]:
    """Measure one variant in this process: peak memory of the first call, median time."""
    import torch
    from bench_common import proc_status_kib, reset_peak_rss, synchronizer

    torch.set_num_threads(threads)
    fn = FUNCTIONS[variant]
    sync = synchronizer(device)
    gen = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, h, generator=gen) * 0.5).to(device).requires_grad_(True)  # (N, H)
    weight = (torch.randn(v, h, generator=gen) * 0.02).to(device).requires_grad_(True)  # (V, H)
    labels = torch.randint(0, v, (n,), generator=gen).to(device)  # (N,)
    weights = torch.randn(n, generator=gen).to(device)  # (N,) stands in for -omega / count

    # Warm-up on a small slice: loads kernels and allocator arenas outside the measurement.
    small_w = weight[: min(v, 1024)].detach().clone().requires_grad_(True)
    lp, _ = fn(hidden[:16].detach().clone().requires_grad_(True), small_w, labels[:16] % 1024)
    lp.sum().backward()
    del lp, small_w

    def step() -> tuple[float, float, float]:
        hidden.grad = None
        weight.grad = None
        logprobs, entropy = fn(hidden, weight, labels)
        (logprobs * weights).sum().backward()
        return (
            float(logprobs.detach().sum()),
            float(entropy.detach().sum()),
            float(weight.grad.norm()),
        )

    on_cuda = device != "cpu"
    sync()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        method = "torch.cuda.max_memory_allocated"
    else:
        clear_ok = reset_peak_rss()
        baseline_kib = proc_status_kib("VmRSS") if clear_ok else proc_status_kib("VmHWM")
        baseline = None if baseline_kib is None else baseline_kib * 1024
        method = "VmHWM reset" if clear_ok else "VmHWM lifetime delta (over-counts)"
    start = time.perf_counter()
    checks = step()  # ends with .item()-like reads: synchronised
    first_s = time.perf_counter() - start
    if on_cuda:
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak_kib = proc_status_kib("VmHWM")
        peak = None if peak_kib is None else peak_kib * 1024
    grad_bytes = weight.numel() * 4 + hidden.numel() * 4
    times = [first_s]
    for _ in range(repeats - 1):
        sync()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak_beyond = None
    if peak is not None and baseline is not None:
        peak_beyond = peak - baseline - grad_bytes
    return {
        "variant": variant,
        "device": device,
        "times_s": times,
        "peak_beyond_params_grads_bytes": peak_beyond,
        "peak_method": method,
        "baseline_rss_bytes": baseline or 0,
        "grad_bytes": grad_bytes,
        "checks": {"logprob_sum": checks[0], "entropy_sum": checks[1], "grad_w_norm": checks[2]},
    }


# --------------------------------------------------------------------------------------
# the driver (run.py calls run())


def _start(
    variant: str, n: int, v: int, h: int, repeats: int, threads: int, device: str
) -> subprocess.Popen:
    from bench_common import python_env

    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        variant,
        f"--n={n}",
        f"--v={v}",
        f"--h={h}",
        f"--repeats={repeats}",
        f"--threads={threads}",
        f"--device={device}",
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env()
    )


def _finish(variant: str, proc: subprocess.Popen) -> dict[str, Any]:
    from bench_common import summarize_times

    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-5:]
        return {"variant": variant, "ok": False, "error": " | ".join(tail)}
    result = json.loads(stdout.strip().splitlines()[-1])
    result["ok"] = True
    result.update(summarize_times(result.pop("times_s")))
    return result


def memory_need(variant: str, n: int, v: int, h: int) -> int:
    """Rough peak bytes of one worker: parameters, gradients and the (N, V) float32 blocks.

    naive holds about three (N, V) tensors at once (log-softmax, its gradient and the gradient
    of the logits), chunked two (the logits and their gradient), from_hidden none.
    """
    blocks = {"naive": 3, "chunked": 2, "from_hidden": 0}[variant]
    return blocks * n * v * 4 + 3 * v * h * 4 + 4 * n * h * 4


def run(options) -> dict[str, Any]:
    from bench_common import MEMORY_CAP_BYTES, goal, mem_available_bytes, ratio

    if options.quick:
        n, v, h, repeats = 256, 8192, 128, 2
    else:
        n, v, h, repeats = 4096, 151_936, 1536, options.extra.get("logprobs_repeats", 2)
    # Variants run one after another, or with --logprobs-parallel naive and from_hidden
    # together (then chunked) when the machine has the memory for both: on a loaded machine
    # that gets the single-repeat figures in a third less wall time.
    if options.extra.get("logprobs_parallel") and options.device == "cpu":
        waves = [("naive", "from_hidden"), ("chunked",)]
    else:
        waves = [(name,) for name in VARIANTS]
    rows_by_name: dict[str, dict[str, Any]] = {}
    for wave in waves:
        available = mem_available_bytes()
        need = sum(memory_need(name, n, v, h) for name in wave)
        if len(wave) > 1 and available is not None and available < need * 1.3:
            wave_groups = [(name,) for name in wave]  # not enough memory: one at a time
        else:
            wave_groups = [wave]
        for group in wave_groups:
            started = {}
            for name in group:
                need_one = memory_need(name, n, v, h)
                available = mem_available_bytes()
                if options.device == "cpu" and (
                    need_one > MEMORY_CAP_BYTES
                    or (available is not None and available < need_one * 1.3)
                ):
                    rows_by_name[name] = {
                        "variant": name,
                        "ok": False,
                        "error": f"skipped: needs ~{need_one / 2**30:.1f} GiB, "
                        f"{(available or 0) / 2**30:.1f} GiB available",
                    }
                    continue
                started[name] = _start(name, n, v, h, repeats, options.threads, options.device)
            for name, proc in started.items():
                rows_by_name[name] = _finish(name, proc)
                rows_by_name[name]["concurrent_with"] = [x for x in started if x != name]
    rows = [rows_by_name[name] for name in VARIANTS]

    by_name = {r["variant"]: r for r in rows}
    naive, hidden_row = by_name["naive"], by_name["from_hidden"]
    for row in rows:
        if row.get("ok") and naive.get("ok"):
            row["time_vs_naive"] = ratio(row["median_s"], naive["median_s"])
            row["memory_reduction_vs_naive"] = ratio(
                naive["peak_beyond_params_grads_bytes"], row["peak_beyond_params_grads_bytes"]
            )
            # Same numbers from every path (float32 sums over N tokens; loose tolerance).
            row["agrees_with_naive"] = all(
                abs(row["checks"][k] - naive["checks"][k])
                <= 1e-3 * max(1.0, abs(naive["checks"][k]))
                for k in naive["checks"]
            )

    goals = []
    if not options.quick:
        mem = hidden_row.get("memory_reduction_vs_naive")
        slow = hidden_row.get("time_vs_naive")
        goals.append(
            goal(
                "from-hidden peak memory vs naive",
                ">= 5x lower",
                f"{mem:.1f}x lower" if mem else "not measured",
                None if mem is None else mem >= 5.0,
            )
        )
        goals.append(
            goal(
                "from-hidden time vs naive",
                "<= 1.5x",
                f"{slow:.2f}x" if slow else "not measured",
                None if slow is None else slow <= 1.5,
            )
        )
    return {
        "settings": {
            "n_tokens": n,
            "vocab": v,
            "hidden": h,
            "repeats": repeats,
            "dtype": "float32",
            "device": options.device,
        },
        "rows": rows,
        "goals": goals,
    }


def _main() -> int:
    parser = argparse.ArgumentParser(description="worker for the log-prob/entropy benchmark")
    parser.add_argument("--worker", choices=VARIANTS, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--v", type=int, required=True)
    parser.add_argument("--h", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    result = worker(args.worker, args.n, args.v, args.h, args.repeats, args.threads, args.device)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
