"""How many places of the model queue one client may hold: its requests waiting or running, at most N.

Gradio's queue takes requests from anyone up to its size, so one client naming one upload in many calls
could hold every place. The share is checked where Gradio files a request (its queue's `push`, behind both
/gradio_api/queue/join and /gradio_api/call/<name>): the client's events in the model group, waiting or
running, are counted from the queue itself, so a request is counted exactly until Gradio is done with it.
One more is refused at once with HTTP 429 and a sentence. A client is its address, as the upload quota
counts it (`SAPIENS2_TRUSTED_PROXIES`). Gradio has no public hook there: `share_the_queue` checks, when it
is installed, that the queue still has the parts it counts, and fails loudly if not.

Gradio also answers queued events directly, outside the queue, on /gradio_api/run/<name> and
/gradio_api/api/<name> (by name, or any event by its `fn_index`) whenever the app does not run on a Space:
such a call skips the queue's size, this share, the concurrency group and the device time. Those routes
are closed to every queued event (Gradio's `api_open`, as on a Space: HTTP 404 and its sentence), and every
model event must be queued, so each one reaches the model through `push`, whatever the route.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException

from sapiens2.serving.uploads import client_address
from sapiens2.settings import current

SHARE_ENV = "SAPIENS2_MAX_QUEUED_PER_CLIENT"


def share_the_queue(demo: Any, concurrency_id: str) -> None:
    """Refuse a client's model request (events of `concurrency_id`) beyond its share of `demo`'s queue, and
    close the routes that answer queued events outside the queue."""
    queue = demo._queue
    for part in ("push", "active_jobs", "event_queue_per_concurrency_id"):
        if not hasattr(queue, part):
            raise RuntimeError(f"Gradio's queue has no {part!r}: the per-client share cannot be counted.")
    unqueued = [
        fn.api_name or str(fn._id)
        for fn in demo.fns.values()
        if fn.concurrency_id == concurrency_id and not fn.queue
    ]
    if unqueued:
        raise RuntimeError(f"Model events outside the queue skip its shares: {', '.join(unqueued)}.")
    demo.api_open = False
    share = current().max_queued_per_client
    trusted_proxies = current().trusted_proxies
    push = queue.push

    async def shared_push(body: Any, request: Any, username: str | None) -> Any:
        fn = demo.fns.get(body.fn_index) if body.fn_index is not None else None
        client = client_of(request, trusted_proxies)
        if fn is not None and fn.concurrency_id == concurrency_id and client is not None:
            if held_by(queue, concurrency_id, client, trusted_proxies) >= share:
                raise HTTPException(status_code=429, detail=refusal(share))
        return await push(body=body, request=request, username=username)

    queue.push = shared_push


def client_of(request: Any, trusted_proxies: int) -> str | None:
    """The client who sent a request Gradio files (its address, as the upload quota counts it)."""
    scope = getattr(request, "scope", None)
    return client_address(scope, trusted_proxies) if scope is not None else None


def held_by(queue: Any, concurrency_id: str, client: str, trusted_proxies: int) -> int:
    """Events of `concurrency_id` that `client` has in Gradio's `queue`, waiting or running."""
    waiting = queue.event_queue_per_concurrency_id.get(concurrency_id)
    events = [*(waiting.queue if waiting else ()), *(e for job in queue.active_jobs if job for e in job)]
    mine = (e for e in events if client_of(e.request, trusted_proxies) == client)
    return sum(1 for event in mine if event.concurrency_id == concurrency_id)


def refusal(share: int) -> str:
    places = "one request" if share == 1 else f"{share} requests"
    return (
        f"Request refused: you already have {places} waiting or running, this server's limit per person, "
        "so that everyone gets a turn. Please wait for an answer before sending more."
    )
