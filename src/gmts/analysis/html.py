"""A self-contained HTML page of the sampled answers, tokens coloured by which method picks them.

No network: CSS and JS are inline. Tokens are rendered on the server side (escaped with
``html.escape``) and carry their measurements as data attributes; a small script colours them
by the two methods chosen in the page's controls (GMTS vs ETS by default: blue = GMTS only,
orange = ETS only, purple = both; intensity = the score relative to the batch maximum) and
shows a hover box with E, p, omega, delta, ||grad l||. Answers are grouped by question with
their reward and advantage.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import torch

from gmts.analysis.collect import TokenAnalysis
from gmts.analysis.report import SELECTION_NAMES

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 6px} .meta{color:#555;font-size:13px;margin-bottom:10px}
.controls{position:sticky;top:0;background:#fafafa;padding:6px 0;border-bottom:1px solid #ddd;
 z-index:2;font-size:13px}
.legend span{display:inline-block;padding:1px 6px;margin-right:8px;border-radius:3px}
.group{background:#fff;border:1px solid #ddd;border-radius:6px;margin:12px 0;padding:8px 12px}
.group h2{font-size:15px;margin:2px 0 6px;font-weight:600}
.answer{display:flex;align-items:baseline;gap:10px;padding:3px 0;border-top:1px dashed #eee}
.badge{font-size:12px;min-width:150px;color:#555;font-family:monospace}
.ok{color:#0a7a2f;font-weight:600} .bad{color:#b3261e}
.tokens{font-family:ui-monospace,monospace;font-size:15px;white-space:pre-wrap;line-height:1.9}
.tok{padding:1px 1px;border-radius:2px;cursor:default}
.tok.sel-a{background:rgba(31,119,180,var(--a))} .tok.sel-b{background:rgba(255,127,14,var(--a))}
.tok.sel-both{background:rgba(148,52,160,var(--a));color:#fff}
.swatch-a{background:rgb(31,119,180);color:#fff} .swatch-b{background:rgb(255,127,14)}
.swatch-both{background:rgb(148,52,160);color:#fff}
#hover{position:fixed;display:none;background:#fff;border:1px solid #888;border-radius:4px;
 padding:6px 8px;font-size:12px;font-family:monospace;box-shadow:0 2px 6px rgba(0,0,0,.2);
 z-index:5;pointer-events:none;white-space:pre}
"""

_JS = """
(function(){
  const names = JSON.parse(document.getElementById('names').textContent);
  const selA = document.getElementById('method-a'), selB = document.getElementById('method-b');
  const toks = Array.from(document.querySelectorAll('.tok'));
  function paint(){
    const a = names.indexOf(selA.value), b = names.indexOf(selB.value);
    let count = 0;
    for (const t of toks){
      const sel = t.dataset.sel.split(''), inten = t.dataset.int.split(',').map(Number);
      const inA = sel[a] === '1', inB = sel[b] === '1';
      t.classList.remove('sel-a','sel-b','sel-both');
      let alpha = 0;
      if (inA && inB){ t.classList.add('sel-both'); alpha = Math.max(inten[a], inten[b]); }
      else if (inA){ t.classList.add('sel-a'); alpha = inten[a]; }
      else if (inB){ t.classList.add('sel-b'); alpha = inten[b]; }
      if (inA || inB){ count++; t.style.setProperty('--a', (0.25 + 0.75*alpha).toFixed(3)); }
    }
    document.getElementById('label-a').textContent = selA.value + ' only';
    document.getElementById('label-b').textContent = selB.value + ' only';
    const s = document.getElementById('status');
    s.textContent = count + ' highlighted tokens';
    document.body.dataset.highlighted = String(count);
    document.body.dataset.rendered = '1';
  }
  selA.addEventListener('change', paint); selB.addEventListener('change', paint);
  const box = document.getElementById('hover');
  document.addEventListener('mouseover', function(ev){
    const t = ev.target.closest ? ev.target.closest('.tok') : null;
    if (!t){ box.style.display = 'none'; return; }
    const picked = names.filter(function(_, i){ return t.dataset.sel[i] === '1'; });
    box.textContent = 'token  ' + JSON.stringify(t.dataset.text) +
      '\\nE      ' + t.dataset.e + '\\np      ' + t.dataset.p + '\\neps    ' + t.dataset.eps +
      '\\nomega  ' + t.dataset.omega + '\\ndelta  ' + t.dataset.delta +
      '\\n||grad l||       ' + t.dataset.gl + '\\n||grad log pi||  ' + t.dataset.glp +
      '\\nG (logit grad)   ' + t.dataset.g + '\\nselected by: ' + (picked.join(', ') || '-');
    box.style.display = 'block';
  });
  document.addEventListener('mousemove', function(ev){
    box.style.left = (ev.clientX + 14) + 'px'; box.style.top = (ev.clientY + 14) + 'px';
  });
  paint();
})();
"""


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _visible(text: str) -> str:
    """Token text made visible: newlines shown as a return sign, other text as is."""
    return text.replace("\n", "\u21b5\n") if text else "\u2205"


def render_html(
    analysis: TokenAnalysis,
    selected: dict[str, torch.Tensor],
    *,
    title: str = "gmts token analysis",
    ratio: float | None = None,
) -> str:
    """The page as a string.

    Args:
        analysis: the measured tokens.
        selected: name -> ``(B, T)`` bool selection for every name in ``SELECTION_NAMES``
            (from :func:`gmts.analysis.report.selections`).
        ratio: rho, shown in the header.
    """
    missing = [n for n in SELECTION_NAMES if n not in selected]
    if missing:
        raise ValueError(f"selected: missing selections {missing}")
    a = analysis
    m = a.response_mask
    scale = {}  # each score's largest value: a token's colour intensity is its score over it
    for name in SELECTION_NAMES:
        top = float(a.scores[name][m].max()) if bool(m.any()) else 0.0
        scale[name] = top if top > 0 else 1.0
    parts = [_header(a, title, ratio)]
    for q in range(a.num_groups):
        rows = (a.group_ids == q).nonzero().flatten().tolist()
        if rows:
            parts.append(_question(a, q, rows, selected, scale))
    names_json = json.dumps(list(SELECTION_NAMES)).replace("<", "\\u003c")
    parts.append(f"<script type='application/json' id='names'>{names_json}</script>")
    parts.append("<div id='hover'></div>")
    parts.append(f"<script>{_JS}</script></body></html>")
    return "".join(parts)


def _header(a: TokenAnalysis, title: str, ratio: float | None) -> str:
    """The page's head, title, run description and the two method selectors."""
    esc = html.escape
    meta = a.meta
    meta_text = ", ".join(
        f"{k}: {meta[k]}" for k in ("model", "task", "questions", "samples", "seed") if k in meta
    )
    rho = f"top-{ratio:g} selections, batch scope; " if ratio is not None else ""
    options = "".join(f"<option value='{esc(n)}'>{esc(n)}</option>" for n in SELECTION_NAMES)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{esc(title)}</h1>"
        f"<div class='meta'>{esc(meta_text)}<br>{esc(rho)}{esc(str(meta.get('omega', '')))}</div>"
        "<div class='controls'>compare <select id='method-a'>"
        + options.replace("value='gmts'", "value='gmts' selected")
        + "</select> with <select id='method-b'>"
        + options.replace("value='entropy'", "value='entropy' selected")
        + "</select> &nbsp; <span class='legend'><span class='swatch-a' id='label-a'>gmts only</span>"
        "<span class='swatch-b' id='label-b'>entropy only</span>"
        "<span class='swatch-both'>both</span></span> <span id='status'></span>"
        " &nbsp; (hover a token for its numbers)</div>"
    )


def _question(
    a: TokenAnalysis,
    q: int,
    rows: list[int],
    selected: dict[str, torch.Tensor],
    scale: dict[str, float],
) -> str:
    """One question group: its prompt and expected answer, then each answer's tokens."""
    esc = html.escape
    first = rows[0]
    parts = [
        f"<div class='group' data-group='{q}'><h2>question {q}: "
        f"<code>{esc(a.prompts[first])}</code> &rarr; expected <code>{esc(a.answers[first])}</code>"
        f" &nbsp; mean reward {float(a.rewards[rows].mean()):.2f}</h2>"
    ]
    for b in rows:
        reward, adv = float(a.rewards[b]), float(a.advantages[b])
        cls = "ok" if reward > 0 else "bad"
        parts.append(
            f"<div class='answer' data-row='{b}'><span class='badge'>"
            f"<span class='{cls}'>R={reward:g}</span> A={adv:+.3f}</span><span class='tokens'>"
        )
        parts.extend(_token(a, b, t, selected, scale) for t in range(int(a.response_mask[b].sum())))
        parts.append("</span></div>")
    parts.append("</div>")
    return "".join(parts)


def _token(
    a: TokenAnalysis,
    b: int,
    t: int,
    selected: dict[str, torch.Tensor],
    scale: dict[str, float],
) -> str:
    """Token ``t`` of answer ``b``: its text, with its selections and numbers as attributes."""
    esc = html.escape
    text = a.token_text[b][t] if t < len(a.token_text[b]) else ""
    sel = "".join("1" if bool(selected[name][b, t]) else "0" for name in SELECTION_NAMES)
    inten = ",".join(
        f"{min(1.0, float(a.scores[name][b, t]) / scale[name]):.3f}" for name in SELECTION_NAMES
    )
    attrs = {
        "data-text": text,
        "data-sel": sel,
        "data-int": inten,
        "data-e": _fmt(float(a.entropy[b, t])),
        "data-p": _fmt(float(a.prob[b, t])),
        "data-eps": _fmt(float(a.eps[b, t])),
        "data-omega": _fmt(float(a.omega[b, t])),
        "data-delta": _fmt(float(a.scores["gmts"][b, t])),
        "data-gl": _fmt(float(a.grad_objective_norm[b, t])),
        "data-glp": _fmt(float(a.grad_logprob_norm[b, t])),
        "data-g": _fmt(float(a.logit_grad_norm[b, t])),
    }
    attr_text = " ".join(f'{k}="{esc(v, quote=True)}"' for k, v in attrs.items())
    return f"<span class='tok' {attr_text}>{esc(_visible(text))}</span>"


def write_html(
    analysis: TokenAnalysis,
    selected: dict[str, torch.Tensor],
    path: str | Path,
    **kwargs: Any,
) -> Path:
    """Write :func:`render_html`'s page to ``path`` (UTF-8); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(analysis, selected, **kwargs), encoding="utf-8")
    return path
