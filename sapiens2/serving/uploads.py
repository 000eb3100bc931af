"""How much one client may upload: a quota per client and one for everyone, over the life of an upload.

The web server keeps every upload until its cache cleaner deletes it (the app asks for files older than
`window` seconds to go). Counting what each client sent over that same window bounds what one client can
store at any time, whatever the size of each file (which the server caps on its own). Only bytes that
arrived are counted, chunk by chunk as the body streams in: a request that stops early counts what it sent.
A chunk that would go over is answered 429 (or 503 when everyone's total is full) and the rest of the body
is not read; a Content-Length above what is left is refused up front, but a stated length is never charged.

A client is its network address. Behind a reverse proxy every request comes from the proxy, so
`trusted_proxies` says how many proxies in front of the server each append the address they received
from to X-Forwarded-For (a Hugging Face Space's proxy does: set 1 there). Only the right-most
`trusted_proxies` entries were written by those proxies; the client's is the left-most of them, and
anything further left is whatever the client sent, never used.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sapiens2.serving.disk_room import UPLOAD_REFUSED, has_room
from sapiens2.settings import current

MB = 1_000_000
BUCKETS_PER_WINDOW = 240  # 10 s buckets for the app's 40 minutes

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class UploadLedger:
    """Bytes uploaded per client and in all over the last `window` seconds.

    Bytes are filed in time buckets (`window / BUCKETS_PER_WINDOW` seconds each) with running totals, so
    counting a chunk costs O(1) and forgetting costs one step per (bucket, client) ever filed: amortised
    O(1) per chunk, whatever the history. A byte is forgotten between one and two buckets after `window`.
    """

    def __init__(
        self, quota_bytes: int, total_bytes: int, window: float, clock: Callable[[], float] = time.monotonic
    ):
        self.quota_bytes = quota_bytes
        self.total_bytes = total_bytes
        self.window = window
        self.clock = clock
        self._bucket_seconds = max(window / BUCKETS_PER_WINDOW, 1e-3)
        self._lock = threading.Lock()
        self._buckets: deque[tuple[int, dict[str, int]]] = deque()
        self._per_client: dict[str, int] = {}
        self._everyone = 0

    @property
    def stored_entries(self) -> int:
        """How many (bucket, client) counts the ledger holds: its memory, and its work to forget."""
        return sum(len(sent) for _, sent in self._buckets)

    def _forget_old(self, bucket: int) -> None:
        while self._buckets and self._buckets[0][0] < bucket - BUCKETS_PER_WINDOW:
            for client, size in self._buckets.popleft()[1].items():
                self._everyone -= size
                left = self._per_client[client] - size
                if left:
                    self._per_client[client] = left
                else:
                    del self._per_client[client]

    def _bucket_now(self) -> int:
        bucket = int(self.clock() // self._bucket_seconds)
        self._forget_old(bucket)
        return bucket

    def used(self, client: str) -> tuple[int, int]:
        """(bytes this client sent, bytes everyone sent) within the window."""
        with self._lock:
            self._bucket_now()
            return self._per_client.get(client, 0), self._everyone

    def refusal(self, client: str, size: int) -> str | None:
        """The sentence refusing `size` more bytes from `client`, or None if they fit; nothing is counted."""
        mine, everyone = self.used(client)
        return self._over(mine, everyone, size)

    def _over(self, mine: int, everyone: int, size: int) -> str | None:
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
        return None

    def take(self, client: str, size: int) -> str | None:
        """Count `size` bytes that arrived from `client`; a sentence (nothing counted) when over a quota."""
        with self._lock:
            bucket = self._bucket_now()
            mine = self._per_client.get(client, 0)
            refusal = self._over(mine, self._everyone, size)
            if refusal:
                return refusal
            if not self._buckets or self._buckets[-1][0] != bucket:
                self._buckets.append((bucket, {}))
            sent = self._buckets[-1][1]
            sent[client] = sent.get(client, 0) + size
            self._per_client[client] = mine + size
            self._everyone += size
            return None


def client_address(scope: Scope, trusted_proxies: int) -> str:
    """The client: the peer's address, or the one `trusted_proxies` hops back in X-Forwarded-For, as
    `one_client` names it."""
    peer = (scope.get("client") or ("unknown", 0))[0]
    if trusted_proxies <= 0:
        return one_client(peer)
    forwarded = [
        part.strip()
        for name, value in scope.get("headers", [])
        if name.lower() == b"x-forwarded-for"
        for part in value.decode("latin-1").split(",")
        if part.strip()
    ]
    return one_client(forwarded[-trusted_proxies] if len(forwarded) >= trusted_proxies else peer)


def one_client(address: str) -> str:
    """The client an address stands for: an IPv4 address as it is; an IPv6 address's /64, the block one
    subscriber is given (its 2**64 addresses are one client, whatever the spelling); an IPv4 address
    written as IPv6 (::ffff:a.b.c.d) as IPv4; brackets, ports and zones dropped. Other text as it is."""
    text = address.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return address.strip()
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class UploadQuota:
    """ASGI middleware counting the bodies of upload requests (paths ending in /upload) per client."""

    def __init__(self, app: Callable, *, window: float, ledger: UploadLedger | None = None):
        self.app = app
        self.ledger = ledger or UploadLedger(
            current().upload_quota_mb * MB,
            current().upload_total_mb * MB,
            window,
        )
        self.trusted_proxies = current().trusted_proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not scope["path"].endswith("/upload"):
            await self.app(scope, receive, send)
            return
        client = client_address(scope, self.trusted_proxies)
        declared = declared_length(scope)
        refusal = self.ledger.refusal(client, declared) if declared is not None else None
        if refusal:
            await _refuse(send, refusal, self.ledger)
            return
        if declared is not None and not has_room(declared):
            await answer(send, 507, UPLOAD_REFUSED, [(b"retry-after", b"300")])
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
        """`receive` counting each chunk as it arrives; over quota, the body ends there."""

        async def counted() -> dict:
            message = await receive()
            if message["type"] == "http.request":
                refusal = self.ledger.take(client, len(message.get("body", b"")))
                if refusal:
                    raise UploadRefused(refusal)
            return message

        return counted


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, when it states one."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length" and value.isdigit():
            return int(value)
    return None


class UploadRefused(Exception):  # noqa: N818
    """A body went over a quota while it streamed in."""


async def _refuse(send: Send, sentence: str, ledger: UploadLedger) -> None:
    status = 503 if sentence.startswith("Upload refused: the server's") else 429
    await answer(send, status, sentence, [(b"retry-after", str(int(ledger.window)).encode())])


async def answer(send: Send, status: int, sentence: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """Answer the request with `status` and `sentence` as Gradio's JSON {"detail": ...}."""
    body = json.dumps({"detail": sentence}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
