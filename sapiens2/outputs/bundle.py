"""One zip of a request's files, each under its task's folder: what All tasks offers beside the list."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path


def write_zip(path: str | os.PathLike, files: Sequence[str | os.PathLike], root: str | os.PathLike) -> Path:
    """`path`: a zip of `files`, each stored under its path relative to `root` (its task's folder first);
    written under a temporary name and renamed when complete, so a half-written zip is never offered."""
    path, root = Path(path), Path(root)
    partial = path.with_name(f".{path.name}.partial")
    try:
        # Level 1: PNGs are compressed already, .npy and .ply shrink about as much at level 1 as at 6.
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
            for file in map(Path, files):
                archive.write(file, file.relative_to(root).as_posix())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
