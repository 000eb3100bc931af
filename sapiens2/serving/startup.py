"""Gradio's start-up check made patient: once its server runs, Gradio asks it for the page with a 3-second
limit and, at the first answer that comes later, stops with "When localhost is not accessible, a shareable
link must be created", though the server is up. On a busy machine (a Space starting beside its model
downloads, a CPU shared by many processes) the first page can take longer than that."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

START_SECONDS = 120.0  # as long as an image decoding worker may take to start on a busy machine


def answers(url: str, seconds: float = START_SECONDS) -> bool:
    """Whether the server at `url` answers a HEAD request for its page (a redirect or a login counts) within
    `seconds`, asking again while the connection is refused or dropped."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            status = httpx.head(url, timeout=max(0.1, deadline - time.monotonic())).status_code
            return status < 400 or status == 401
        except httpx.TransportError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


@contextmanager
def patient_start(seconds: float = START_SECONDS) -> Iterator[None]:
    """For the block, Gradio's launch waits up to `seconds` for its running server's first answer."""
    from gradio import networking

    impatient = networking.url_ok
    networking.url_ok = lambda url: answers(url, seconds)
    try:
        yield
    finally:
        networking.url_ok = impatient
