"""Where specq keeps its files, and the environment variables that move them."""

from __future__ import annotations

import os
from pathlib import Path


def specq_home() -> Path:
    """$SPECQ_HOME, default ~/.cache/specq: models, the SQLite database, cached wheels."""
    return Path(os.environ.get("SPECQ_HOME") or Path.home() / ".cache" / "specq")
