"""Work that stops when its request is cancelled.

`Job` is a request's cancellation flag and its budget; the work checks it between batches, frames and
tasks (`check_cancelled`, called by `Runtime.forward`) and stops there by raising `Cancelled`, or the
budget's own error once the request went over it (the app's device time).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Cancelled(Exception):  # noqa: N818 (not an error: the request's owner asked for it)
    """The request was cancelled; the work stopped at its next check."""


class Budget(Protocol):
    """What a request may spend of the device: `holding()` counts a block as spent (the device slot holds
    it around each hold), `check()` raises its own error (a LimitError) once the request went over."""

    def holding(self) -> AbstractContextManager: ...

    def check(self) -> None: ...


class Job:
    """A request's cancellation flag; `alive()`, when given, is asked too (False once the client left),
    and `budget.check()` (when given) at each check."""

    def __init__(self, alive: Callable[[], bool] | None = None, budget: Budget | None = None):
        self._cancelled = threading.Event()
        self._alive = alive
        self.budget = budget

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
        """Raise Cancelled when the request was cancelled, or the budget's error when it went over it."""
        if self.cancelled:
            raise Cancelled()
        if self.budget is not None:
            self.budget.check()


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
