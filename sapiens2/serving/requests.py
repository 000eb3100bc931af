"""What every request of the web app goes through: only uploaded files read, a cancellable job on a
thread, the device held for the model work alone and within the request's device time, errors as
sentences and the output limit checked.

`run_until_stopped` runs blocking work on a thread for an asyncio caller and, when the caller is cancelled,
flags the job and waits until the work has really stopped before letting the cancellation go on: whoever
counts running requests by their coroutine (Gradio's queue) sees the slot free only once it is.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import gradio as gr
from gradio.utils import get_upload_folder, is_in_or_equal

from sapiens2.errors import DeviceTimeError
from sapiens2.progress import Progress
from sapiens2.runtime.jobs import Cancelled, Job, current_job, running
from sapiens2.runtime.messages import describe_error, is_expected
from sapiens2.serving.device_slot import DeviceSlot
from sapiens2.serving.device_time import DeviceBudget
from sapiens2.serving.disk_room import check_room
from sapiens2.serving.scratch import ScratchSpace
from sapiens2.serving.uploads import client_address
from sapiens2.vision.images import sanitize_filename
from sapiens2.vision.limits import Limits

T = TypeVar("T")
log = logging.getLogger("sapiens2.app")

NOT_UPLOADED = "Only uploaded files are read, never a path on the server. Please upload the file itself."
CANCELLED = "The request was cancelled."
WAITING = "Waiting for the model: the work before this one is finishing"


def upload(payload: Any) -> tuple[str | None, str]:
    """The uploaded file's path (None when nothing was sent) and a safe stem for the download names.

    Only files in Gradio's upload folder are read: Gradio checks file payloads marked as files, but passes a
    bare {"path": ...} through unchecked, and that path must never open a file of the server.
    """
    if not isinstance(payload, dict):
        return None, "photo"
    path = payload.get("path")
    if path is not None and not _in_upload_folder(str(path)):
        raise gr.Error(NOT_UPLOADED, print_exception=False)
    name = sanitize_filename(payload.get("orig_name") or "photo", default="photo")
    return path, Path(name).stem or "photo"


def _in_upload_folder(path: str) -> bool:
    try:
        return is_in_or_equal(path, get_upload_folder())
    except (ValueError, OSError):  # a NUL byte, a loop of links
        return False


def option_value(value: Any) -> Any:
    """An option's raw value from the page; an uploaded image becomes its file path."""
    return upload(value)[0] if isinstance(value, dict) else value


def reporter(progress: gr.Progress | None) -> Progress | None:
    """The runtime's progress(fraction, text) callback drawn as the page's progress bar."""
    if progress is None:
        return None
    return PageProgress(progress)


@dataclass
class PageProgress:
    """A request's progress bar as the runtime's progress(fraction, text): plain data that pickles, so a
    device worker can report through it (Gradio sends its updates to the page from wherever it is called).
    The bar never goes back: a text without a fraction, or with a smaller one, keeps the bar where it is."""

    bar: gr.Progress
    shown: float = 0.0

    def __call__(self, fraction: float | None, text: str) -> None:
        self.shown = max(self.shown, fraction or 0.0)
        self.bar(self.shown, desc=text)


# Where a one-photo request's stages sit on its progress bar (Gradio 6 shows a text only with a fraction):
# the model's loading fills the first LOADING_SHARE with its own fraction, each later stage starts here.
LOADING_SHARE = 0.3
STAGE_SHARES = (
    ("detecting", 0.35),
    ("running the model", 0.5),
    ("running the body-part model", 0.65),  # normals' and depth's background, after their own model
    ("drawing", 0.8),
    ("writing files", 0.95),
)


@dataclass
class StagedProgress:
    """A one-photo request's progress bar: stage texts, which come without a fraction, placed by the stage
    they name; fractions (a model's loading) scaled into the bar's first part. The bar only grows: a second
    model's loading, or a stage it does not know, keeps it where it is, with the new text. It pickles."""

    bar: gr.Progress | None
    shown: float = 0.0

    def place(self, fraction: float | None, text: str) -> float:
        """Where the bar stands after this report."""
        if fraction is None:
            fraction = next((share for start, share in STAGE_SHARES if text.startswith(start)), 0.0)
        else:
            fraction = LOADING_SHARE * fraction
        self.shown = max(self.shown, fraction)
        return self.shown

    def __call__(self, fraction: float | None, text: str) -> None:
        self.bar(self.place(fraction, text), desc=text)


def stage(report: Progress | None, text: str) -> None:
    """Tell the page what the request is doing now."""
    if report is not None:
        report(None, text)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turns any failure into a gr.Error with a sentence saying what happened and what to do."""
    try:
        yield
    except (gr.Error, Cancelled):
        raise
    except Exception as error:
        if is_expected(error):
            log.info("request refused: %s", describe_error(error))  # the operator's sentence, with paths
        else:
            log.exception("request failed")
        raise gr.Error(describe_error(error, public=True), print_exception=False) from error


def check_output(scratch: ScratchSpace, folder: Path) -> None:
    """Refuse a request's files when they take more than the output limit, more than the disk Gradio
    copies them to has free, or more than the client's share of answers (the folder, taken with
    `ScratchSpace.request_folder`, goes with the refusal); else hand them over (the folder goes once Gradio
    has its copy)."""
    size = scratch.folder_bytes(folder)
    Limits.of().check_output(size)
    check_room(size)
    scratch.hand_over(folder, _client(scratch.trusted_proxies))


@contextmanager
def holding_device(slot: DeviceSlot, report: Progress | None) -> Iterator[None]:
    """Hold the device for a request's model work, after the requests before it (the page is told while it
    waits), charged to the request's device time; pictures and files are written after, off the device,
    while the next request runs."""
    with slot.request(current_job(), on_wait=lambda: stage(report, WAITING)):
        yield


def cancellable(handler: Callable, budget: DeviceBudget | None = None) -> Callable:
    """The handler as Gradio runs it: on a thread, as a job that cancelling can stop, within the device
    time `budget` gives the request and its client.

    Cancelling the request (Job.cancel() in gradio_client, the page's stop button) or closing the page
    stops the work at its next check between batches, frames or tasks; Gradio's own slot is given back
    only once the work has stopped, so no cancelled work runs on beside the next request. A request that
    uses up its device time stops at the same checks, with a sentence; a client with none left is refused
    before it waits.
    """

    if inspect.isgeneratorfunction(handler):
        return _cancellable_stream(handler, budget)

    @functools.wraps(handler)
    async def run(*args: Any) -> Any:
        job = _request_job(budget)
        try:
            return await run_until_stopped(None, job, handler, *args)
        except Cancelled:
            raise gr.Error(CANCELLED, print_exception=False) from None

    return run


def _cancellable_stream(handler: Callable, budget: DeviceBudget | None) -> Callable:
    """`cancellable` for a generator handler: each step on a thread under the request's one job; a stream
    that ends early (cancelled, its page closed) cancels the job and waits for the work to stop."""

    @functools.wraps(handler)
    async def stream(*args: Any) -> AsyncIterator[Any]:
        job = _request_job(budget)
        steps = handler(*args)
        finished = False
        try:
            while (value := await run_until_stopped(None, job, next, steps, _END)) is not _END:
                yield value
            finished = True
        except Cancelled:
            raise gr.Error(CANCELLED, print_exception=False) from None
        finally:
            if not finished:
                job.cancel()
                await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, steps.close))

    return stream


_END = object()


def _request_job(budget: DeviceBudget | None) -> Job:
    """The job of the request running in this context, with its client's device time; a client with none
    left is refused."""
    account = None
    if budget is not None:
        try:
            account = budget.account(_client(budget.trusted_proxies))
        except DeviceTimeError as error:
            raise gr.Error(describe_error(error, public=True), print_exception=False) from None
    return Job(_client_connected(), budget=account)


def _client(trusted_proxies: int) -> str:
    """Who sent the request running in this context: its address, as the upload quota counts it."""
    from gradio.context import LocalContext

    request = getattr(LocalContext.request.get(None), "request", None)
    scope = getattr(request, "scope", None)
    return client_address(scope, trusted_proxies) if scope is not None else "unknown"


def _client_connected() -> Callable[[], bool] | None:
    """Whether the client of the request running in this context is still connected.

    Gradio marks a running event as no longer alive when its page is closed, but does not stop it: the
    work asks this between batches. Gradio has no public call for it; if its internals change, the work
    simply runs to its end as before.
    """
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return None

    def connected() -> bool:
        try:
            events = [event for job in queue.active_jobs if job for event in job if event._id == event_id]
            return all(event.alive for event in events)
        except Exception:  # Gradio's internals changed: never cancel on a guess
            return True

    return connected


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
