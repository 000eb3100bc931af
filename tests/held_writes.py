"""Run a Python program (`-m MODULE` or a script, with its arguments) whose first file write is held.

Test-only: the first file written under a temporary name gets its first MiB, then the writer says so in
a line of its standard output (HELD and the temporary's path) and waits for ever, so a test can stop the
process while an answer is half written, at a moment it knows rather than guesses.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading

from sapiens2.outputs import exports

HELD = "held write:"
_original = exports._atomic_write
_first = threading.Lock()


def _held(path, write):
    if not _first.acquire(blocking=False):
        return _original(path, write)

    def partly(file):
        file.write(b"\0" * 2**20)
        file.flush()
        print(f"{HELD} {os.readlink(f'/proc/self/fd/{file.fileno()}')}", flush=True)
        threading.Event().wait()  # held until the process is stopped

    return _original(path, partly)


if __name__ == "__main__":  # only in the program it launches: importing HELD changes nothing
    exports._atomic_write = _held
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
