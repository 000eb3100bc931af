"""Stopping a server cleanly on SIGTERM and SIGINT: its own files removed, then an immediate, quiet exit.

Left to the interpreter, a stop signal either skips every cleanup (SIGTERM's default kills the process
where it stands, leaving the scratch folder behind) or runs the interpreter's teardown while native worker
threads (torch's, OpenCV's FFmpeg decoders) still run, which C++ answers with "terminate called without an
active exception" and an abort. Here the cleanup runs first, then the process ends at once with status 0.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable

log = logging.getLogger("sapiens2.serving.shutdown")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_cleanly_on_signals(cleanup: Callable[[], None]) -> None:
    """On SIGTERM or SIGINT (Ctrl+C): run `cleanup()`, flush the logs and exit with status 0."""

    def stop(signum: int, _frame: object) -> None:
        log.info("stopping on %s", signal.Signals(signum).name)
        status = 0
        try:
            cleanup()
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
