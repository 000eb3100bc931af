"""A blocking piece of a generator handler's work run on a thread beside it, its progress reports coming
out as the generator's yields: how one event shows several progress texts at once (All tasks' tiles)."""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sapiens2.progress import Progress
from sapiens2.serving.requests import StagedProgress

T = TypeVar("T")
_DONE = object()


@dataclass
class Relay:
    """The work's progress(fraction, text), placed once as a one-photo request's stages (only growing), and
    that one fraction sent to the page's bar and to the generator, so a tile and the whole run's bar agree.
    It pickles (to a device worker) without the generator's side, which only this process can read."""

    page: Progress | None
    tell: Callable[[float, str], None] | None
    staged: StagedProgress = field(default_factory=lambda: StagedProgress(None))

    def __call__(self, fraction: float | None, text: str) -> None:
        placed = self.staged.place(fraction, text)
        if self.page is not None:
            self.page(placed, text)
        if self.tell is not None:
            self.tell(placed, text)

    def __reduce__(self) -> tuple:
        return Relay, (self.page, None, self.staged)


def streamed(
    work: Callable[[Progress], T], show: Callable[[float, str], Any], page: Progress | None = None
) -> Generator[Any, None, T]:
    """Run `work(report)` on a thread, yielding `show(fraction, text)` for its latest report each time the
    caller asks, and return what it returns (or raise what it raises). The thread runs in this context
    (the request's job, its progress bar), and a closed generator waits for it to end."""
    reports: queue.SimpleQueue = queue.SimpleQueue()
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = work(Relay(page, lambda fraction, text: reports.put((fraction, text))))
        except BaseException as error:  # handed to the caller, whose thread raises it
            outcome["error"] = error
        finally:
            reports.put(_DONE)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(call,), daemon=True)
    thread.start()
    try:
        while True:
            batch = [reports.get()]
            while not reports.empty():
                batch.append(reports.get())
            news = [report for report in batch if report is not _DONE]
            if news:
                yield show(*news[-1])  # only the newest report is shown
            if any(report is _DONE for report in batch):
                break
    finally:
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
