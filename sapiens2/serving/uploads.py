"""How much one client may upload: a quota per client and one for everyone, over the life of an upload.

The web server keeps every upload until its cache cleaner deletes it (the app asks for files older than
`window` seconds to go). Counting what each client sent over that same window bounds what one client can
store at any time, whatever the size of each file (which the server caps on its own). The count is kept as
the body streams in: a request that would go over is answered 429 (or 503 when everyone's total is full)
before the rest of its body is read, and from its Content-Length alone when it says one.

A client is its network address. Behind a reverse proxy (a Hugging Face Space) every request comes from the
proxy, so `trusted_proxies` says how many proxies in front of the server add themselves to
X-Forwarded-For: the address that many hops from the end of that header is the client's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Any

from sapiens2.errors import ConfigError

QUOTA_MB_ENV = "SAPIENS2_UPLOAD_QUOTA_MB"
TOTAL_MB_ENV = "SAPIENS2_UPLOAD_TOTAL_MB"
PROXIES_ENV = "SAPIENS2_TRUSTED_PROXIES"
DEFAULT_QUOTA_MB = 200
DEFAULT_TOTAL_MB = 4000
MB = 1_000_000

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


def env_number(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdecimal() or int(raw) < minimum:
        raise ConfigError(f"{name} must be a whole number of at least {minimum}, not {raw!r}.")
    return int(raw)


class UploadLedger:
    """Bytes uploaded per client and in all over the last `window` seconds."""

    def __init__(self, quota_bytes: int, total_bytes: int, window: float):
        self.quota_bytes = quota_bytes
        self.total_bytes = total_bytes
        self.window = window
        self._lock = threading.Lock()
        self._sent: dict[str, deque[tuple[float, int]]] = defaultdict(deque)

    def _forget_old(self, now: float) -> None:
        for client in list(self._sent):
            entries = self._sent[client]
            while entries and entries[0][0] < now - self.window:
                entries.popleft()
            if not entries:
                del self._sent[client]

    def used(self, client: str) -> tuple[int, int]:
        """(bytes this client sent, bytes everyone sent) within the window."""
        with self._lock:
            self._forget_old(time.monotonic())
            mine = sum(size for _, size in self._sent.get(client, ()))
            return mine, sum(size for entries in self._sent.values() for _, size in entries)

    def take(self, client: str, size: int) -> str | None:
        """Count `size` more bytes from `client`; a sentence (and nothing counted) when over a quota."""
        with self._lock:
            now = time.monotonic()
            self._forget_old(now)
            mine = sum(s for _, s in self._sent.get(client, ()))
            everyone = sum(s for entries in self._sent.values() for _, s in entries)
            minutes = f"{self.window / 60:.0f} minutes"
            if mine + size > self.quota_bytes:
                return (
                    f"Upload refused: this would bring what you uploaded in the last {minutes} above the "
                    f"limit of {self.quota_bytes / MB:.0f} MB per person (uploads are kept for {minutes}). "
                    "Please try again later, or send smaller files."
                )
            if everyone + size > self.total_bytes:
                return (
                    "Upload refused: the server's space for uploads is full just now. Please try again in a "
                    "few minutes."
                )
            self._sent[client].append((now, size))
            return None


def client_address(scope: Scope, trusted_proxies: int) -> str:
    """The client's address: the peer's, or the one `trusted_proxies` hops back in X-Forwarded-For."""
    peer = (scope.get("client") or ("unknown", 0))[0]
    if trusted_proxies <= 0:
        return peer
    forwarded = [
        part.strip()
        for name, value in scope.get("headers", [])
        if name.lower() == b"x-forwarded-for"
        for part in value.decode("latin-1").split(",")
        if part.strip()
    ]
    return forwarded[-trusted_proxies] if len(forwarded) >= trusted_proxies else peer


class UploadQuota:
    """ASGI middleware counting the bodies of upload requests (paths ending in /upload) per client."""

    def __init__(self, app: Callable, *, window: float, ledger: UploadLedger | None = None):
        self.app = app
        self.ledger = ledger or UploadLedger(
            env_number(QUOTA_MB_ENV, DEFAULT_QUOTA_MB, 1) * MB,
            env_number(TOTAL_MB_ENV, DEFAULT_TOTAL_MB, 1) * MB,
            window,
        )
        self.trusted_proxies = env_number(PROXIES_ENV, 0, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not scope["path"].endswith("/upload"):
            await self.app(scope, receive, send)
            return
        client = client_address(scope, self.trusted_proxies)
        headers = scope.get("headers", [])
        declared = next((value for name, value in headers if name.lower() == b"content-length"), None)
        if declared is not None and declared.isdigit():
            refusal = self.ledger.take(client, int(declared))
            if refusal:
                await _refuse(send, refusal, self.ledger)
                return
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, self._counted(client, receive), tracked)
        except UploadRefused as refused:
            if not started:
                await _refuse(send, str(refused), self.ledger)

    def _counted(self, client: str, receive: Receive) -> Receive:
        """`receive` counting each chunk of a body sent without a length; over quota, the body ends there."""

        async def counted() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                refusal = self.ledger.take(client, len(message.get("body", b"")))
                if refusal:
                    raise UploadRefused(refusal)
            return message

        return counted


class UploadRefused(Exception):  # noqa: N818
    """A body sent without a length went over a quota while it streamed in."""


async def _refuse(send: Send, sentence: str, ledger: UploadLedger) -> None:
    status = 503 if sentence.startswith("Upload refused: the server's") else 429
    body = json.dumps({"detail": sentence}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.append((b"retry-after", str(int(ledger.window)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
