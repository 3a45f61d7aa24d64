"""Render ``benchmarks/results/*.json`` as markdown tables inside docs/results.md (and the
demo's output, ``results/demo.json``, inside README.md and docs/training.md).

The pages are prose written by hand around generated blocks; each block sits between
``<!-- results:NAME:begin -->`` and ``<!-- results:NAME:end -->`` and is replaced wholesale
from ``results/NAME.json``. Run ``python benchmarks/report.py`` to refresh it without
re-running anything (run.py does this after each full run).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gmts.provenance import describe_machine, describe_run

BENCH_DIR = Path(__file__).resolve().parent
DOC = BENCH_DIR.parent / "docs" / "results.md"


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _fmt_x(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}x"


def _fmt_bytes(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.0f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _measured(cell: dict[str, Any]) -> str:
    if cell.get("ok"):
        return _fmt_s(cell["median_s"])
    return "fails: " + cell.get("error", "?").split("\n")[0][:70]


def render_selection(record: dict[str, Any]) -> str:
    rows = []
    for r in record["rows"]:
        rows.append(
            [
                f"{r['n_tokens'] / 2**20:g}M",
                str(r["repeats"]),
                _measured(r["select_tokens"]),
                _measured(r["quantile"]),
                _measured(r["sort"]),
                _measured(r["kthvalue"]) if "kthvalue" in r else "—",
                _fmt_x(r["speedup_vs_quantile"]),
                _fmt_x(r["speedup_vs_sort"]),
                "yes" if r["exact_count"] and r["is_top_k"] else "NO",
            ]
        )
    header = [
        "N tokens",
        "repeats",
        "select_tokens",
        "torch.quantile (TRL)",
        "full sort",
        "torch.kthvalue (reference)",
        "speed-up vs quantile",
        "speed-up vs sort",
        "exact top-k",
    ]
    return _table(header, rows)


def render_logprobs(record: dict[str, Any]) -> str:
    s = record["settings"]
    rows = []
    for r in record["rows"]:
        cell = [str(r.get("n_tokens", s.get("n_tokens", "?"))), str(r.get("threads", "?"))]
        if not r.get("ok"):
            rows.append(
                cell + [r["variant"], "—", "—", "—", "—", "—", r.get("error", "failed")[:80]]
            )
            continue
        spread = f"{_fmt_s(r['median_s'])} ({_fmt_s(r['min_s'])}-{_fmt_s(r['max_s'])})"
        rows.append(
            cell
            + [
                r["variant"],
                spread,
                _fmt_x(r.get("time_vs_naive")),
                _fmt_x(r.get("cpu_time_vs_naive")),
                _fmt_bytes(r["peak_beyond_params_grads_bytes"]),
                _fmt_x(r.get("memory_reduction_vs_naive"), 1),
                "yes" if r.get("agrees_with_naive", True) else "NO",
            ]
        )
    header = [
        "N",
        "threads",
        "variant",
        "fwd+bwd wall time, median (min-max)",
        "time vs naive",
        "CPU time vs naive",
        "peak memory beyond params+grads",
        "memory reduction vs naive",
        "same results as naive",
    ]
    head = (
        f"V = {s['vocab']}, H = {s['hidden']}, float32, {s['repeats']} timed runs per variant "
        "and cell, one worker process per variant, steps interleaved round-robin; torch "
        "threads per cell as in the table (not the provenance line's).\n\n"
    )
    return head + _table(header, rows)


def render_generic(record: dict[str, Any]) -> str:
    """Fallback: one row per result row with its scalar fields."""
    rows = record.get("rows", [])
    if not rows:
        return "_no rows_"
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float, str, bool))]
    return _table(keys, [[_cell(r.get(k)) for k in keys] for r in rows])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_goals(record: dict[str, Any]) -> str:
    goals = record.get("goals", [])
    if not goals:
        return ""
    rows = [
        [
            g["name"],
            g["target"],
            g["measured"],
            {True: "met", False: "NOT MET"}.get(g["met"], "n/a"),
        ]
        for g in goals
    ]
    return "\n\n" + _table(["goal", "target", "measured", "status"], rows)


def render_profile_logprobs(record: dict[str, Any]) -> str:
    """benchmarks/profile_logprobs.py: one profiled fwd + bwd per N and variant."""
    rows = [
        [
            str(r["n"]),
            r["variant"],
            _fmt_s(r["step_wall_s"]),
            _fmt_s(r["profiled_s"]),
            f"{_fmt_s(r['matmul_s'])} ({100 * r['matmul_share']:.1f}%)",
            _fmt_s(r["other_s"]),
            f"{r['vocab_matmuls']:.2f}",
            _fmt_s(r["matmul_s"] / r["vocab_matmuls"]),
        ]
        for r in record["rows"]
    ]
    header = [
        "N",
        "variant",
        "profiled step, wall",
        "operators' self time, sum",
        "matmuls (share)",
        "other operators",
        "matmul flops, in (N, H) x (H, V) matmuls",
        "matmul time per (N, H) x (H, V)",
    ]
    head = (
        f"V = {record['v']}, H = {record['h']}, float32, torch kernels "
        f"{record.get('cpu_capability', '?')}; one untimed step, then one profiled step per "
        "N and variant (torch.profiler, self CPU time per operator; matmuls: aten::mm, addmm, "
        "addmm_).\n\n"
    )
    return head + _table(header, rows)


def render_overhead(record: dict[str, Any]) -> str:
    s = record["settings"]
    rows = []
    for r in record["rows"]:
        rows.append(
            [
                r["variant"],
                _fmt_s(r["update"]["median_s"]),
                _fmt_x(r["update_vs_none"], 3),
                _fmt_x(r["update_vs_none_paired_median"], 3),
                _fmt_s(r["step"]["median_s"]),
                _fmt_x(r["step_vs_none"], 3),
                _fmt_x(r["step_vs_none_paired_median"], 3),
                f"{r['selected_fraction']:.3f}",
            ]
        )
    header = [
        "variant",
        "step w/o rollout",
        "vs none",
        "vs none (paired)",
        "whole step",
        "vs none",
        "vs none (paired)",
        "selected fraction",
    ]
    head = (
        f"{s['algorithm'].upper()}, {s['questions']} questions x {s['group_size']} samples, "
        f"ratio {s['ratio']}, {s['repeats']} rounds (medians; 'paired' = median over rounds of "
        f"the per-round ratio to 'none', whose rollout is identical).\n\n"
    )
    return head + _table(header, rows)


def render_throughput(record: dict[str, Any]) -> str:
    s = record["settings"]
    rows = []
    for r in record["rows"]:
        for side, name in (("ours", "gmts Trainer"), ("trl", "TRL GRPOTrainer")):
            d = r[side]
            rows.append(
                [
                    r["setting"],
                    name,
                    _fmt_s(d["step"]["median_s"]),
                    f"{d['mean_completion_length']:.2f}",
                    f"{d['tokens_per_s_median']:.0f}",
                    _fmt_x(r["throughput_vs_trl"]) if side == "ours" else "1.00x",
                    _fmt_x(r["paired_throughput_vs_trl_median"]) if side == "ours" else "",
                ]
            )
    header = [
        "setting",
        "trainer",
        "step time (median)",
        "mean completion length",
        "completion tokens/s (median)",
        "tokens/s vs TRL",
        "paired",
    ]
    head = (
        f"{s['questions']} questions x {s['group_size']} samples per step, "
        f"{s['timed_steps']} timed steps each (interleaved), lr {s['lr']}.\n\n"
    )
    return head + _table(header, rows)


def _mean_std(cell: dict[str, Any] | None) -> str:
    if not cell or not cell.get("n"):
        return "—"
    text = f"{100 * cell['mean']:.1f}"
    if cell.get("std") is not None:
        text += f" ± {100 * cell['std']:.1f}"
    return text + f" (n={cell['n']})"


def _learning_table1(record: dict[str, Any]) -> str:
    """Table 1's layout: per algorithm, all tokens vs ETS vs GMTS at 20%, final scores."""
    cells = record["summary"]["cells"]
    t1 = [
        [alg.upper()]
        + [
            _mean_std(cells.get(alg, {}).get(k))
            for k in ("all tokens", "ETS top 0.2", "GMTS top 0.2")
        ]
        for alg in ("grpo", "dapo")
        if alg in cells
    ]
    return "**Table 1 layout** (top 20%):\n\n" + _table(
        ["algorithm", "all tokens", "+ETS 20%", "+GMTS 20%"], t1
    )


def _learning_curve_tables(record: dict[str, Any]) -> list[str]:
    """Per recipe with more than one evaluation: each method's score by training step."""
    s = record["settings"]
    curves = record["summary"].get("curve_cells") or {}
    recipes = _recipes(record)
    parts = []
    for alg in recipes:
        labels = [
            k for k in ("all tokens", "ETS top 0.2", "GMTS top 0.2") if k in curves.get(alg, {})
        ]
        steps = sorted({int(st) for k in labels for st in curves[alg][k]})
        if len(steps) > 1:
            rows = [[k] + [_mean_std(curves[alg][k].get(str(st))) for st in steps] for k in labels]
            last = "Table 1's" if alg in ("grpo", "dapo") else "the objectives table's"
            parts.append(
                f"**{recipes[alg]}, held-out average@{s['eval_samples']} (%) by training step** "
                f"(how fast each method learns; the last column is {last}):\n\n"
                + _table(["method"] + [f"step {st}" for st in steps], rows)
            )
    return parts


def _learning_table7(record: dict[str, Any]) -> str | None:
    """Table 7's layout (DAPO's top-ratio sweep: final, and at the first evaluation); None
    without a top ratio."""
    dapo = record["summary"]["cells"].get("dapo", {})
    ratios = sorted({float(k.split()[-1]) for k in dapo if " top " in k})
    if not ratios:
        return None
    early = (record["summary"].get("curve_cells") or {}).get("dapo", {})
    first = min((int(st) for d in early.values() for st in d), default=None)

    def at_first(label: str) -> str:
        return _mean_std(early.get(label, {}).get(str(first))) if first else "-"

    t7 = [
        [
            f"{r:g}",
            _mean_std(dapo.get(f"ETS top {r:g}")),
            _mean_std(dapo.get(f"GMTS top {r:g}")),
            at_first(f"ETS top {r:g}"),
            at_first(f"GMTS top {r:g}"),
        ]
        for r in ratios
    ]
    return (
        "**Table 7 layout** (DAPO, top ratio sweep; final, and at the first evaluation):\n\n"
        + _table(["ratio", "ETS", "GMTS", f"ETS @ step {first}", f"GMTS @ step {first}"], t7)
    )


def _learning_table6(record: dict[str, Any]) -> str | None:
    """Table 6's layout (DAPO, bottom selection); None without a bottom run."""
    dapo = record["summary"]["cells"].get("dapo", {})
    bottoms = sorted({float(k.split()[-1]) for k in dapo if " bottom " in k})
    if not bottoms:
        return None
    t6 = [
        [
            f"bottom {r:g}",
            _mean_std(dapo.get(f"ETS bottom {r:g}")),
            _mean_std(dapo.get(f"GMTS bottom {r:g}")),
        ]
        for r in bottoms
    ]
    return "**Table 6 layout** (DAPO, bottom selection):\n\n" + _table(
        ["selection", "ETS", "GMTS"], t6
    )


def render_learning(record: dict[str, Any]) -> str:
    s = record["settings"]
    warm = record["summary"].get("warm_start_average") or {}
    parts = [
        f"Plan `{s['plan']}`: {s['runs_done']} of {s['runs_in_plan']} runs; {s['steps']} steps x "
        f"{s['questions']} questions x {s['group_size']} samples, lr {s['lr']}; held-out "
        f"average@{s['eval_samples']} (%) on {s['eval_questions']} questions, mean ± std over "
        f"RL seeds (n = seeds). Warm start (before RL): {_mean_std(warm)}.",
        _learning_table1(record),
        *_learning_curve_tables(record),
    ]
    for part in (
        render_objectives(record),
        render_paired(record),
        _learning_table7(record),
        _learning_table6(record),
    ):
        if part:
            parts.append(part)
    if record.get("failures"):
        parts.append("Failed runs: " + "; ".join(record["failures"]))
    for fig in record.get("figures", []):
        rel = fig.replace("docs/", "", 1)
        parts.append(f"![learning curves]({rel})")
    return "\n\n".join(parts)


def render_rollout(record: dict[str, Any]) -> str:
    s = record["settings"]
    rows = [
        [
            r["engine"],
            _fmt_s(r["call"]["median_s"]),
            f"{r['tokens_per_call_mean']:.0f}",
            f"{r['tokens_per_s_median']:.0f}",
        ]
        for r in record["rows"]
    ]
    head = (
        f"{s['questions']} questions x {s['group_size']} answers ({s['rows']} rows), up to "
        f"{s['max_new_tokens']} new tokens, {s['model']}, {s['timed_repeats']} timed rollouts "
        f"per engine (interleaved). vLLM: {s['vllm']}.\n\n"
    )
    tail = (
        f"\n\nvLLM / hf tokens per second: {_fmt_x(record['vllm_vs_hf_tokens_per_s'])} "
        f"(paired median {_fmt_x(record['vllm_vs_hf_paired_median'])}); engine start-up "
        f"{_fmt_s(record['engine_start_s'])}; weight sync (whole model, in place) "
        f"{_fmt_s(record['weight_sync']['median_s'])} median."
    )
    table = _table(["engine", "rollout (median)", "tokens per rollout", "tokens/s (median)"], rows)
    return head + table + tail


_TITLES = {"grpo": "GRPO", "dapo": "DAPO"}
_RECIPE_ORDER = ("grpo", "dapo", "dapo-4mb", "gspo", "cispo")


def _recipes(record: dict[str, Any]) -> dict[str, str]:
    """Recipe key -> table title, for the recipes the record has runs of, in the order of
    bench_learning.RECIPES (the JSON's own key order is sorted)."""
    known = {k: v["title"] for k, v in record["settings"].get("recipes", {}).items()}
    present = set(record["summary"]["cells"])
    order = [k for k in _RECIPE_ORDER if k in present] + sorted(present - set(_RECIPE_ORDER))
    return {k: known.get(k, _TITLES.get(k, k.upper())) for k in order}


def _signed(d: dict[str, Any] | None) -> str:
    """A paired difference (gmts.demo.stats.PairedDifference as a dict), in points."""
    if not d:
        return "—"
    if d.get("std") is None or d.get("low") is None:
        return f"{d['mean']:+.1f} (n=1)"
    clear = " **clear**" if d["low"] > 0 or d["high"] < 0 else ""
    return (
        f"{d['mean']:+.1f} ± {d['std']:.1f} [{d['low']:+.1f}, {d['high']:+.1f}]{clear} "
        f"({sum(v > 0 for v in d['values'])}/{len(d['values'])} seeds > 0)"
    )


OBJECTIVE_RECIPES = ("dapo-4mb", "gspo", "cispo")
"""The recipes of the objectives table (same four updates per rollout batch)."""


def render_objectives(record: dict[str, Any]) -> str:
    """GSPO / CISPO (and their DAPO reference) x {all tokens, ETS 20%, GMTS 20%}: the final
    held-out average, the paired GMTS - ETS difference and the clip fraction."""
    s = record["settings"]
    cells = record["summary"]["cells"]
    clip = record["summary"].get("clip_fraction") or {}
    paired = record["summary"].get("paired") or {}
    recipes = _recipes(record)
    labels = ("all tokens", "ETS top 0.2", "GMTS top 0.2")
    rows = []
    for alg in OBJECTIVE_RECIPES:
        if alg not in cells:
            continue
        gmts_ets = next(
            (p for p in paired.get(alg, []) if (p["a"], p["b"]) == ("GMTS top 0.2", "ETS top 0.2")),
            None,
        )
        clip_cell = (clip.get(alg) or {}).get("all tokens")
        rows.append(
            [recipes.get(alg, alg)]
            + [_mean_std(cells[alg].get(k)) for k in labels]
            + [
                _signed(gmts_ets and gmts_ets.get("mean")),
                _signed(gmts_ets and gmts_ets.get("final")),
                "—"
                if not clip_cell or clip_cell.get("mean") is None
                else f"{100 * clip_cell['mean']:.2f}%",
            ]
        )
    if not rows:
        return ""
    known = s.get("recipes", {})
    described = "; ".join(
        f"{known[k]['title']}: {known[k]['description']}"
        for k in OBJECTIVE_RECIPES
        if k in known and known[k].get("description")
    )
    return (
        f"**Objectives** (top 20%; final held-out average@{s['eval_samples']} (%), mean ± std "
        "over seeds; GMTS - ETS paired by seed, in points: mean ± std [95% t interval], "
        "**clear** when the interval excludes 0; clip fraction: the share of tokens whose "
        "ratio or weight was clipped, all-token runs, mean over steps). "
        + described
        + ".\n\n"
        + _table(
            [
                "objective",
                "all tokens",
                "+ETS 20%",
                "+GMTS 20%",
                "GMTS - ETS, mean over training",
                "GMTS - ETS, final",
                "clip fraction",
            ],
            rows,
        )
    )


def render_paired(record: dict[str, Any]) -> str:
    """Every recipe's paired differences (the same seeds, the same warm start)."""
    paired = record["summary"].get("paired") or {}
    recipes = _recipes(record)
    rows = [
        [
            recipes.get(alg, alg),
            f"{p['a']} - {p['b']}",
            _signed(p.get("mean")),
            _signed(p.get("final")),
        ]
        for alg in recipes
        for p in paired.get(alg, [])
    ]
    if not rows:
        return ""
    return (
        "**Paired differences** (A - B seed by seed, in points of held-out average@16: mean ± "
        "std over seeds [95% t interval]; **clear** when the interval excludes 0, i.e. the "
        "difference is larger than the seed-to-seed spread):\n\n"
        + _table(["recipe", "A - B", "mean over training", "final"], rows)
    )


def render_demo(record: dict[str, Any]) -> str:
    """``gmts demo``'s printed table (``gmts demo --json``) and where it ran."""
    m = record.get("machine", {})
    env = ", ".join(f"{k}={v}" for k, v in (m.get("env") or {}).items()) or "none set"
    return (
        f"CPU: {m.get('cpu', '?')} ({m.get('nproc', '?')} cores; SIMD flags "
        f"{', '.join(m.get('simd_flags') or []) or 'none'}; torch kernels "
        f"{m.get('torch_cpu_capability', '?')}); torch {m.get('torch', '?')}, transformers "
        f"{m.get('transformers', '?')}; floating-point environment: {env}.\n\n"
        "```\n" + record["table"].rstrip() + "\n```"
    )


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "selection": render_selection,
    "logprobs": render_logprobs,
    "profile_logprobs": render_profile_logprobs,
    "overhead": render_overhead,
    "throughput": render_throughput,
    "learning": render_learning,
    "rollout": render_rollout,
    "demo": render_demo,
}


def render(record: dict[str, Any]) -> str:
    """Markdown for one result record: provenance line, table, goals."""
    name = record.get("benchmark", "?")
    if record.get("status") != "ok":
        body = f"**This benchmark failed in the recorded run:** `{record.get('error')}`"
    else:
        body = RENDERERS.get(name, render_generic)(record) + render_goals(record)
    return describe_run(record) + "\n\n" + body


def render_machine(records: list[dict[str, Any]]) -> str:
    """The machine (from the first record) and the load during every benchmark."""
    if not records:
        return "_no results yet_"
    lines, rows = describe_machine(records)
    header = ["benchmark", "finished (UTC)", "wall", "load before (1/5/15 min)", "load after"]
    return "\n".join([*lines, _table(header, rows)])


def _replace_block(text: str, name: str, block: str) -> tuple[str, bool]:
    """Replace the body between ``<!-- results:NAME:begin/end -->``; (text, whether found)."""
    pattern = re.compile(  # the body may be empty (a block not generated yet)
        rf"(<!-- results:{re.escape(name)}:begin -->\n)(?:.*?\n)?(<!-- results:{re.escape(name)}:end -->)",
        re.S,
    )
    if not pattern.search(text):
        return text, False
    return pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text), True


def _update_blocks(text: str, results_dir: Path, prefix: str) -> tuple[str, list[str]]:
    """Render every ``results_dir/*.json`` into its block ``PREFIX<name>`` and the machine
    description into ``PREFIXmachine``; returns the new text and the blocks replaced."""
    updated = []
    for path in sorted(results_dir.glob("*.json")):
        text, found = _replace_block(text, prefix + path.stem, render(json.loads(path.read_text())))
        if found:
            updated.append(prefix + path.stem)
    order = ["selection", "logprobs", "overhead", "throughput", "learning", "rollout"]
    records = [
        json.loads((results_dir / f"{n}.json").read_text())
        for n in order
        if (results_dir / f"{n}.json").exists()
    ]
    if records:
        text, found = _replace_block(text, prefix + "machine", render_machine(records))
        if found:
            updated.append(prefix + "machine")
    return text, updated


OTHER_DOCS = (BENCH_DIR.parent / "README.md", BENCH_DIR.parent / "docs" / "training.md")
"""Other pages with generated blocks (the demo's output: ``results/demo.json``)."""


def update_results_doc(
    results_dir: Path, doc: Path = DOC, other_docs: tuple[Path, ...] | None = None
) -> list[str]:
    """Replace every generated block of ``doc`` (and of ``other_docs``: by default
    ``OTHER_DOCS`` when ``doc`` is docs/results.md, else none) whose JSON exists; return the
    names updated (``page:name`` for the other pages)."""
    if not doc.exists():
        print(f"[report] {doc} does not exist; nothing to update", file=sys.stderr)
        return []
    text, updated = _update_blocks(doc.read_text(), results_dir, "")
    gpu_dir = results_dir / "gpu"  # run.py --device cuda writes there (item 6)
    if gpu_dir.is_dir():
        text, gpu_updated = _update_blocks(text, gpu_dir, "gpu-")
        updated += gpu_updated
    doc.write_text(text)
    print(f"[report] refreshed {doc.name}: {', '.join(updated) or 'nothing'}")
    for page in OTHER_DOCS if other_docs is None and doc == DOC else other_docs or ():
        if not page.exists():
            continue
        text, names = _update_blocks(page.read_text(), results_dir, "")
        names = [n for n in names if n != "machine"]
        if names:
            page.write_text(text)
            print(f"[report] refreshed {page.name}: {', '.join(names)}")
            updated += [f"{page.name}:{n}" for n in names]
    return updated


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else BENCH_DIR / "results"
    update_results_doc(folder)
