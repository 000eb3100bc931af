"""Webcam streams hold a live place only while their page sends frames, and never wait in the photo queue.

Gradio keeps a stream's place until its time limit: it waits for the next frame as long as the stream may
still run, and never asks whether the client is still there. `StreamWatch` ends, every half second, a
stream whose client is gone (Gradio marks the event no longer alive when its page's message stream closes)
or that has not sent a frame for SAPIENS2_STREAM_IDLE_SECONDS while none of its frames runs, the way the
page's own stop button ends it. A stream that asks to join when every live place is taken is refused at
once with a sentence, so streams never wait in Gradio's queue, whose size counts every waiting event and
would otherwise fill with streams and turn photos away; so is one beyond its client's share of the places
(`live_share`: half of them unless set, counted per address as the queue's share counts), so one client
cannot hold them all.

Gradio has no public call for either: the watch reads the queue's running events (`active_jobs`, an
event's `alive`, `closed`, `run_time` and `signal`, as Gradio's own stop route sets them) and wraps the
queue's `push`. If those internals change, streams simply run to their time limit as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import HTTPException

from sapiens2.serving.queue_share import client_of, held_by
from sapiens2.settings import current

log = logging.getLogger("sapiens2.app")

IDLE_ENV = "SAPIENS2_STREAM_IDLE_SECONDS"
SHARE_ENV = "SAPIENS2_LIVE_STREAMS_PER_CLIENT"
CHECK_SECONDS = 0.5


def idle_seconds() -> float:
    """Seconds a stream may go without a frame: $SAPIENS2_STREAM_IDLE_SECONDS, or 5."""
    return current().stream_idle_seconds


def live_share(places: int) -> int:
    """Live places one client may hold: $SAPIENS2_LIVE_STREAMS_PER_CLIENT, or half of `places`, at least 1."""
    return current().live_streams_per_client or max(1, places // 2)


def share_taken_sentence(share: int) -> str:
    streams = "a live webcam stream" if share == 1 else f"{share} live webcam streams"
    return (
        f"You already have {streams} open, this server's limit per person, so that others can use the "
        "live webcam too. Please stop one (or close its tab) and try again."
    )


def places_taken_sentence(places: int) -> str:
    return (
        f"All {places} live webcam places are taken. Please try again in a minute, or send a photo in one "
        "of the task tabs."
    )


class StreamWatch:
    """The streams of one Gradio concurrency group: frames marked as they run, idle or orphaned streams
    ended, joins beyond the group's `places` refused."""

    def __init__(self, group: str, places: int) -> None:
        self.group, self.places = group, places
        self.trusted_proxies = current().trusted_proxies  # clients are told apart as the queue's share does
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}  # event id -> frames of it running now
        self._last: dict[str, float] = {}  # event id -> when a frame of it last started or ended
        self.ended = {"client gone": 0, "idle": 0, "refused": 0}

    @contextlib.contextmanager
    def frame(self) -> Iterator[None]:
        """Marks the frame of the stream running in this context as running, until the block ends."""
        from gradio.context import LocalContext

        event_id = LocalContext.event_id.get(None)
        if event_id is None:
            yield
            return
        self._mark(event_id, +1)
        try:
            yield
        finally:
            self._mark(event_id, -1)

    def _mark(self, event_id: str, change: int) -> None:
        with self._lock:
            self._running[event_id] = self._running.get(event_id, 0) + change
            self._last[event_id] = time.monotonic()

    def end_stale(self, queue: Any) -> None:
        """End this group's running streams whose client is gone or that sent no frame for too long."""
        idle, now = idle_seconds(), time.monotonic()
        streams = [
            event
            for job in list(queue.active_jobs)
            if job
            for event in job
            if event.concurrency_id == self.group and event.streaming and not event.closed
        ]
        with self._lock:
            for event in streams:
                last = self._last.setdefault(event._id, now)
                if not event.alive:
                    self._end(event, "client gone")
                elif not self._running.get(event._id) and now - last > idle:
                    self._end(event, "idle")
            seen = {event._id for event in streams}
            for gone in set(self._last) - seen:
                self._last.pop(gone, None)
                if not self._running.get(gone):
                    self._running.pop(gone, None)

    def _end(self, event: Any, why: str) -> None:
        # What Gradio's own /stream/<id>/close does: the stream ends at its next wait for a frame.
        event.run_time = math.inf
        event.closed = True
        event.signal.set()
        self.ended[why] += 1
        log.info("live stream ended: %s", why)

    def taken(self, queue: Any) -> int:
        """Places of this group held now: streams running and streams waiting to start."""
        group = queue.event_queue_per_concurrency_id.get(self.group)
        return 0 if group is None else group.current_concurrency + len(group.queue)

    def guard_joins(self, queue: Any, fns: dict[int, Any]) -> None:
        """Make `queue` refuse a join of this group's events when all its places are taken."""
        push = queue.push

        async def push_if_room(body: Any, request: Any, username: str | None) -> tuple:
            fn = fns.get(body.fn_index) if isinstance(body.fn_index, int) else None
            if getattr(fn, "concurrency_id", None) == self.group:
                client, share = client_of(request, self.trusted_proxies), live_share(self.places)
                if client is not None and held_by(queue, self.group, client, self.trusted_proxies) >= share:
                    self.ended["refused"] += 1
                    raise HTTPException(status_code=429, detail=share_taken_sentence(share))
                if self.taken(queue) >= self.places:
                    self.ended["refused"] += 1
                    return False, places_taken_sentence(self.places), "queue_full"
            return await push(body=body, request=request, username=username)

        queue.push = push_if_room

    def lifespan(self, blocks: Any) -> Callable[[Any], contextlib.AbstractAsyncContextManager]:
        """A web app lifespan that guards the joins and runs the watch while the server runs."""

        @contextlib.asynccontextmanager
        async def watching(_app: Any) -> AsyncIterator[None]:
            self.guard_joins(blocks._queue, blocks.fns)
            task = asyncio.create_task(self._watch(blocks))
            try:
                yield
            finally:
                task.cancel()

        return watching

    async def _watch(self, blocks: Any) -> None:
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                self.end_stale(blocks._queue)
            except Exception:  # Gradio's internals changed: streams run to their time limit, as before
                log.warning("the live stream watch stopped", exc_info=True)
                return
