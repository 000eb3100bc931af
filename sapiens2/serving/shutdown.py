"""Stopping cleanly on SIGTERM and SIGINT: files being written and the server's own files removed, worker
processes ended, then an immediate, quiet exit.

Left to the interpreter, a stop signal either skips every cleanup (SIGTERM's default kills the process
where it stands, leaving the scratch folder behind) or runs the interpreter's teardown while native worker
threads (torch's, OpenCV's FFmpeg decoders) still run, which C++ answers with "terminate called without an
active exception" and an abort. Here the cleanup runs first, then the process ends at once with status 0.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from sapiens2.outputs.partial_files import stop_writing

log = logging.getLogger("sapiens2.serving.shutdown")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_cleanly_on_signals(cleanup: Callable[[], None]) -> None:
    """On SIGTERM or SIGINT (Ctrl+C): stop every writer and remove what it was writing, run `cleanup()`,
    end the worker processes, flush the logs and exit with status 0."""

    def stop(signum: int, _frame: object) -> None:
        log.info("stopping on %s", signal.Signals(signum).name)
        status = 0
        try:
            stop_writing()
            cleanup()
            _end_worker_processes()
        except Exception:  # still exit: a half-done cleanup is better than a server that will not stop
            log.exception("cleanup failed")
            status = 1
        finally:
            logging.shutdown()
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(status)

    for number in STOP_SIGNALS:
        signal.signal(number, stop)


@contextlib.contextmanager
def ending_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM or SIGINT stops every writer and removes what it was writing, then
    ends the process as the signal would have (the command line: its status says which signal stopped
    it). The handlers before are put back after; off the main thread (no handler can be set) nothing
    changes."""

    def stop(signum: int, _frame: object) -> None:
        stop_writing()
        _end_worker_processes()
        print(f"sapiens2: stopped by {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _end_worker_processes() -> None:
    """What the interpreter's exit does for multiprocessing, which os._exit and a signal's default skip:
    daemon workers ended and joined, and its temporary folder (pymp-*) removed."""
    # multiprocessing registers this function with atexit itself; it has no public name for it.
    end = getattr(multiprocessing.util, "_exit_function", None)
    if end is not None:
        end()
