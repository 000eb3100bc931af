"""The one boundary between where photos are decoded and drawn and where the models run: plain data across.

`run_device_work` is the one device runner, called on a model host (`sapiens2.runtime.Host.run_work`): the
plain app and the command line (in process), a ZeroGPU worker and a Ray model actor all run a batch's model
steps through it.

The task runner runs a pipeline's leading CPU steps where the photo was decoded, then hands the rest of its
steps to the host as a `DeviceWork`: the task's name, the checkpoint, the task's checked options, the photos
with what those steps left (arrays and CPU tensors), a picklable progress reporter and the number of a
cancellation flag. What comes back is a `DeviceOutcome`: each photo's values as CPU tensors, the notes, the
timings and any error, as data. No closure, lock, runner or host crosses, so the same `run_device_work`
serves a plain server and the command line (in process) and a ZeroGPU worker forked from the web process
(`sapiens2.serving.zerogpu`), where both sides are pickled.

Cancellation cannot travel as a pickled object (a copy would never see the flag change), so the flags live
in memory mapped before any fork and shared by it: `CANCEL_FLAGS`.
"""

from __future__ import annotations

import copy
import logging
import multiprocessing
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Protocol

from sapiens2.outputs.results import TaskOptions, Timings
from sapiens2.pipelines.context import ModelHost, PipelineContext
from sapiens2.pipelines.steps import Photo, StepValues, detached
from sapiens2.progress import Progress
from sapiens2.runtime.jobs import Cancelled, Job, running
from sapiens2.tasks.registry import get_task

log = logging.getLogger("sapiens2.device")

FLAG_COUNT = 256  # requests that can be on the device side at once, far more than the queue lets in
WATCH_SECONDS = 0.05  # how often a waiting caller copies its request's cancellation into the shared flag


@dataclass(frozen=True)
class DeviceWork:
    """What the device side is asked to do: steps `first_step` up to `stop` (None: the last) of `task`'s
    pipeline on `photos`."""

    task: str
    repo_id: str
    options: TaskOptions  # the task's own, checked
    first_step: int
    photos: list[Photo]
    progress: Progress | None = None
    ticket: int | None = None  # the shared cancellation flag to watch; None: the caller's own job
    stop: int | None = None

    @property
    def count(self) -> int:
        return len(self.photos)


@dataclass
class PhotoValues:
    """One photo's part of the outcome: what the device steps left for the finish, and their timings."""

    values: StepValues
    timings: Timings
    seconds: dict[str, float]


@dataclass
class DeviceOutcome:
    """What the device side gives back: per photo values, notes for the user, any error, and its costs."""

    photos: list[PhotoValues] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: BaseException | None = None
    seconds: float = 0.0  # the device side's own time for this work
    loads: int = 0  # models it had to load for this work (0 when they were already in memory)

    def applied_to(self, photos: Sequence[Photo], context: PipelineContext) -> None:
        """Put the outcome into the caller's photos and context, or raise its error there."""
        if self.error is not None:
            raise self.error
        for photo, part in zip(photos, self.photos, strict=True):
            photo.values, photo.timings, photo.seconds = part.values, part.timings, part.seconds
        for note in self.notes:
            context.note(note)


class DeviceHost(ModelHost, Protocol):
    """What runs device work: the pipelines' host (`sapiens2.runtime.Host`), counting its model loads."""

    @property
    def loads(self) -> int: ...


def run_device_work(host: DeviceHost, work: DeviceWork, portable: bool = True) -> DeviceOutcome:
    """Run the work's steps with `host`'s models; every failure comes back as the outcome's error, so a
    worker that runs this never dies of a bad photo and can serve the next call. `portable`: the values
    copied to the CPU and the error made picklable, for an outcome that crosses a process (in process the
    values stay where the steps left them and the error is the one raised)."""
    start = time.perf_counter()
    loads_before = host.loads
    entry = get_task(work.task)
    context = PipelineContext(host, entry, work.repo_id, work.options, work.progress)
    outcome = DeviceOutcome()
    try:
        with _cancellation(work.ticket):
            entry.pipeline.run_steps(context, work.photos, work.first_step, work.stop)
        copied = detached if portable else copy.copy
        outcome.photos = [
            PhotoValues(copied(photo.values), photo.timings, dict(photo.seconds)) for photo in work.photos
        ]
        outcome.notes = list(context.notes)
    except Exception as error:  # noqa: BLE001 - returned to the caller, who raises it
        outcome.error = _portable(error) if portable else error
    outcome.seconds = time.perf_counter() - start
    outcome.loads = host.loads - loads_before
    return outcome


@contextmanager
def _cancellation(ticket: int | None) -> Iterator[None]:
    if ticket is None:  # in process: the caller's job is already the current one
        yield
        return
    with running(CANCEL_FLAGS.job(ticket)):
        yield


def _portable(error: Exception) -> Exception:
    """The error itself when it survives pickling, else one that says the same thing."""
    if isinstance(error, Cancelled):
        return Cancelled()
    try:  # what the worker's queue will do with it, and the copy the caller's side will rebuild
        ForkingPickler.dumps(error)
        copy.deepcopy(error)
    except Exception:  # noqa: BLE001 - any failure to round-trip means: send a plain copy
        log.exception("device work failed with an error that cannot be sent back")
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class CancelFlags:
    """Cancellation flags in shared memory, made before any fork: the caller sets one, a forked worker
    reads it between batches. `watching(job)` lends a flag that follows `job` while the block runs."""

    def __init__(self, count: int = FLAG_COUNT):
        self._flags = multiprocessing.RawArray("b", count)
        self._free = list(range(count))
        self._lock = threading.Lock()

    @contextmanager
    def watching(self, job: Job | None) -> Iterator[int]:
        with self._lock:
            if not self._free:
                raise RuntimeError("too many requests on the device side at once")
            ticket = self._free.pop()
        self._flags[ticket] = 0
        done = threading.Event()
        watcher = threading.Thread(target=self._follow, args=(job, ticket, done), daemon=True)
        if job is not None:
            watcher.start()
        try:
            yield ticket
        finally:
            done.set()
            if job is not None:
                watcher.join()
            with self._lock:
                self._free.append(ticket)

    def _follow(self, job: Job, ticket: int, done: threading.Event) -> None:
        while not done.wait(WATCH_SECONDS):
            if job.cancelled:
                self._flags[ticket] = 1
                return

    def cancelled(self, ticket: int) -> bool:
        return bool(self._flags[ticket])

    def job(self, ticket: int) -> Job:
        """The job a worker runs under: cancelled once the caller sets the flag."""
        return Job(lambda: not self.cancelled(ticket))


CANCEL_FLAGS = CancelFlags()
