"""One piece of work at a time on the device, and work that stops when its request is cancelled.

`Job` is a request's cancellation flag; the work checks it between batches, frames and tasks
(`check_cancelled`, called by `Runtime.forward`) and stops there by raising `Cancelled`. `DeviceSlot` lends
the device to one request at a time, in arrival order, and to live-stream frames only between requests:
a frame is one short turn, taken only when the device is free, and never twice in a row while a request
waits, so a stream gets at most every other turn and never holds the device for longer than one frame.
`run_until_stopped` runs blocking work on a thread for an asyncio caller and, when the caller is cancelled,
flags the job and waits until the work has really stopped before letting the cancellation go on: whoever
counts running requests by their coroutine (Gradio's queue) sees the slot free only once it is.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
_POLL_SECONDS = 0.05


class Cancelled(Exception):  # noqa: N818 (not an error: the request's owner asked for it)
    """The request was cancelled; the work stopped at its next check."""


class Job:
    """A request's cancellation flag; `alive()`, when given, is asked too (False once the client left)."""

    def __init__(self, alive: Callable[[], bool] | None = None):
        self._cancelled = threading.Event()
        self._alive = alive

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        if self._cancelled.is_set():
            return True
        if self._alive is not None and not self._alive():
            self._cancelled.set()
        return self._cancelled.is_set()

    def check(self) -> None:
        """Raise Cancelled when the request was cancelled."""
        if self.cancelled:
            raise Cancelled()


_CURRENT: contextvars.ContextVar[Job | None] = contextvars.ContextVar("sapiens2_job", default=None)


def current_job() -> Job | None:
    """The job of the work running in this context, if any."""
    return _CURRENT.get()


def check_cancelled() -> None:
    """Raise Cancelled when the current job (if any) was cancelled: a point where work may stop."""
    job = _CURRENT.get()
    if job is not None:
        job.check()


@contextmanager
def running(job: Job) -> Iterator[Job]:
    """Make `job` the current job for the block."""
    token = _CURRENT.set(job)
    try:
        yield job
    finally:
        _CURRENT.reset(token)


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
        """Hold the device for a request's whole work, waiting for the requests before it.

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


async def run_until_stopped(executor: Executor | None, job: Job, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on a thread with `job` current; if the caller is cancelled meanwhile, the job is
    cancelled and this waits for the work to end before raising CancelledError in turn."""
    context = contextvars.copy_context()  # carries the web framework's request context (progress bars)

    def call() -> T:
        with running(job):
            return work(*args)

    future = asyncio.get_running_loop().run_in_executor(executor, context.run, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        job.cancel()
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                continue
            except Exception:  # the work's own end (Cancelled, most often): the cancellation goes on
                break
        if not future.cancelled():
            future.exception()  # retrieved, so that asyncio does not log it as never retrieved
        raise
