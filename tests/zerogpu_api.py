"""A stand-in for ZeroGPU's device API on 127.0.0.1, the one part of a ZeroGPU Space that cannot run here.

It answers the four calls the real `spaces` client makes (/startup-report, /schedule, /allow, /release) and
records them: the durations asked for, the worker processes allowed on the GPU. `idle=True` tells spaces
that the GPU stayed idle since the last call, so it reuses its worker; `idle=False` that the GPU served
someone else meanwhile, so it forks a fresh worker for every call. In that case the platform takes the GPU
back from the previous worker, which ends it: the stand-in does the same (SIGTERM, which spaces' worker
answers by leaving its loop).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


@dataclass
class DeviceApi:
    idle: bool = True
    durations: list[int] = field(default_factory=list)  # seconds asked for, one per GPU call
    pids: list[int] = field(default_factory=list)  # worker processes allowed, in order
    releases: list[bool] = field(default_factory=list)  # `fail` of each release
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, dict | None]:
        with self.lock:
            if path == "/startup-report":
                return 200, None
            if path == "/schedule":
                self.durations.append(int(query.get("durationSeconds", "0")))
                if not self.idle:
                    self._reclaim()
                token = f"token-{len(self.durations)}"
                return 200, {"idle": self.idle, "nvidiaIndex": 0, "nvidiaUUID": "GPU-0", "allowToken": token}
            if path == "/allow":
                self.pids.append(int(query["pid"]))
                return 200, None
            if path == "/release":
                self.releases.append(query.get("fail", "false").lower() == "true")
                return 200, None
            return 404, None

    def _reclaim(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def serve(api: DeviceApi) -> tuple[ThreadingHTTPServer, str]:
    """Serve `api` on a free 127.0.0.1 port, on a daemon thread; returns the server and its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            url = urlparse(self.path)
            status, body = api.answer(url.path, {k: v[-1] for k, v in parse_qs(url.query).items()})
            payload = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"
