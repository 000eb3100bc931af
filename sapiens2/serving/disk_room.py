"""Room on the disk Gradio keeps its copies on: every upload, and every answer's pictures and files.

Gradio writes uploads and copies each answer's files into its cache folder itself, after the app is done;
on a full disk that gave an HTTP 500 or a bare "Error" and left half-written files. The room is therefore
checked before an upload is taken (from its stated length) and before an answer is handed over (from the
size of its files), so a full disk gets the sentence the app's own scratch folders give, and nothing is
written in part.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from gradio.utils import get_upload_folder

from sapiens2.errors import OutOfSpaceError

MB = 1_000_000
# Kept free beyond what a request needs, for the uploads and answers of the requests running beside it:
# 64 MB, or a tenth of a smaller disk.
RESERVE_BYTES = 64 * MB
UPLOAD_REFUSED = "Upload refused: the server's disk is full just now. Please try again in a few minutes."


def has_room(needed: int, folder: Path | None = None) -> bool:
    """Whether `needed` bytes fit on the disk of `folder` (default: Gradio's cache folder, or its nearest
    parent that exists) with the reserve to spare."""
    folder = Path(folder or get_upload_folder()).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    disk = shutil.disk_usage(folder)
    return needed + min(RESERVE_BYTES, disk.total // 10) <= disk.free


def check_room(needed: int, folder: Path | None = None) -> None:
    """Raise OutOfSpaceError (the disk-full sentence) unless `needed` bytes fit with the reserve to spare."""
    if not has_room(needed, folder):
        raise OutOfSpaceError(errno.ENOSPC, f"no room for {needed} bytes of answers in Gradio's cache folder")
