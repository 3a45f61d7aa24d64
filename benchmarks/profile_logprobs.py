"""Where the time of one log-prob forward + backward goes, per operator (torch.profiler).

    python benchmarks/profile_logprobs.py --n 1024,4096 --threads 1 \
        --out benchmarks/results/profile_logprobs.json   # docs/results.md's figures
    python benchmarks/profile_logprobs.py --quick --out /tmp/profile.json  # CI: seconds

Same inputs and step as ``bench_logprobs.py`` (V = 151,936, H = 1536, float32 by default).
For each N and variant: one untimed step, then one profiled step; prints the operators by self
time and the share of the matmuls (``aten::mm`` / ``addmm`` / ``addmm_``) against everything
else, and how many (N, H) x (H, V) matmuls their floating-point operations amount to (from the
recorded input shapes: 3 for the naive path, 4 for the from-hidden one, however it tiles them).
The profiler's times are wall clock per operator, so on a loaded machine they stretch; the
shares are what to read. ``--out`` writes every figure (and the machine, its load before and
after, the command, the commit) as JSON; ``report.py`` renders it into docs/results.md.
``--quick`` (N = 64, V = 4096, H = 64) only checks that the script runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
MATMULS = {"aten::mm", "aten::addmm", "aten::addmm_"}  # the einsum row dots (bmm) are not
QUICK = {"n": [64], "v": 4096, "h": 64}
"""``--quick``'s sizes (the full run's are the command line's: N = 1024, 4096 in the docs)."""


def matmul_flops(key: str, shapes: list[list[int]]) -> int:
    """Floating-point operations of one ``aten::mm`` (a, b[, out]) or ``aten::addmm[_]``
    (c, a, b) call, from the profiler's recorded input shapes."""
    a, b = (shapes[0], shapes[1]) if key == "aten::mm" else (shapes[1], shapes[2])
    return 2 * a[0] * a[1] * b[1]


def profile(variant: str, n: int, v: int, h: int, threads: int, rows: int) -> dict[str, Any]:
    """One untimed step, then one profiled step of ``variant``; prints and returns its figures."""
    from bench_logprobs import Session
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    session = Session(variant, n, v, h, threads)
    session.step()
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        result = session.step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    by_shape = prof.key_averages(group_by_input_shape=True)
    flops = sum(e.count * matmul_flops(e.key, e.input_shapes) for e in by_shape if e.key in MATMULS)
    print(f"== {variant}: N={n}, V={v}, H={h}, {threads} thread(s)")
    print(f"step {result['time_s']:.2f} s wall, {result['cpu_s']:.2f} s CPU (profiled)")
    print(
        f"matmuls {matmul / 1e6:.2f} s ({100 * matmul / total:.1f}%), "
        f"other operators {(total - matmul) / 1e6:.2f} s; the matmuls' flops = "
        f"{flops / (2 * n * v * h):.2f} (N, H) x (H, V) matmuls"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows))
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return {
        "n": n,
        "variant": variant,
        "step_wall_s": result["time_s"],
        "step_cpu_s": result["cpu_s"],
        "profiled_s": total / 1e6,
        "matmul_s": matmul / 1e6,
        "matmul_share": matmul / total,
        "other_s": (total - matmul) / 1e6,
        "matmul_calls": sum(e.count for e in events if e.key in MATMULS),
        "vocab_matmuls": flops / (2 * n * v * h),
        "top_operators": [
            {"name": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in top
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="1024", help="token counts (comma list)")
    parser.add_argument("--v", type=int, default=151_936)
    parser.add_argument("--h", type=int, default=1536)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default="naive,from_hidden")
    parser.add_argument("--rows", type=int, default=14, help="operators shown per variant")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: only checks it runs")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(BENCH_DIR))
    from bench_common import git_commit, machine_description, utc_now

    if args.quick:
        ns, v, h = QUICK["n"], QUICK["v"], QUICK["h"]
    else:
        ns, v, h = [int(x) for x in args.n.split(",")], args.v, args.h
    machine = machine_description()  # its uptime is the load before the run
    start = time.perf_counter()
    rows = [
        profile(variant.strip(), n, v, h, args.threads, args.rows)
        for n in ns
        for variant in args.variants.split(",")
    ]
    import torch

    record = {
        "benchmark": "profile_logprobs",
        "status": "ok",
        "quick": args.quick,
        "command": " ".join(
            ["python", "benchmarks/profile_logprobs.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": utc_now(),
        "commit": git_commit(),
        "wall_s": round(time.perf_counter() - start, 1),
        "threads": args.threads,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "v": v,
        "h": h,
        "machine": machine,
        "uptime_after": machine_description()["uptime"],
        "rows": rows,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
