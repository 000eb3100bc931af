"""One zip of a request's files, each under its task's folder: what All tasks offers beside the list."""

from __future__ import annotations

import os
import secrets
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

from sapiens2.outputs.partial_files import partial

SAMPLE_BYTES = 256 * 1024  # read at three places of a file to judge whether it compresses
WORTH_DEFLATING = 0.8  # a file is deflated when its samples shrink to at most this fraction of their size


def write_zip(path: str | os.PathLike, files: Sequence[str | os.PathLike], root: str | os.PathLike) -> Path:
    """`path`: a zip of `files`, each stored under its path relative to `root` (its task's folder first);
    written under a temporary name and renamed when complete, so a half-written zip is never offered."""
    path, root = Path(path), Path(root)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
    with partial(temporary, _new_zip) as archive:
        with archive:
            for file in map(Path, files):
                archive.write(file, file.relative_to(root).as_posix(), compress_type=member_compression(file))
        os.replace(temporary, path)
    return path


def member_compression(file: Path) -> int:
    """Deflate a file only where it pays: PNGs, float arrays of a photo and point clouds shrink by a tenth
    or less and would cost seconds each at 12 megapixels, so they are stored as they are. Judged by the
    median of three samples (start, middle, end), so a header or a trailer does not decide."""
    size = file.stat().st_size
    if size <= 3 * SAMPLE_BYTES:
        samples = [file.read_bytes()]
    else:
        with open(file, "rb") as reader:
            samples = []
            for offset in (0, size // 2, size - SAMPLE_BYTES):
                reader.seek(offset)
                samples.append(reader.read(SAMPLE_BYTES))
    ratios = sorted(len(zlib.compress(sample, 1)) / len(sample) for sample in samples if sample)
    worth = bool(ratios) and ratios[len(ratios) // 2] <= WORTH_DEFLATING
    return zipfile.ZIP_DEFLATED if worth else zipfile.ZIP_STORED


def _new_zip(path: Path) -> zipfile.ZipFile:
    return zipfile.ZipFile(path, "x", compression=zipfile.ZIP_DEFLATED, compresslevel=1)
