"""How large a request other than an upload may be, and what its JSON may name.

Uploads have their own cap and quota (sapiens2.serving.uploads); every other request (queue joins, API
calls, stream frames) carries a small JSON body. Its bytes are counted as they arrive, so a body without a
Content-Length is cut off as soon as it goes over, and a body over the limit is answered 413 before it is
read. A body within the limit is read whole here and then handed on, which lets the guard look inside.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sapiens2.serving.uploads import MB, Receive, Scope, Send, answer, declared_length
from sapiens2.settings import current


class BodyLimit:
    """ASGI middleware: bodies of requests other than uploads are at most `limit_bytes` long."""

    def __init__(self, app: Callable, limit_bytes: int | None = None):
        self.app = app
        self.limit_bytes = limit_bytes or current().max_body_mb * MB

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].endswith("/upload"):
            await self.app(scope, receive, send)
            return
        if asks_for_an_address(scope["path"]):
            await answer(send, 403, FILE_ADDRESS_REFUSED)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.limit_bytes:
            await answer(send, 413, self._too_large())
            return
        body, last = await self._read(receive)
        if body is None:
            await answer(send, 413, self._too_large())
            return
        if names_an_address(body):
            await answer(send, 400, ADDRESS_REFUSED)
            return
        await self.app(scope, _replay(body, last, receive), send)

    async def _read(self, receive: Receive) -> tuple[bytes | None, dict]:
        """The whole body, or None as soon as it passes the limit; and the last message received."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit_bytes:
                return None, message
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), message

    def _too_large(self) -> str:
        return (
            f"Request refused: its body is larger than this server's limit of "
            f"{self.limit_bytes / MB:g} MB for a request. Send photos and videos as uploads "
            "(gradio_client's handle_file does), not inside the request itself."
        )


ADDRESS_REFUSED = (
    "Request refused: a file in it is given as a web address, and this server does not fetch files from "
    "the web. Please download the file and upload it (gradio_client's handle_file does)."
)


FILE_ADDRESS_REFUSED = (
    "Request refused: /file= serves only the files this server made or was sent; it does not fetch web "
    "addresses. Please open the address yourself."
)


def asks_for_an_address(path: str) -> bool:
    """Whether a request asks Gradio's /file= route for a web address (Gradio would fetch it)."""
    _, marker, target = path.partition("/file=")
    return bool(marker) and (":/" in target or target.lstrip("/").lower().startswith(("http:", "https:")))


def names_an_address(body: bytes) -> bool:
    """Whether a JSON body holds a file whose `path` is a web address (Gradio would download it)."""
    try:
        data = json.loads(body)
    except ValueError:
        return False  # Gradio answers bodies that are not JSON itself
    pending = [data]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str) and path.strip().lower().startswith(("http:", "https:")):
                return True
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _replay(body: bytes, last: dict, receive: Receive) -> Receive:
    """`receive` giving the body already read in one message, then the client's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    if last["type"] != "http.request":
        pending.append(last)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed
