"""Files the server writes are its own: on a shared host, other users cannot read answers or uploads."""

from __future__ import annotations

import os
from pathlib import Path


def keep_files_private(cache_dir: str | Path) -> None:
    """Make every file and folder the server creates from now on readable by its own user only, and the
    Gradio cache `cache_dir` (made when missing) and what it holds already, closed to others."""
    os.umask(0o077)
    folder = Path(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for path in [folder, *folder.rglob("*")]:  # what Gradio copied in before (examples keep their mode)
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & 0o700)
