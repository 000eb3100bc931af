"""One zip of a request's files, each under its task's folder: what All tasks offers beside the list."""

from __future__ import annotations

import os
import secrets
import zipfile
from collections.abc import Sequence
from pathlib import Path

from sapiens2.outputs.partial_files import partial


def write_zip(path: str | os.PathLike, files: Sequence[str | os.PathLike], root: str | os.PathLike) -> Path:
    """`path`: a zip of `files`, each stored under its path relative to `root` (its task's folder first);
    written under a temporary name and renamed when complete, so a half-written zip is never offered."""
    path, root = Path(path), Path(root)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
    with partial(temporary, _new_zip) as archive:
        with archive:
            for file in map(Path, files):
                archive.write(file, file.relative_to(root).as_posix())
        os.replace(temporary, path)
    return path


def _new_zip(path: Path) -> zipfile.ZipFile:
    # Level 1: PNGs are compressed already, .npy and .ply shrink about as much at level 1 as at 6.
    return zipfile.ZipFile(path, "x", compression=zipfile.ZIP_DEFLATED, compresslevel=1)
