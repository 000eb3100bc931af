"""Load on the running app: many clients at once, a bounded queue, one forward at a time, flat memory.

The server runs tiny checkpoints at 256x192 (`small_mirror`) and the clients send small photos (192x256),
alternating /features and /segment, the two cheapest endpoints that run a real model, so that 220
requests take under a minute on 2 CPU cores. The clients run in another process (this file run as a
script), like users on other machines, so that this process's memory is the server's alone. The figures
measured are in docs/reliability.md.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from app_server import PHOTOS, Client, environment, free_port, running_app, tiny_detector, wait_until_idle
from gradio_client import handle_file
from gradio_client.utils import QueueError
from PIL import Image

import app
from sapiens2.runtime.runtime import Runtime
from sapiens2.serving.scratch import ScratchSpace

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = 16
WARM_UP = 20
REQUESTS = 200
MAX_GROWTH = 150 * 1024**2
ENDPOINTS = ("/features", "/segment")
PHOTO_SIZE = (192, 256)  # width, height


def write_small_photos(folder: Path, count: int) -> None:
    """`count` different 192x256 JPEG photos in `folder`, in name order (one pixel differs in each)."""
    with Image.open(PHOTOS[0]) as image:
        base = np.asarray(image.convert("RGB").resize(PHOTO_SIZE))
    for index in range(count):
        pixels = base.copy()
        pixels[index // PHOTO_SIZE[0] % PHOTO_SIZE[1], index % PHOTO_SIZE[0]] = (255, 0, 255)
        Image.fromarray(pixels).save(folder / f"photo_{index:03d}.jpg", quality=90)


def files_in(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in files_in(folder))


class Concurrency:
    """Wraps a function to count its calls and the most calls ever running at the same time."""

    def __init__(self, function: Callable):
        self.function = function
        self.running = self.most = self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        try:
            return self.function(*args, **kwargs)
        finally:
            with self.lock:
                self.running -= 1


class Clients:
    """CLIENTS API clients, each used by one thread only, sending requests and sorting the answers.

    Request i goes to ENDPOINTS[i % 2]; an answer is a result, a queue-full answer, or a failure. A Client
    is never used by two threads at once (see app_server.Client for the race that would open).
    """

    def __init__(self, url: str):
        self.url = url
        self.local = threading.local()
        self.outcomes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def send(self, photos: list[Path]) -> None:
        """Send every photo, CLIENTS at a time."""
        with ThreadPoolExecutor(CLIENTS) as pool:
            for _ in pool.map(self._one, range(len(photos)), photos):
                pass

    def _one(self, index: int, photo: Path) -> None:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = Client(self.url, verbose=False, download_files=False)
        endpoint = ENDPOINTS[index % len(ENDPOINTS)]
        try:
            outputs = client.predict(handle_file(str(photo)), api_name=endpoint)
        except QueueError:
            outcome = "queue full"
        except Exception as error:  # every other answer is a failure, kept for the report
            outcome = "failed"
            with self.lock:
                self.failures.append(f"{endpoint}: {type(error).__name__}: {error}")
        else:
            summary = outputs[-3]
            expected = "features" if endpoint == "/features" else "body-part classes found"
            outcome = "result" if expected in summary and outputs[0]["path"] else "failed"
        with self.lock:
            self.outcomes[outcome] += 1


def resident_bytes() -> tuple[int, int]:
    """This process's resident memory after a garbage collection: as it is, and once the C allocator has
    handed back the free memory it keeps (glibc's malloc_trim; the same figure elsewhere)."""
    gc.collect()
    resident = psutil.Process().memory_info().rss
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return resident, resident
    return resident, psutil.Process().memory_info().rss


def send_from_another_process(url: str, folder: Path, first: int, stop: int) -> tuple[Counter, list[str]]:
    """The answers to the photos [first:stop] of `folder`, sent by the Clients of a new process."""
    command = [sys.executable, __file__, url, str(folder), str(first), str(stop)]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environ)
    assert finished.returncode == 0, finished.stderr[-3000:]
    report = json.loads(finished.stdout.splitlines()[-1])
    return Counter(report["outcomes"]), report["failures"]


@pytest.mark.slow
def test_sixteen_clients_get_every_answer_one_forward_at_a_time_in_flat_memory(small_mirror, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    write_small_photos(folder, WARM_UP + REQUESTS)
    gradio_cache = tmp_path / "gradio"
    with environment(GRADIO_TEMP_DIR=str(gradio_cache)):
        detector = tiny_detector(tmp_path)
        with running_app(small_mirror, detector, tmp_path / "scratch") as server:
            forward = Concurrency(server.runtime.forward)
            server.runtime.forward = forward

            warm_up, failures = send_from_another_process(server.url, folder, 0, WARM_UP)
            assert warm_up == {"result": WARM_UP}, failures
            before, before_trimmed = resident_bytes()
            cache_before = folder_bytes(gradio_cache)

            start = time.perf_counter()
            outcomes, failures = send_from_another_process(server.url, folder, WARM_UP, WARM_UP + REQUESTS)
            seconds = time.perf_counter() - start
            after, after_trimmed = resident_bytes()
            scratch = server.scratch
            scratch_bytes, scratch_folders = scratch.size_bytes(), len(scratch.folders())
            cache_after = folder_bytes(gradio_cache)
    print(
        f"\n{REQUESTS} requests from {CLIENTS} clients after {WARM_UP} warm-up requests, in {seconds:.1f} s: "
        f"{outcomes['result']} results, {outcomes['queue full']} queue full, {outcomes['failed']} failed; "
        f"RSS {before / 2**20:.0f} MiB -> {after / 2**20:.0f} MiB ({(after - before) / 2**20:+.1f} MiB), "
        f"trimmed {before_trimmed / 2**20:.0f} MiB -> {after_trimmed / 2**20:.0f} MiB "
        f"({(after_trimmed - before_trimmed) / 2**20:+.1f} MiB); "
        f"most forwards at once {forward.most}; download scratch {scratch_folders} folders, "
        f"{scratch_bytes / 2**20:.2f} MiB; Gradio cache {cache_before / 2**20:.1f} -> "
        f"{cache_after / 2**20:.1f} MiB"
    )
    assert outcomes["failed"] == 0, failures
    assert outcomes["result"] + outcomes["queue full"] == REQUESTS
    assert forward.most == 1, "two forwards ran at the same time"
    assert forward.calls == WARM_UP + outcomes["result"]
    assert after - before < MAX_GROWTH and after_trimmed - before_trimmed < MAX_GROWTH
    assert scratch_folders <= scratch.keep
    assert scratch_bytes < scratch.keep * 1024**2, "download folders hold more than about 1 MiB each"


def test_requests_beyond_the_queue_get_a_clear_queue_full_answer_and_the_rest_are_served(
    small_mirror, tmp_path
):
    detector = tiny_detector(tmp_path)
    with running_app(small_mirror, detector, tmp_path / "scratch") as server:
        assert server.demo._queue.max_size == app.MAX_QUEUE
        release = threading.Event()
        forward = server.runtime.forward

        def held_forward(*args, **kwargs):
            release.wait(timeout=60)
            return forward(*args, **kwargs)

        server.runtime.forward = held_forward
        buffer = io.BytesIO()
        with Image.open(PHOTOS[0]) as image:
            image.convert("RGB").resize(PHOTO_SIZE).save(buffer, "JPEG")
        uploaded = httpx.post(
            f"{server.url}gradio_api/upload", files=[("files", ("photo.jpg", buffer.getvalue()))]
        ).json()[0]
        photo = {"path": uploaded, "meta": {"_type": "gradio.FileData"}}
        # MODEL_WORKERS requests run (one holds the forward, the next waits for the device), MAX_QUEUE
        # wait in the queue, and every one after them is turned away at once.
        accepted, refused = [], []
        for index in range(app.MAX_QUEUE + app.MODEL_WORKERS + 5):
            response = httpx.post(f"{server.url}gradio_api/call/features", json={"data": [photo, "0.1b"]})
            if response.status_code == 200:
                accepted.append(response.json()["event_id"])
            else:
                refused.append(response)
            if index < app.MODEL_WORKERS:
                time.sleep(1.0)  # the first requests leave the queue for the held forward
        assert len(accepted) == app.MAX_QUEUE + app.MODEL_WORKERS
        assert [response.status_code for response in refused] == [503] * 5
        assert all(f"Queue is full. Max size is {app.MAX_QUEUE}" in r.json()["detail"] for r in refused)

        with pytest.raises(QueueError, match="Queue is full! Please try again."):
            Client(server.url, verbose=False).predict(handle_file(str(PHOTOS[0])), api_name="/features")
        release.set()
        for event_id in accepted:
            stream = httpx.get(f"{server.url}gradio_api/call/features/{event_id}", timeout=120).text
            assert "event: complete" in stream and "features on a" in stream


def test_gradio_deletes_the_uploads_and_answers_it_keeps(small_mirror, tmp_path):
    """The app asks Gradio to delete its copies of uploads and answers after an hour (every half hour);
    with those periods shortened to two seconds, only the example photos are left a few seconds later."""
    cache = tmp_path / "gradio"
    with environment(GRADIO_TEMP_DIR=str(cache), SAPIENS2_CHECKPOINT_DIR=str(small_mirror)):
        demo = app.build_app(Runtime(device="cpu", dtype="fp32"), ScratchSpace(tmp_path / "scratch"))
        assert demo.delete_cache == (app.CACHE_SWEEP, app.CACHE_LIFE)
        demo.delete_cache = (2, 2)
        port = free_port()
        app.launch(demo, port=port, prevent_thread_lock=True)
        try:
            examples = files_in(cache)
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            for photo in PHOTOS:
                client.predict(handle_file(str(photo)), api_name="/segment")
            kept = files_in(cache) - examples
            assert len(kept) >= 2 * 4, kept  # per request: the upload, two pictures, two downloads
            deadline = time.monotonic() + 20
            while files_in(cache) != examples and time.monotonic() < deadline:
                time.sleep(0.5)
            assert files_in(cache) == examples
        finally:
            wait_until_idle(demo)
            demo.close()


# The clients of the load test: python tests/test_reliability_load.py URL FOLDER FIRST STOP
if __name__ == "__main__":
    url, folder, first, stop = sys.argv[1:]
    clients = Clients(url)
    clients.send(sorted(Path(folder).glob("*.jpg"))[int(first) : int(stop)])
    print(json.dumps({"outcomes": clients.outcomes, "failures": clients.failures}))
