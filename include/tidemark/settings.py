"""Where Tidemark keeps local files, from ``TIDEMARK_*`` variables: one home for each location.

Every layer may import this leaf; it imports nothing of Tidemark's.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Downloaded jars, the embedded cluster and the driver's class archive: ``TIDEMARK_CACHE_DIR``."""
    return Path(os.environ.get("TIDEMARK_CACHE_DIR", Path.home() / ".cache" / "tidemark"))
