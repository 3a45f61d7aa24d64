"""Where the time of one log-prob forward + backward goes, per operator (torch.profiler).

    python benchmarks/profile_logprobs.py --n 1024 --threads 1 [--variants naive,from_hidden]

Same inputs and step as ``bench_logprobs.py`` (V = 151,936, H = 1536, float32 by default).
For each variant: one untimed step, then one profiled step; prints the operators by self time
and the share of the matmuls (``aten::mm`` / ``addmm`` / ``addmm_``) against everything else.
The profiler's times are wall clock per operator, so on a loaded machine they stretch; the
shares are what to read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MATMULS = {"aten::mm", "aten::addmm", "aten::addmm_"}  # the einsum row dots (bmm) are not


def profile(variant: str, n: int, v: int, h: int, threads: int, rows: int) -> None:
    from bench_logprobs import Session
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    session = Session(variant, n, v, h, threads)
    session.step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        result = session.step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    print(f"== {variant}: N={n}, V={v}, H={h}, {threads} thread(s)")
    print(f"step {result['time_s']:.2f} s wall, {result['cpu_s']:.2f} s CPU (profiled)")
    print(
        f"matmuls {matmul / 1e6:.2f} s ({100 * matmul / total:.1f}%), "
        f"other operators {(total - matmul) / 1e6:.2f} s"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--v", type=int, default=151_936)
    parser.add_argument("--h", type=int, default=1536)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variants", default="naive,from_hidden")
    parser.add_argument("--rows", type=int, default=14, help="operators shown per variant")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for variant in args.variants.split(","):
        profile(variant.strip(), args.n, args.v, args.h, args.threads, args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
