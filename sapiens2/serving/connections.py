"""How many connections the server holds, and how long one may take to send its request's headers.

Uvicorn, which Gradio runs, holds a connection that sends half a request for as long as the client keeps it
open, and accepts connections until the process runs out of file descriptors; after that it logs a line for
every connection it fails to accept. So each connection here must send a whole request's headers within
`header_seconds` of connecting (or of its previous answer, on a kept-alive connection), else it is answered
408 and closed; a client address holds at most `per_client` connections (the next is answered 429 and
closed at once); and the server holds at most `total` (derived from the descriptor limit, which is raised
to its hard maximum first). When all are taken, the connection that has waited longest for its headers
makes room for the new one, so a crowd of half-sent requests from many addresses cannot keep a visitor out.
The accept error, should it still happen, is logged once a minute with a count.

Behind a reverse proxy every connection comes from the proxy: with `SAPIENS2_TRUSTED_PROXIES` set, the
per-address count is left to the proxy (the timeout and the total still hold here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from typing import Any

from sapiens2.serving.uploads import one_client
from sapiens2.settings import Settings

PER_CLIENT_ENV = "SAPIENS2_CONNECTIONS_PER_CLIENT"
DESCRIPTORS_KEPT = 256  # for the model files, uploads, answers, decode workers and logs beside connections
LOG_EVERY_SECONDS = 60.0

TOO_MANY = (
    "Too many connections from your address: this server holds at most {limit} at a time per person. "
    "Please close some and try again."
)
TOO_SLOW = (
    "The request's headers did not arrive within {seconds} seconds, this server's limit. Please try again."
)


class ConnectionGuard:
    """The connections held now: per client address, in all, and those still waiting for headers."""

    def __init__(self, header_seconds: float, per_client: int | None, total: int) -> None:
        self.header_seconds, self.per_client, self.total = header_seconds, per_client, total
        self.per_address: Counter[str] = Counter()
        self.held = 0
        self.waiting: OrderedDict[Any, None] = OrderedDict()  # oldest first
        self.refused = 0

    @classmethod
    def of(cls, settings: Settings) -> ConnectionGuard:
        """The limits `settings` give; the total, unless set, from the descriptor limit (raised to its
        maximum)."""
        descriptors = raise_descriptor_limit()
        total = settings.max_connections or max(16, descriptors - DESCRIPTORS_KEPT)
        per_client = None if settings.trusted_proxies > 0 else settings.connections_per_client
        return cls(settings.header_seconds, per_client, total)

    def admit(self, connection: Any, address: str) -> str | None:
        """Count a new connection; the sentence refusing it when its address holds its share (then it is
        not counted). When all places are taken, the longest wait for headers is closed to make room."""
        if self.per_client is not None and self.per_address[address] >= self.per_client:
            self.refused += 1
            return TOO_MANY.format(limit=self.per_client)
        if self.held >= self.total and self.waiting:
            oldest = next(iter(self.waiting))
            oldest.timed_out()
        self.per_address[address] += 1
        self.held += 1
        return None

    def release(self, address: str) -> None:
        self.held -= 1
        self.per_address[address] -= 1
        if self.per_address[address] <= 0:
            del self.per_address[address]


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 65536


def guarded_protocol(base: type, guard: ConnectionGuard) -> type:
    """Uvicorn's HTTP protocol class `base`, held to `guard`'s limits (its `guard`)."""
    _guard = guard

    class Guarded(base):  # type: ignore[misc, valid-type]
        guard = _guard
        _address: str | None = None
        _deadline: asyncio.TimerHandle | None = None
        _seen: Any = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            address = one_client(self.client[0]) if self.client else "unknown"
            refusal = guard.admit(self, address)
            if refusal:
                self._answer(429, refusal)
                return
            self._address = address
            self._await_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            if self._address is not None:
                guard.release(self._address)
                self._address = None
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # The connection goes on under uvicorn's websocket protocol, which never tells this one it
            # ended: its headers came in time, and it is counted no more.
            self._stop_waiting()
            if self._address is not None:
                guard.release(self._address)
                self._address = None
            super().handle_websocket_upgrade(*args)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._notice_request()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self._notice_request() and not self.transport.is_closing():
                self._await_headers()  # a kept-alive connection: the next request's headers, in time too

        def timed_out(self) -> None:
            """The headers are late, or the connection makes room for a newer one: answer 408 and close."""
            self._stop_waiting()
            self._answer(408, TOO_SLOW.format(seconds=f"{guard.header_seconds:g}"))

        def _notice_request(self) -> bool:
            """Whether a new request's headers have arrived (uvicorn started its cycle): then stop timing."""
            if self.cycle is not None and self.cycle is not self._seen:
                self._seen = self.cycle
                self._stop_waiting()
                return True
            return False

        def _await_headers(self) -> None:
            self._stop_waiting()
            self._deadline = self.loop.call_later(guard.header_seconds, self.timed_out)
            guard.waiting[self] = None

        def _stop_waiting(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            guard.waiting.pop(self, None)

        def _answer(self, status: int, sentence: str) -> None:
            if self.transport.is_closing():
                return
            reason = {408: "Request Timeout", 429: "Too Many Requests"}[status]
            body = ('{"detail": "' + sentence.replace('"', "'") + '"}').encode()
            head = (
                f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            )
            self.transport.write(head.encode() + body)
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


class _OncePerMinute(logging.Filter):
    """Lets one 'out of system resource' accept error through a minute, with how many were held back."""

    def __init__(self) -> None:
        super().__init__()
        self.last, self.held_back = -LOG_EVERY_SECONDS, 0
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "out of system resource" not in message and "Too many open files" not in message:
            return True
        with self.lock:
            now = time.monotonic()
            if now - self.last < LOG_EVERY_SECONDS:
                self.held_back += 1
                return False
            if self.held_back:
                record.msg = f"{record.msg} ({self.held_back} more in the last minute not logged)"
            self.last, self.held_back = now, 0
            return True


_ACCEPT_LOG = _OncePerMinute()


def quiet_accept_errors() -> None:
    """Log failures to accept a connection (a full descriptor table) at most once a minute."""
    for name in ("asyncio", "uvicorn.error"):
        logger = logging.getLogger(name)
        if _ACCEPT_LOG not in logger.filters:
            logger.addFilter(_ACCEPT_LOG)


@contextlib.contextmanager
def guarded_connections(guard: ConnectionGuard) -> Iterator[type]:
    """While the block runs, the server Gradio starts speaks uvicorn's HTTP held to `guard`; yields the
    protocol class, which `check_guarded` then finds in the running server.

    Gradio makes uvicorn's Config itself, without a way to choose the protocol: its module's `uvicorn` is
    seen, for the block, through a stand-in whose Config names the guarded protocol.
    """
    from gradio import http_server
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    protocol = guarded_protocol(AutoHTTPProtocol, guard)
    original = http_server.uvicorn

    class _Uvicorn:
        def __getattr__(self, name: str) -> Any:
            return getattr(original, name)

        @staticmethod
        def Config(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 (uvicorn's name)
            return original.Config(*args, **{**kwargs, "http": protocol})

    http_server.uvicorn = _Uvicorn()
    quiet_accept_errors()
    try:
        yield protocol
    finally:
        http_server.uvicorn = original


def check_guarded(server: Any, protocol: type) -> None:
    """Fail loudly when the running server does not use the guarded protocol (Gradio changed)."""
    if getattr(getattr(server, "config", None), "http_protocol_class", None) is not protocol:
        server.close()
        raise RuntimeError(
            "Gradio's server does not use the connection limits: it starts uvicorn differently."
        )
