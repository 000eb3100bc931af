"""Files and folders being written under a temporary name, known to the process so that a stop removes them.

Every writer makes its temporary through `partial`, renames it into place when complete and removes it when
it fails. A stop signal cannot wait for a writer (it may be held by a slow disk or a long encode), so the
signal's handler calls `stop_writing`: from then on no writer makes a temporary or a folder, and those being
written are removed, so the process can end at once without leaving a half-written file behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

# Reentrant: a stop signal's handler runs on the main thread, possibly while that thread makes a temporary.
_lock = threading.RLock()
_being_written: set[Path] = set()
_stopped = False


class WritingStopped(RuntimeError):
    """The process is stopping: nothing new is written."""

    def __init__(self) -> None:
        super().__init__("the process is stopping: nothing more is written")


@contextlib.contextmanager
def partial(path: str | os.PathLike, make: Callable[[Path], object]) -> Iterator[Path]:
    """`make(path)` creates the temporary `path` (a file or a folder); it is removed when the block fails,
    and by `stop_writing` while the block runs. The block renames it into place."""
    path = Path(path)
    with _lock:
        if _stopped:
            raise WritingStopped
        made = make(path)
        _being_written.add(path)
    try:
        yield made
    except BaseException:
        _remove(path)
        raise
    finally:
        with _lock:
            _being_written.discard(path)


def make_folder(folder: str | os.PathLike) -> Path:
    """`folder` and its parents, made unless the process is stopping (a stop's cleanup is never undone)."""
    folder = Path(folder)
    with _lock:
        if _stopped:
            raise WritingStopped
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def stop_writing() -> None:
    """From now on nothing is written through `partial` or `make_folder`; the temporaries being written are
    removed."""
    global _stopped
    with _lock:
        _stopped = True
        paths = list(_being_written)
    for path in paths:
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
