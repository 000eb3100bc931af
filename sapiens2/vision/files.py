"""Opening a file that a user named: only a regular file, never a FIFO, a device, a socket or a folder.

Opening a FIFO blocks until someone writes to it, and a device can be read without end; both are refused
from the file's own kind (fstat on the opened descriptor, so a name swapped after the check changes
nothing), without waiting.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFileError(OSError):
    """The name is a FIFO, a device or a socket; `kind` says which, in words."""

    def __init__(self, kind: str):
        super().__init__(errno.EINVAL, f"not a regular file but {kind}")
        self.kind = kind


def file_kind(mode: int) -> str:
    """'a named pipe (FIFO)', 'a socket', ... for a stat mode that is not a regular file or a folder."""
    return next((words for test, words in _KINDS if test(mode)), "a special file")


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """The file at `path` opened for reading, when it is a regular file.

    Raises FileNotFoundError, IsADirectoryError, NotRegularFileError, or the OSError of the system (ELOOP for
    a loop of symbolic links, ENAMETOOLONG, EACCES, ...).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags)  # O_NONBLOCK: opening a FIFO with no writer returns at once
    try:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder")
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(file_kind(mode))
        if hasattr(os, "set_blocking"):
            os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def file_problem(error: OSError, shown: str, wanted: str) -> str:
    """The sentence for a file that cannot be opened; `shown` is its bare name, `wanted` what it should be."""
    if isinstance(error, FileNotFoundError):
        return f"No file named '{shown}' was found. Please check the name."
    if isinstance(error, IsADirectoryError):
        return f"'{shown}' is a folder, not {wanted}."
    if isinstance(error, NotRegularFileError):
        return f"'{shown}' is {error.kind}, not {wanted}. Please give a regular file."
    if error.errno == errno.ELOOP:
        return f"'{shown}' is a loop of symbolic links that never reaches a file. Please check the link."
    if error.errno == errno.ENAMETOOLONG:
        return "The file name is too long for this system. Please give a shorter name."
    return f"The file '{shown}' could not be read ({error.strerror or 'error'})."
