"""A bounded scratch area: one fresh folder per request under one root, the oldest folders deleted."""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
import time
from pathlib import Path

DEFAULT_KEEP = 64


class ScratchSpace:
    """Hands out per-request folders under `root`, keeping only the newest `keep` of them on disk.

    Files are only needed until the web server has copied them into its own cache, which happens as soon
    as the request returns, so a few dozen folders are plenty even under load.
    """

    def __init__(self, root: str | Path | None = None, keep: int = DEFAULT_KEEP):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="sapiens2-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def new_folder(self) -> Path:
        """A new empty folder; the oldest folders beyond `keep` are deleted first. The root is made again
        when something (a temporary-file cleaner) deleted it."""
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            self._prune(self.keep - 1)
            folder = self.root / f"{time.time_ns():020d}-{next(self._counter):06d}"
            folder.mkdir()
            return folder

    def folders(self) -> list[Path]:
        """Folders held now, oldest first."""
        try:
            return sorted(path for path in self.root.iterdir() if path.is_dir())
        except FileNotFoundError:
            return []

    def size_bytes(self) -> int:
        """Bytes of every file under the root."""
        return self.folder_bytes(self.root)

    @staticmethod
    def folder_bytes(folder: Path) -> int:
        """Bytes of every file under `folder` (0 when it is gone)."""
        total = 0
        for path in Path(folder).rglob("*"):
            try:
                total += path.lstat().st_size if path.is_file() else 0
            except OSError:  # deleted meanwhile
                pass
        return total

    def discard(self, folder: Path) -> None:
        """Delete one folder handed out before."""
        shutil.rmtree(folder, ignore_errors=True)

    def remove(self) -> None:
        """Delete the root and everything in it."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _prune(self, keep: int) -> None:
        folders = self.folders()
        for folder in folders[: max(0, len(folders) - keep)]:
            shutil.rmtree(folder, ignore_errors=True)
