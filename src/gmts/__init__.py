"""gmts: token-selective RLVR (GMTS, ETS, GRPO, DAPO) for language models.

``import gmts`` imports torch and nothing else heavy; the core API below is torch-only.
"""

from gmts.core import *  # noqa: F403
from gmts.core import __all__ as _core_all

__version__ = "0.1.0"

__all__ = ["__version__", *_core_all]
