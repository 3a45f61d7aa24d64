"""Item 2 (and issue 21): per-token log-probs + entropy over a large vocabulary, forward + backward.

Shapes: V = 151,936, H = 1536 (Qwen2.5-1.5B's LM head; ``--logprobs-shape VxH`` picks another,
e.g. ``49152x576`` for SmolLM2-135M), float32, on a grid of N tokens x torch threads (default
``1024x1,1024x2,4096x1,4096x2``; ``--logprobs-grid`` picks cells). Variants:
- ``naive``: full logits = hidden @ W.T, ``log_softmax`` over V, gather the label log-prob,
  entropy = -(p * log p).sum under no_grad (what most RL code writes),
- ``chunked``: full logits, then ``gmts.token_logprobs_and_entropy`` (chunked over tokens),
- ``from_hidden``: ``gmts.token_logprobs_and_entropy_from_hidden`` (never builds (N, V) logits).

All variants back-propagate ``(logprobs * weights).sum()`` into the hidden states and the LM-head
weight (gradients flow through the log-probs only, as the core's contract says).

Timing, side by side and interleaved: for each grid cell one long-lived worker process per
variant builds the inputs (same seed: same numbers) and warms up; then the driver asks the
workers for one forward + backward at a time, round-robin with the order rotated every round
(naive, chunked, from_hidden; chunked, from_hidden, naive; ...), so that a change of load on a
shared machine hits every variant alike and no two variants ever run at once. Every step is
timed (wall clock and the worker's CPU time, user + system: on one thread the CPU time hardly
moves when other processes share the cores); the table reports medians and the spread.

Peak memory, per step: each worker drops the previous gradients, resets its kernel high-water
mark (``/proc/self/clear_refs`` <- 5), reads VmRSS as the baseline, runs one forward + backward
and reads VmHWM. "Peak beyond parameters and their gradients" = VmHWM - baseline - bytes(W.grad)
- bytes(hidden.grad): the baseline already holds W and hidden, and the two gradients are what
any variant must produce. Large tensors are mmap-backed by glibc, so RSS falls when they are
freed and the HWM is a true peak; the table reports the largest peak over the steps.
On CUDA (``--device cuda``) the same quantity is read from the caching allocator instead:
``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()``, minus the memory
allocated before the step and the two gradients (the grid's thread counts do not apply).

    python benchmarks/run.py --only logprobs --logprobs-repeats 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("naive", "chunked", "from_hidden")
DEFAULT_GRID = "1024x1,1024x2,4096x1,4096x2"
DEFAULT_SHAPE = "151936x1536"  # Qwen2.5-1.5B's LM head; SmolLM2-135M's is 49152x576
TIME_GOAL = 1.35  # issue 21: from-hidden wall time <= 1.35x naive in every cell
MEMORY_GOAL = 5.0  # and >= 5x less peak memory beyond parameters and gradients


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


class Session:
    """One variant's inputs in this process, warmed up; :meth:`step` measures one fwd + bwd."""

    def __init__(
        self, variant: str, n: int, v: int, h: int, threads: int, device: str = "cpu"
    ) -> None:
        import torch
        from bench_common import synchronizer

        torch.set_num_threads(threads)
        self.variant, self.device = variant, device
        self.fn = FUNCTIONS[variant]
        self.sync = synchronizer(device)
        gen = torch.Generator().manual_seed(0)
        self.hidden = (torch.randn(n, h, generator=gen) * 0.5).to(device).requires_grad_(True)
        self.weight = (torch.randn(v, h, generator=gen) * 0.02).to(device).requires_grad_(True)
        self.labels = torch.randint(0, v, (n,), generator=gen).to(device)  # (N,)
        self.weights = torch.randn(n, generator=gen).to(device)  # (N,) stands in for -omega/count
        self.grad_bytes = self.weight.numel() * 4 + self.hidden.numel() * 4
        # Warm-up on a small slice: loads kernels and allocator arenas outside the measurement.
        small_w = self.weight[: min(v, 1024)].detach().clone().requires_grad_(True)
        small_h = self.hidden[:16].detach().clone().requires_grad_(True)
        lp, _ = self.fn(small_h, small_w, self.labels[:16] % small_w.shape[0])
        lp.sum().backward()

    def _forward_backward(self) -> dict[str, float]:
        logprobs, entropy = self.fn(self.hidden, self.weight, self.labels)
        (logprobs * self.weights).sum().backward()
        return {  # float() reads synchronise the device
            "logprob_sum": float(logprobs.detach().sum()),
            "entropy_sum": float(entropy.detach().sum()),
            "grad_w_norm": float(self.weight.grad.norm()),
        }

    def step(self) -> dict[str, Any]:
        """Wall and CPU seconds, peak memory beyond parameters and gradients, and checks."""
        import torch
        from bench_common import proc_status_kib, reset_peak_rss

        self.hidden.grad = None  # the previous step's gradients are not part of the baseline
        self.weight.grad = None
        self.sync()
        if self.device != "cpu":
            torch.cuda.reset_peak_memory_stats(self.device)
            baseline = torch.cuda.memory_allocated(self.device)
            method = "torch.cuda.max_memory_allocated"
        else:
            clear_ok = reset_peak_rss()
            baseline_kib = proc_status_kib("VmRSS") if clear_ok else proc_status_kib("VmHWM")
            baseline = None if baseline_kib is None else baseline_kib * 1024
            method = "VmHWM reset" if clear_ok else "VmHWM lifetime delta (over-counts)"
        cpu_start, start = time.process_time(), time.perf_counter()
        checks = self._forward_backward()
        wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        if self.device != "cpu":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak_kib = proc_status_kib("VmHWM")
            peak = None if peak_kib is None else peak_kib * 1024
        peak_beyond = None
        if peak is not None and baseline is not None:
            peak_beyond = peak - baseline - self.grad_bytes
        return {
            "time_s": wall_s,
            "cpu_s": cpu_s,
            "peak_beyond_params_grads_bytes": peak_beyond,
            "peak_method": method,
            "baseline_bytes": baseline or 0,
            "checks": checks,
        }


def _collect(variant: str, device: str, grad_bytes: int, steps: list[dict]) -> dict[str, Any]:
    """One row from a worker's steps: every time, the largest peak, the first step's checks."""
    peaks = [s["peak_beyond_params_grads_bytes"] for s in steps]
    return {
        "variant": variant,
        "device": device,
        "times_s": [s["time_s"] for s in steps],
        "cpu_times_s": [s["cpu_s"] for s in steps],
        "peak_beyond_params_grads_bytes": None if None in peaks else max(peaks),
        "peak_method": steps[0]["peak_method"],
        "baseline_bytes": steps[0]["baseline_bytes"],
        "grad_bytes": grad_bytes,
        "checks": steps[0]["checks"],
    }


def worker(
    variant: str, n: int, v: int, h: int, repeats: int, threads: int, device: str = "cpu"
) -> dict[str, Any]:
    """Measure one variant in this process, ``repeats`` steps in a row (no interleaving)."""
    session = Session(variant, n, v, h, threads, device)
    steps = [session.step() for _ in range(repeats)]
    return _collect(variant, device, session.grad_bytes, steps)


def serve(variant: str, n: int, v: int, h: int, threads: int, device: str) -> None:
    """The worker loop: build the inputs, say ``ready``, then one step per ``step`` line on
    stdin (one JSON line back each), until ``quit`` or end of input."""
    session = Session(variant, n, v, h, threads, device)
    print(json.dumps({"ready": True, "grad_bytes": session.grad_bytes}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(json.dumps(session.step()), flush=True)


# --------------------------------------------------------------------------------------
# the driver (run.py calls run())


class _Worker:
    """A serving worker process; its stderr goes to a file so that a chatty library cannot
    fill a pipe and stall it."""

    def __init__(self, variant: str, n: int, v: int, h: int, threads: int, device: str) -> None:
        from bench_common import python_env

        self.variant = variant
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            variant,
            f"--n={n}",
            f"--v={v}",
            f"--h={h}",
            f"--threads={threads}",
            f"--device={device}",
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=python_env(),
        )
        self.grad_bytes = 0
        self.error: str | None = None

    def _read(self) -> dict[str, Any] | None:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.stderr.seek(0)
            tail = self.stderr.read().strip().splitlines()[-5:]
            self.error = f"worker exited ({self.proc.returncode}): " + " | ".join(tail)
            return None
        return json.loads(line)

    def wait_ready(self) -> bool:
        message = self._read()
        if message is not None:
            self.grad_bytes = message["grad_bytes"]
        return message is not None

    def step(self) -> dict[str, Any] | None:
        try:
            self.proc.stdin.write("step\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it has exited: _read says why
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


def parse_grid(text: str) -> list[tuple[int, int]]:
    """``"1024x1,4096x2"`` -> ``[(1024, 1), (4096, 2)]`` (tokens x torch threads)."""
    cells = []
    for part in text.split(","):
        n, sep, threads = part.strip().partition("x")
        if not sep or not n.isdigit() or not threads.isdigit() or int(n) < 1 or int(threads) < 1:
            raise ValueError(f"--logprobs-grid: cells are NxTHREADS, e.g. 1024x1; got {part!r}")
        cells.append((int(n), int(threads)))
    if not cells:
        raise ValueError("--logprobs-grid: no cells")
    return cells


def parse_shape(text: str) -> tuple[int, int]:
    """``"49152x576"`` -> ``(49152, 576)`` (vocabulary x hidden size of the LM head)."""
    v, sep, h = text.strip().partition("x")
    if not sep or not v.isdigit() or not h.isdigit() or int(v) < 2 or int(h) < 1:
        raise ValueError(f"--logprobs-shape: VOCABxHIDDEN, e.g. 49152x576; got {text!r}")
    return int(v), int(h)


def memory_need(variant: str, n: int, v: int, h: int) -> tuple[int, int]:
    """Rough bytes of one worker: (resident between steps, extra during a step).

    Resident: W, its gradient, hidden and its gradient. During a step naive holds about three
    (N, V) float32 tensors at once (log-softmax, its gradient and the gradient of the logits),
    chunked two (the logits and their gradient), from_hidden a few (chunk, V) blocks.
    """
    blocks = {"naive": 3, "chunked": 2, "from_hidden": 0}[variant]
    return 2 * v * h * 4 + 4 * n * h * 4, blocks * n * v * 4 + v * h * 4


def _skip(variant: str, reason: str) -> dict[str, Any]:
    return {"variant": variant, "ok": False, "error": f"skipped: {reason}"}


def run_cell(
    n: int, threads: int, v: int, h: int, repeats: int, device: str, variants=VARIANTS
) -> list[dict[str, Any]]:
    """Rows of one grid cell: the variants interleaved step by step, medians of ``repeats``."""
    from bench_common import MEMORY_CAP_BYTES, mem_available_bytes

    rows: dict[str, dict[str, Any]] = {}
    needs = {name: memory_need(name, n, v, h) for name in variants}
    kept = []
    for name in variants:
        resident, extra = needs[name]
        if device == "cpu" and resident + extra > MEMORY_CAP_BYTES:
            rows[name] = _skip(name, f"needs ~{(resident + extra) / 2**30:.1f} GiB")
        else:
            kept.append(name)
    # All workers stay resident; one step runs at a time, so the largest step's extra counts once.
    total = sum(needs[x][0] for x in kept) + max((needs[x][1] for x in kept), default=0)
    available = mem_available_bytes()
    if device == "cpu" and available is not None and kept and available < total * 1.3:
        for name in kept:
            rows[name] = _skip(
                name, f"cell needs ~{total / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"
            )
        kept = []
    workers = {name: _Worker(name, n, v, h, threads, device) for name in kept}
    steps: dict[str, list[dict[str, Any]]] = {name: [] for name in kept}
    try:
        alive = [name for name in kept if workers[name].wait_ready()]
        for round_index in range(repeats):
            shift = round_index % max(1, len(alive))
            for name in alive[shift:] + alive[:shift]:
                if workers[name].error is None:
                    result = workers[name].step()
                    if result is not None:
                        steps[name].append(result)
    finally:
        for worker_proc in workers.values():
            worker_proc.close()
    for name in kept:
        w = workers[name]
        if w.error is not None or not steps[name]:
            rows[name] = {"variant": name, "ok": False, "error": w.error or "no steps"}
        else:
            rows[name] = summarize_row(_collect(name, device, w.grad_bytes, steps[name]))
    out = []
    for name in variants:
        row = rows[name]
        row.update({"n_tokens": n, "threads": threads})
        out.append(row)
    compare_with_naive(out)
    return out


def summarize_row(result: dict[str, Any]) -> dict[str, Any]:
    """A worker's result with medians and spreads of its wall and CPU times."""
    from bench_common import summarize_times

    row = dict(result)
    row["ok"] = True
    row.update(summarize_times(row.pop("times_s")))
    cpu = summarize_times(row.pop("cpu_times_s"))
    row.update({"cpu_median_s": cpu["median_s"], "cpu_times_s": cpu["times_s"]})
    return row


def compare_with_naive(rows: list[dict[str, Any]]) -> None:
    """Add each row's wall time, CPU time and peak memory relative to naive, and whether its
    checks agree with naive's (float32 sums over N tokens; relative 1e-3)."""
    from bench_common import ratio

    naive = next((r for r in rows if r["variant"] == "naive"), None)
    if naive is None or not naive.get("ok"):
        return
    for row in rows:
        if not row.get("ok"):
            continue
        row["time_vs_naive"] = ratio(row["median_s"], naive["median_s"])
        row["cpu_time_vs_naive"] = ratio(row["cpu_median_s"], naive["cpu_median_s"])
        row["memory_reduction_vs_naive"] = ratio(
            naive["peak_beyond_params_grads_bytes"], row["peak_beyond_params_grads_bytes"]
        )
        row["agrees_with_naive"] = all(
            abs(row["checks"][k] - naive["checks"][k]) <= 1e-3 * max(1.0, abs(naive["checks"][k]))
            for k in naive["checks"]
        )


def cell_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 21's two goals for the from-hidden row of each grid cell."""
    from bench_common import goal

    goals = []
    for row in rows:
        if row["variant"] != "from_hidden":
            continue
        where = f"N={row['n_tokens']}, {row['threads']} thread(s)"
        mem, slow = row.get("memory_reduction_vs_naive"), row.get("time_vs_naive")
        goals.append(
            goal(
                f"from-hidden peak memory vs naive ({where})",
                f">= {MEMORY_GOAL:g}x lower",
                f"{mem:.1f}x lower" if mem else "not measured",
                None if mem is None else mem >= MEMORY_GOAL,
            )
        )
        spread = ""
        if slow and row.get("min_s") and row.get("max_s"):
            spread = f" (runs {row['min_s']:.1f}-{row['max_s']:.1f} s)"
        goals.append(
            goal(
                f"from-hidden time vs naive ({where})",
                f"<= {TIME_GOAL:g}x",
                f"{slow:.2f}x{spread}" if slow else "not measured",
                None if slow is None else slow <= TIME_GOAL,
            )
        )
    return goals


def run(options) -> dict[str, Any]:
    if options.quick:
        v, h, repeats = 8192, 128, 2
        cells = [(256, options.threads)]
    else:
        v, h = parse_shape(options.extra.get("logprobs_shape") or DEFAULT_SHAPE)
        repeats = options.extra.get("logprobs_repeats") or 3
        cells = parse_grid(options.extra.get("logprobs_grid") or DEFAULT_GRID)
    if options.device != "cpu":  # thread counts do not apply to a GPU: one cell per N
        cells = list(dict.fromkeys((n, options.threads) for n, _ in cells))
    rows = []
    for n, threads in cells:
        print(f"[bench] logprobs N={n} threads={threads} ...", flush=True)
        rows += run_cell(n, threads, v, h, repeats, options.device)
    return {
        "settings": {
            "grid": [list(cell) for cell in cells],
            "vocab": v,
            "hidden": h,
            "repeats": repeats,
            "dtype": "float32",
            "device": options.device,
            "order": "one step at a time, round-robin over the variants, rotated every round",
        },
        "rows": rows,
        "goals": [] if options.quick else cell_goals(rows),
    }


def _main() -> int:
    parser = argparse.ArgumentParser(description="worker for the log-prob/entropy benchmark")
    parser.add_argument("--serve", choices=VARIANTS, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--v", type=int, required=True)
    parser.add_argument("--h", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    serve(args.serve, args.n, args.v, args.h, args.threads, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
