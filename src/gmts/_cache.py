"""Where gmts keeps what it builds once and reuses: warm starts, converted models.

``$GMTS_CACHE`` when set, else ``~/.cache/gmts``; each user of the cache has its own folder
below it (``warmstart/``, ``models/``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir"]

CACHE_ENV = "GMTS_CACHE"


def cache_dir(name: str) -> Path:
    """``$GMTS_CACHE/<name>`` when GMTS_CACHE is set, else ``~/.cache/gmts/<name>`` (not created)."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "gmts"
    return base / name
