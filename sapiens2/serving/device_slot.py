"""One piece of work at a time on the device.

`DeviceSlot` lends the device to one request at a time, in arrival order, and to live-stream frames only
between requests: a frame is one short turn, taken only when the device is free, and never twice in a row
while a request waits, so a stream gets at most every other turn and never holds the device for longer than
one frame. Each request's hold is timed and charged to its job's budget (sapiens2.serving.device_time),
so every entry point counts the same.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from sapiens2.runtime.jobs import Cancelled, Job

_POLL_SECONDS = 0.05


class DeviceSlot:
    """The device, lent to one request at a time in arrival order, and to stream frames between them."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._busy = False
        self._waiting: deque[object] = deque()
        self._frame_ran_last = False
        self.turns = {"request": 0, "frame": 0, "frame dropped": 0}

    @property
    def busy(self) -> bool:
        """Whether a request or a frame holds the device now."""
        with self._condition:
            return self._busy

    @property
    def waiting(self) -> int:
        """Requests waiting for the device now."""
        with self._condition:
            return len(self._waiting)

    @contextmanager
    def request(self, job: Job | None = None, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the device for a piece of a request's work, waiting for the requests before it; the hold
        is charged to the job's budget.

        A job cancelled while waiting leaves the line (Cancelled); `on_wait()` is called once if it waits.
        """
        ticket = object()
        with self._condition:
            self._waiting.append(ticket)
            try:
                while self._busy or self._waiting[0] is not ticket:
                    if on_wait is not None:
                        on_wait()
                        on_wait = None
                    self._condition.wait(_POLL_SECONDS)
                    if job is not None and job.cancelled:
                        raise Cancelled()
            finally:
                self._waiting.remove(ticket)
                self._condition.notify_all()
            self._busy = True
            self._frame_ran_last = False
            self.turns["request"] += 1
        try:
            with job.budget.holding() if job is not None and job.budget is not None else nullcontext():
                yield
        finally:
            self._release()

    @contextmanager
    def frame(self) -> Iterator[bool]:
        """Try to hold the device for one stream frame: True when it was free and it is the stream's turn
        (nobody waits, or a request ran last); False means the frame should be dropped."""
        with self._condition:
            granted = not self._busy and not (self._waiting and self._frame_ran_last)
            if granted:
                self._busy = True
                self._frame_ran_last = True
                self.turns["frame"] += 1
            else:
                self.turns["frame dropped"] += 1
        try:
            yield granted
        finally:
            if granted:
                self._release()

    def _release(self) -> None:
        with self._condition:
            self._busy = False
            self._condition.notify_all()
