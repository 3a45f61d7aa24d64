"""The HTML token viewer: escaping, structure, and a real render in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gmts.analysis.html import render_html, write_html
from gmts.analysis.report import SELECTION_NAMES, selections

NASTY = "<script>alert('x')</script>&\""


def _analysis(make):
    g = torch.Generator().manual_seed(1)
    entropy = torch.rand(4, 5, generator=g) + 0.05
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[3, 3:] = False
    a = make(entropy, entropy * 2, mask, torch.tensor([1.0, 0.0, 0.0, 1.0]), 2)
    a.token_text[0][1] = NASTY
    a.token_text[1][0] = "line\nbreak"
    a.prompts = ["1+2=<b>", "1+2=<b>", "3+4=", "3+4="]
    return a


def test_page_structure_and_escaping(synthetic_analysis):
    a = _analysis(synthetic_analysis)
    sel = selections(a, 0.25)
    page = render_html(a, sel, title="t <i>", ratio=0.25)
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)" in page
    assert "1+2=&lt;b&gt;" in page and "t &lt;i&gt;" in page
    assert page.count("class='tok'") == int(a.response_mask.sum()) == 18
    assert page.count("class='group'") == 2 and page.count("class='answer'") == 4
    assert "http://" not in page and "https://" not in page  # nothing fetched from a network
    # each token carries its selection bits in SELECTION_NAMES order
    bits = re.findall(r'data-sel="([01]+)"', page)
    assert len(bits) == 18 and all(len(b) == len(SELECTION_NAMES) for b in bits)
    gmts = SELECTION_NAMES.index("gmts")
    assert sum(b[gmts] == "1" for b in bits) == int(sel["gmts"].sum())
    with pytest.raises(ValueError, match="selected"):
        render_html(a, {"gmts": sel["gmts"]})


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
        )
        if path:
            return path
    return None


def test_page_renders_in_headless_chromium(synthetic_analysis, tmp_path: Path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH or in /usr/bin (install Debian's chromium)")
    a = _analysis(synthetic_analysis)
    sel = selections(a, 0.25)
    page = write_html(a, sel, tmp_path / "tokens.html", ratio=0.25)
    common = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,900",
    ]
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", page.as_uri()],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    # the script ran and coloured the tokens picked by GMTS and/or ETS
    assert 'data-rendered="1"' in dom
    picked = (sel["gmts"] | sel["entropy"]).sum().item()
    assert f'data-highlighted="{picked}"' in dom
    classes = re.findall(r'class="tok (sel-a|sel-b|sel-both)"', dom)
    assert len(classes) == picked
    assert classes.count("sel-both") == int((sel["gmts"] & sel["entropy"]).sum())
    assert "&lt;script&gt;alert" in dom  # still text after rendering, never executed markup
