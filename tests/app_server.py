"""A real Sapiens2 Studio server for tests: tiny random checkpoints, a tiny detector, a free local port.

The server runs in the test process (Gradio's own threads), so tests can look at its runtime and cache
while talking to it over HTTP like any client.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import gradio_client
import httpx
import pytest

import app
from sapiens2.runtime.cache import ModelCache
from sapiens2.runtime.runtime import Runtime
from sapiens2.serving.connections import PER_CLIENT_ENV
from sapiens2.serving.device_time import CLIENT_SECONDS_ENV
from sapiens2.serving.live_streams import SHARE_ENV as LIVE_SHARE_ENV
from sapiens2.serving.queue_share import SHARE_ENV
from sapiens2.serving.scratch import ScratchSpace

ASSETS = Path(__file__).resolve().parents[1] / "assets"
PHOTOS = (ASSETS / "grace_hopper.jpg", ASSETS / "astronaut.png")


class Client(gradio_client.Client):
    """gradio_client's Client, safe to call again as soon as an answer came back.

    One Client shares a single message stream among its requests, and the server closes that stream right
    after the last answer it owes. A request sent in between (the next predict() of a loop, before the
    client has read the close) is filed under the stream about to close, and when the close arrives
    gradio_client ends it with an empty concurrent.futures.CancelledError, though the server runs it: the
    load test lost 1 request in 200 that way. Waiting, before each request, for a stream with nothing
    pending to finish closing removes that window. (Requests sent from several threads through one Client
    at once can still fall into it: the load test gives each thread its own Client.)
    """

    def submit(self, *args, **kwargs):
        self.settle()
        return super().submit(*args, **kwargs)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until a message stream with no request left has been closed by the server."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.pending_lock:
                if not self.stream_open or self.pending_event_ids:
                    return
            time.sleep(0.005)


@dataclass
class Server:
    url: str
    runtime: Runtime
    demo: gr.Blocks
    scratch: ScratchSpace

    def client(self, download_files: bool = True) -> Client:
        """A client of the server; without `download_files` it gets each file's address, not its bytes."""
        return Client(self.url, verbose=False, download_files=download_files)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tiny_detector(folder: Path) -> str:
    """A random-weight yolo11n built from its yaml (no download) with COCO's class 0, saved as a .pt file."""
    import torch

    from sapiens2.vision.detector import _import_ultralytics

    _import_ultralytics()  # as the server imports it: without its replacement of PIL.Image.open
    from ultralytics import YOLO

    torch.manual_seed(0)
    model = YOLO("yolo11n.yaml")
    model.model.names = {index: f"class {index}" for index in range(80)} | {0: "person"}
    path = folder / "tiny_detector.pt"
    model.save(str(path))
    return str(path)


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then put the old values back."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def small_disk(folder: Path, size_kb: int) -> Iterator[Path]:
    """`folder` as a tmpfs of `size_kb` KiB, really full once something writes past it, for the block
    (mounting needs root: the test is skipped without)."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("a small file system cannot be mounted here (needs root)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@contextmanager
def running_app(
    checkpoint_dir: Path,
    detector: str,
    scratch_root: Path,
    cache: ModelCache | None = None,
    local: dict[str, dict[str, str]] | None = None,
) -> Iterator[Server]:
    """The app on a free 127.0.0.1 port, offline, loading checkpoints from `checkpoint_dir`.

    Every test client comes from 127.0.0.1, so tests that play many users at once lift the per-client
    share of the queue, of device time, of connections and of live places, unless they set them (the tests
    of those shares do).
    """
    settings = {
        "SAPIENS2_CHECKPOINT_DIR": str(checkpoint_dir),
        "HF_HUB_OFFLINE": "1",
        "YOLO_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        SHARE_ENV: os.environ.get(SHARE_ENV, "1000"),
        CLIENT_SECONDS_ENV: os.environ.get(CLIENT_SECONDS_ENV, "100000"),
        PER_CLIENT_ENV: os.environ.get(PER_CLIENT_ENV, "1000"),
        LIVE_SHARE_ENV: os.environ.get(LIVE_SHARE_ENV, "1000"),
    }
    with environment(**settings):
        runtime = Runtime(device="cpu", dtype="fp32", detector=detector, cache=cache)
        scratch = ScratchSpace(scratch_root)
        demo = app.build_app(runtime, scratch, local)
        port = free_port()
        app.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
        try:
            yield Server(f"http://127.0.0.1:{port}/", runtime, demo, scratch)
        finally:
            wait_until_idle(demo)
            demo.close()


def wait_until_idle(demo: gr.Blocks, timeout: float = 120.0) -> None:
    """Wait for the requests still running (a last webcam frame, say) to end before the server stops.

    A request cut off by the end of the test process can abort the interpreter from inside torch.
    """
    deadline = time.monotonic() + timeout
    while any(job is not None for job in demo._queue.active_jobs) and time.monotonic() < deadline:
        time.sleep(0.1)


def first_stream_answer(url: str, session: str, timeout: float = 120) -> dict:
    """A stream's first answer (a frame's outputs, or its end with an error) as a page reads it from
    Gradio's queue; then the page goes away."""
    params = {"session_hash": session}
    with httpx.stream("GET", f"{url}gradio_api/queue/data", params=params, timeout=timeout) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: "):
                message = json.loads(line[len("data: ") :])
                if message.get("msg") in ("process_streaming", "process_completed"):
                    return message
    raise AssertionError("the stream ended without an answer")
