"""Attacks on a public server, through the running app as any API user or page would send them.

Videos that name other files, inputs whose cost does not scale with their size, cancelled jobs that keep
working, faults in the server's own files, messages that leak the server, uploads without end. The figures
(peak memory of each request, time to answer) are printed and reported in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from app_server import PHOTOS, Client, environment, free_port, running_app, small_disk, tiny_detector
from bad_inputs import png_bytes
from bad_videos import make_bad_videos, write_video
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from peak_memory import PeakMemory, report
from PIL import Image
from test_reliability_battery import SERVER_FOLDERS, check_sentence, upload

import app
from sapiens2.batch.video import VideoJob, process_video
from sapiens2.runtime.jobs import Cancelled, Job
from sapiens2.runtime.runtime import Runtime
from sapiens2.serving import handlers
from sapiens2.serving.device_slot import DeviceSlot
from sapiens2.tasks import video_options
from sapiens2.vision.video_files import VideoError, open_capture

ROOT = Path(__file__).resolve().parents[1]
GOOD_PHOTO = PHOTOS[0]
MIB = 2**20
# A single request's memory above what the server held before it (models loaded): the stated budget.
REQUEST_BUDGET = 2 * 1024 * MIB
LARGEST_REQUEST_BUDGET = 3 * 1024 * MIB  # the stated budget at the 24-megapixel limit
HOSTILE_BUDGET = 256 * MIB  # refused inputs must cost next to nothing


class Counted:
    """Wraps Runtime.forward: counts calls, the most running at once, and can slow each call down."""

    def __init__(self, forward, delay: float = 0.0):
        self.forward, self.delay = forward, delay
        self.calls = self.running = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if self.delay:
                time.sleep(self.delay)
            return self.forward(*args, **kwargs)
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture(scope="module")
def server(small_mirror, tmp_path_factory):
    detector = tiny_detector(tmp_path_factory.mktemp("detector"))
    with running_app(small_mirror, detector, tmp_path_factory.mktemp("scratch")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def secret_video(tmp_path_factory) -> Path:
    """A real video on the server, outside the upload folder, whose frames are all magenta."""
    return write_video(tmp_path_factory.mktemp("private") / "secret.mp4", 8, (96, 64), 12.0, (255, 0, 255))


@pytest.fixture(scope="module")
def bad_videos(tmp_path_factory, secret_video):
    return make_bad_videos(tmp_path_factory.mktemp("videos"), secret_video)


def refused(client, payload, api_name: str, **options) -> str:
    with pytest.raises(AppError) as caught:
        client.predict(payload, api_name=api_name, **options)
    message = str(caught.value)
    check_sentence(message)
    return message


def still_serving(client) -> None:
    picture, summary, _, files = client.predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
    assert Path(picture).is_file() and len(files) == 2


# ---- 1. videos are only ever video files -----------------------------------------------------------------


def test_files_that_name_other_files_are_never_decoded(server, client, bad_videos, secret_video):
    forward = Counted(server.runtime.forward)
    server.runtime.forward = forward
    try:
        for name, case in bad_videos.items():
            if case.error is None:
                continue
            with PeakMemory() as memory:
                message = refused(client, handle_file(str(case.path)), "/video", task="segment")
            assert case.error in message and "MP4, MOV, WebM, MKV or AVI" in message, (name, message)
            assert memory.growth < HOSTILE_BUDGET, name
        assert forward.calls == 0, "a frame of another file went through the model"
    finally:
        server.runtime.forward = forward.forward
    report("/video with a self-referencing HLS playlist", memory)
    still_serving(client)


def test_the_content_decides_not_the_name(client, bad_videos):
    video, summary, files = client.predict(
        handle_file(str(bad_videos["really_mp4.webm"].path)), task="segment", api_name="/video"
    )
    assert summary.startswith("3 frames") and Path(video).is_file()


def test_ffmpeg_itself_refuses_playlists_and_lists_that_slip_past(bad_videos, secret_video):
    # Opened without the signature check, as a file that fooled it would be: FFmpeg's whitelists refuse.
    for name in ("hls_file_url.m3u8", "hls_relative.m3u8", "hls_absolute.m3u8", "concat.mp4"):
        with pytest.raises(VideoError, match="cannot be opened as a video"):
            open_capture(str(bad_videos[name].path), name)
    open_capture(str(secret_video), "secret.mp4").release()  # a real video still opens


def test_python_and_the_command_line_apply_the_same_rule(bad_videos, small_mirror, tmp_path):
    from test_cli import run_cli

    with environment(SAPIENS2_CHECKPOINT_DIR=str(small_mirror)):
        runtime = Runtime(device="cpu", dtype="fp32")
        with pytest.raises(VideoError, match="HLS playlist"):
            process_video(runtime, VideoJob("segment", bad_videos["hls_named_mp4.mp4"].path, tmp_path / "py"))
    status, printed = run_cli(
        "segment",
        bad_videos["hls_named_mp4.mp4"].path,
        bad_videos["concat.mp4"].path,
        "--out",
        tmp_path / "cli",
        "--checkpoint-dir",
        small_mirror,
    )
    assert status == 1 and "HLS playlist" in printed and "concat list" in printed
    assert not any(path.suffix == ".mp4" for path in (tmp_path / "cli").rglob("*"))


# ---- 2. work bounded by its cost, not the file's size ----------------------------------------------------

STRIP = "is a strip"


@pytest.mark.parametrize("api_name", ["/pose", "/segment", "/depth", "/matting", "/features", "/all"])
def test_a_strip_gets_the_same_sentence_on_every_endpoint(server, client, tmp_path, api_name):
    rows = b"".join(b"\x00" + bytes(100_000 * 3) for _ in range(32))
    path = tmp_path / "strip.png"
    path.write_bytes(png_bytes(100_000, 32, raw=rows))  # 9.5 KB
    with PeakMemory() as memory:
        message = refused(client, handle_file(str(path)), api_name)
    assert message.startswith("The image's shape is too narrow: 100000x32 pixels is a strip (3125 to 1)")
    assert "limit of 10 to 1" in message
    assert memory.growth < HOSTILE_BUDGET
    if api_name == "/segment":
        report("/segment with a 9.5 KB 100000x32 PNG", memory)


def test_a_tiny_gif_with_a_huge_canvas_is_refused_from_its_header(client, tmp_path):
    from bad_inputs import _gif_header

    path = tmp_path / "canvas.gif"
    path.write_bytes(_gif_header(16000, 5000))
    with PeakMemory() as memory:
        message = refused(client, handle_file(str(path)), "/all")
    assert "16000x5000 pixels (80.0 megapixels) is above this server's limit of 24 megapixels" in message
    report("/all with a 35-byte GIF claiming 16000x5000", memory)


def test_a_video_of_huge_frames_is_refused_before_decoding_them(client, tmp_path):
    path = write_video(tmp_path / "huge.mp4", 2, (4000, 2400), 25.0)  # 9.6 megapixels a frame
    with PeakMemory() as memory:
        message = refused(client, handle_file(str(path)), "/video", task="segment")
    assert "4000x2400 pixels (9.6 megapixels) is above this server's limit of 8.3 megapixels" in message
    report("/video with 2 frames of 4000x2400", memory)


def test_frames_are_counted_not_seconds(server, client, tmp_path):
    path = write_video(tmp_path / "fast.mp4", 40, (96, 64), 1000.0)  # 40 frames in 0.04 s
    with environment(SAPIENS2_MAX_VIDEO_FRAMES="6"):
        video, summary, _ = client.predict(handle_file(str(path)), task="segment", api_name="/video")
    assert summary.startswith("6 frames")
    assert "Only the first 6 frames of this video were processed" in summary


@pytest.mark.parametrize(
    "size, budget",
    [
        ((4000, 3000), REQUEST_BUDGET),  # 12 megapixels: a phone photo, which every tab must take
        ((6000, 4000), LARGEST_REQUEST_BUDGET),  # 24 megapixels: the largest photo the server takes
    ],
)
def test_a_normal_photo_stays_within_the_memory_budget_in_every_tab(server, tmp_path, size, budget):
    path = tmp_path / "photo.jpg"
    with Image.open(GOOD_PHOTO) as image:
        image.convert("RGB").resize(size).save(path, quality=90)
    # The files' addresses are enough here: fetching their 900 MB would take the server's CPU meanwhile.
    client = server.client(download_files=False)
    client.predict(handle_file(str(GOOD_PHOTO)), api_name="/all")  # every model loaded first
    with PeakMemory() as memory:
        *pictures, summary, _, files = client.predict(handle_file(str(path)), api_name="/all")
    report(f"/all with a {size[0] * size[1] / 1e6:.0f}-megapixel photo", memory)
    assert memory.growth < budget
    names = [file["path"] if isinstance(file, dict) else file for file in files]
    assert len([name for name in names if not name.endswith(".zip")]) == 16  # within the limit: none refused


def test_a_decode_past_its_deadline_is_abandoned_and_the_server_goes_on(server, client, tmp_path):
    noise = np.random.default_rng(0).integers(0, 256, (3000, 4000, 3), dtype=np.uint8)
    path = tmp_path / "slow.png"
    Image.fromarray(noise).save(path)  # any photo decodes slowly enough against a 0.05 s deadline
    abandoned = server.demo.decode_workers.abandoned
    with environment(SAPIENS2_DECODE_SECONDS="0.05"):
        with PeakMemory() as memory:
            message = refused(client, handle_file(str(path)), "/features")
    report("a 12 MP PNG past a 0.05 s decode deadline", memory)
    assert "took longer than this server's limit of 0.05 seconds to decode, so it was abandoned" in message
    assert server.demo.decode_workers.abandoned == abandoned + 1
    still_serving(client)


# ---- 3. one user cannot hold the model for everyone --------------------------------------------------------


@contextmanager
def slow_forward(server, delay: float) -> Iterator[Counted]:
    forward = Counted(server.runtime.forward, delay)
    server.runtime.forward = forward
    try:
        yield forward
    finally:
        server.runtime.forward = forward.forward


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_cancelled_jobs_stop_their_work_and_hold_the_model_until_they_do(server, tmp_path):
    clip = write_video(tmp_path / "long.mp4", 200, (96, 64), 25.0)  # 50 batches of 4 frames
    clients = [server.client() for _ in range(8)]
    with slow_forward(server, 0.2) as forward:
        jobs = [c.submit(handle_file(str(clip)), task="segment", api_name="/video") for c in clients]
        wait_for(lambda: forward.calls >= 2)
        at_cancel = forward.calls
        storm = [threading.Thread(target=job.cancel) for job in jobs]  # all at once: one runs, 7 wait
        for thread in storm:
            thread.start()
        for thread in storm:
            thread.join()
        time.sleep(1.0)
        calls = forward.calls
        time.sleep(1.0)
        assert forward.calls == calls, "a cancelled job is still running the model"
        assert forward.most == 1
        # Each job stops at its next batch (200 frames are 50 batches): a job that started just before its
        # cancel arrived runs one batch at most.
        assert calls <= at_cancel + len(jobs), "cancelled jobs ran on after their cancellation"
        assert all(job.status().code.name == "CANCELLED" for job in jobs)
    picture, summary, _, _ = server.client().predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
    assert Path(picture).is_file()


def test_a_cancelled_all_tasks_run_stops_between_its_tasks_and_frees_the_model(server):
    with slow_forward(server, 0.5) as forward:
        job = server.client().submit(handle_file(str(GOOD_PHOTO)), api_name="/all")
        wait_for(lambda: forward.calls >= 1)
        job.cancel()
        wait_for(job.done)
        time.sleep(1.0)
        calls = forward.calls
        time.sleep(1.0)
        assert forward.calls == calls, "a cancelled run is still running the model"
        assert calls <= 3, "the run went on to later tasks after its cancellation"
        assert not server.demo.device_slot.busy
        assert job.status().code.name == "CANCELLED"
    picture, summary, _, _ = server.client().predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
    assert Path(picture).is_file()


def test_pictures_and_files_are_written_off_the_device(server, client, monkeypatch):
    held = []
    write_picture = handlers.write_picture

    def recording(*args, **kwargs):
        held.append(server.demo.device_slot.busy)
        return write_picture(*args, **kwargs)

    monkeypatch.setattr(handlers, "write_picture", recording)
    client.predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
    assert held == [False], "the next request's model work may run while this one writes its pictures"


@pytest.mark.parametrize("api_name", ["video", "all"])
def test_closing_the_page_stops_the_work(server, tmp_path, api_name):
    session = f"closed-page-session-{api_name}"
    fn_index = next(i for i, fn in server.demo.fns.items() if fn.api_name == api_name)
    if api_name == "video":
        clip = write_video(tmp_path / "long.mp4", 200, (96, 64), 25.0)
        payload = upload(server.url, clip.read_bytes(), "long.mp4")
        defaults = [option.on_device("cpu").default for option, _ in video_options().values()]
        data = [payload, "segment", "0.4b", *defaults]  # the page sends every input, the video options too
    else:
        data = [upload(server.url, GOOD_PHOTO.read_bytes(), GOOD_PHOTO.name), "0.4b"]
    with slow_forward(server, 0.2) as forward:
        body = {"data": data, "fn_index": fn_index, "session_hash": session}
        httpx.post(f"{server.url}gradio_api/queue/join", json=body, timeout=30).raise_for_status()
        with httpx.stream(
            "GET", f"{server.url}gradio_api/queue/data", params={"session_hash": session}, timeout=30
        ) as stream:
            # The page reads its messages until the model runs (a page always reads them; what a client that
            # stops reading meets is Gradio's business), then is closed.
            for _ in stream.iter_lines():
                if forward.calls >= 1:
                    break
        # The page is gone (its stream closed): the work stops at its next check.
        time.sleep(1.5)
        calls = forward.calls
        time.sleep(1.0)
        assert forward.calls == calls and calls <= 4
    wait_for(lambda: not any(job is not None for job in server.demo._queue.active_jobs))


def test_stream_frames_take_the_device_only_between_requests():
    slot = DeviceSlot()
    frames_ran, stop = [], threading.Event()

    def stream() -> None:
        while not stop.is_set():
            with slot.frame() as granted:
                if granted:
                    frames_ran.append(time.monotonic())
                    time.sleep(0.02)  # one frame's work
            time.sleep(0.001)

    thread = threading.Thread(target=stream)
    thread.start()
    waits = []
    try:
        for _ in range(10):
            asked = time.monotonic()
            with slot.request(Job()):
                waits.append(time.monotonic() - asked)
                time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
    assert max(waits) < 1.0, "a request waited behind more than one stream frame"
    assert slot.turns["request"] == 10 and slot.turns["frame"] >= 1
    cancelled = Job()
    cancelled.cancel()
    with slot.request(Job()):
        with pytest.raises(Cancelled):
            with slot.request(cancelled):
                pass


def test_the_webcam_stream_is_not_in_the_model_queue(server):
    live = [fn for fn in server.demo.fns.values() if any(t[1] == "stream" for t in fn.targets)]
    assert live and all(fn.concurrency_id == app.LIVE_EVENTS for fn in live)
    assert {fn.concurrency_id for fn in server.demo.fns.values() if fn.api_name in ("features", "video")} == {
        app.MODEL_EVENTS
    }


# ---- 5. messages never leak the server and never show Python -------------------------------------------


@pytest.mark.parametrize(
    "api_name, options, expected",
    [
        ("/segment", {"size": ["0.4b"]}, "Option 'size' must be one of 0.4b, 0.8b, 1b, 5b, not a list."),
        ("/matting", {"background_color": "rgb(1e400,0,0)"}, "Option 'background_color' must be a colour"),
        ("/matting", {"background_color": [1, 2]}, "Option 'background_color' must be a colour"),
        ("/pose", {"threshold": "a"}, "Option 'threshold' must be a number between 0 and 1, not 'a'."),
        ("/pose", {"threshold": 10**400}, "Option 'threshold' must be a number between 0 and 1"),
        ("/pose", {"flip_test": "maybe"}, "Option 'flip_test' must be true or false, not 'maybe'."),
        ("/normals", {"remove_background": [True]}, "Option 'remove_background' must be true or false"),
    ],
)
def test_options_of_any_type_get_a_sentence_naming_the_option(client, api_name, options, expected):
    message = refused(client, handle_file(str(GOOD_PHOTO)), api_name, **options)
    assert expected in message
    assert not re.search(r"\((\w+Error)\)|could not convert|cannot convert", message)


def test_nan_and_infinity_sent_as_raw_json_get_a_sentence(server):
    photo = upload(server.url, GOOD_PHOTO.read_bytes(), "photo.jpg")
    for colour in ("[NaN, 0, 0]", "[Infinity, 0, 0]", '"rgb(nan, 0, 0)"'):
        body = f'{{"data": [{json.dumps(photo)}, "1b", {colour}, null]}}'
        response = httpx.post(
            f"{server.url}gradio_api/call/matting",
            content=body,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        if response.status_code != 200:  # the JSON parser refused the value itself
            assert response.status_code == 422 and "Traceback" not in response.text
            continue
        event_id = response.json()["event_id"]
        stream = httpx.get(f"{server.url}gradio_api/call/matting/{event_id}", timeout=60).text
        event, data = re.findall(r"^event: (\w+)\ndata: (.*)$", stream, flags=re.MULTILINE)[-1]
        assert event == "error"
        message = json.loads(data)["error"]
        check_sentence(message)
        assert "Option 'background_color' must be a colour" in message


def test_task_and_size_of_the_wrong_type_on_the_video_endpoint(client, bad_videos):
    clip = handle_file(str(bad_videos["really_mp4.webm"].path))
    assert "Option 'task' must be one of" in refused(client, clip, "/video", task=["pose"])
    assert "Option 'size' must be a model size" in refused(client, clip, "/video", task="pose", size=["1b"])


def test_checkpoint_problems_never_show_server_paths_on_the_web(server, client, small_mirror, tmp_path):
    repo = "facebook/sapiens2-seg-0.4b"
    broken = tmp_path / "checkpoints"
    (broken / repo).mkdir(parents=True)
    (broken / repo / "config.json").write_text("{ not json")
    (broken / repo / "model.safetensors").write_bytes(b"junk")
    server.runtime.cache.evict(repo)
    with environment(SAPIENS2_CHECKPOINT_DIR=str(broken)):
        message = refused(client, handle_file(str(GOOD_PHOTO)), "/segment")
        (broken / repo / "config.json").unlink()
        missing = refused(client, handle_file(str(GOOD_PHOTO)), "/segment")
    for text in (message, missing):
        assert str(broken) not in text
        assert not any(folder in text for folder in SERVER_FOLDERS)
    assert "config.json" not in message  # which of the server's files is broken stays in its log
    assert "The details were logged on the server" in message
    # What whoever runs the server can do names no folder or setting of this server, only the generic steps.
    assert f"hf download {repo} --include config.json" in missing
    still_serving(client)


# ---- 7. uploads ------------------------------------------------------------------------------------------


def test_one_client_cannot_store_without_end(small_mirror, tmp_path):
    detector = tiny_detector(tmp_path)
    with environment(SAPIENS2_UPLOAD_QUOTA_MB="3", SAPIENS2_TRUSTED_PROXIES="1"):
        with running_app(small_mirror, detector, tmp_path / "scratch") as server:
            one_mb = bytes(1_000_000)

            def send(address: str, chunked: bool = False) -> httpx.Response:
                headers = {"x-forwarded-for": f"203.0.113.9, {address}"}
                if not chunked:
                    files = [("files", ("blob.jpg", one_mb))]
                    return httpx.post(f"{server.url}gradio_api/upload", files=files, headers=headers)
                boundary = "xyz"
                body = (
                    (
                        f"--{boundary}\r\nContent-Disposition: form-data; "
                        'name="files"; filename="b.jpg"\r\n\r\n'
                    ).encode()
                    + one_mb
                    + f"\r\n--{boundary}--\r\n".encode()
                )
                headers["content-type"] = f"multipart/form-data; boundary={boundary}"
                return httpx.post(f"{server.url}gradio_api/upload", content=iter([body]), headers=headers)

            answers = [send("198.51.100.1").status_code for _ in range(2)] + [send("198.51.100.1", True)]
            assert answers[:2] == [200, 200]
            refused_answer = answers[2]
            assert refused_answer.status_code == 429
            detail = refused_answer.json()["detail"]
            assert "limit of 3 MB per person" in detail and "kept for 40 minutes" in detail
            assert send("198.51.100.2").status_code == 200  # someone else still can
    assert app.CACHE_SWEEP + app.CACHE_LIFE == 2400


def headers_only(url: str, forwarded: str, length: int) -> socket.socket:
    """An upload request that states `length` bytes and sends none, once the server has read its headers."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    connection = socket.create_connection((host, int(port)), timeout=30)
    connection.sendall(
        (
            f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: {forwarded}\r\n"
            f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {length}\r\n"
            "Expect: 100-continue\r\n\r\n"
        ).encode()
    )
    assert connection.recv(64).split(b" ")[1] in (b"100", b"429", b"503")  # the quota has seen it
    return connection


def test_the_quota_counts_bytes_that_arrived_from_real_addresses(small_mirror, tmp_path):
    detector = tiny_detector(tmp_path)
    quota = {
        "SAPIENS2_UPLOAD_QUOTA_MB": "3",
        "SAPIENS2_UPLOAD_TOTAL_MB": "10",
        "SAPIENS2_TRUSTED_PROXIES": "1",
    }
    with environment(**quota), running_app(small_mirror, detector, tmp_path / "scratch") as server:
        held = [headers_only(server.url, "198.51.100.1", 3_000_000) for _ in range(3)]
        held += [headers_only(server.url, f"203.0.113.{n}", 3_000_000) for n in range(22)]
        files = [("files", ("blob.jpg", bytes(1_000_000)))]

        def send(forwarded: str) -> int:
            headers = {"x-forwarded-for": forwarded}
            return httpx.post(f"{server.url}gradio_api/upload", files=files, headers=headers).status_code

        assert send("198.51.100.1") == 200 and send("198.51.100.9") == 200
        rotating = [send(f"192.0.2.{n}, 198.51.100.5") for n in range(4)]
        assert rotating == [200, 200, 429, 429]  # a spoofed left entry is no new client
        for connection in held:
            connection.close()


# ---- 4. faults in the server's own files ---------------------------------------------------------------


@contextmanager
def app_process(
    checkpoints: Path, tmp_path: Path, launcher: Sequence[str] = ()
) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`python app.py` in its own process (a crash there cannot take the tests with it), its URL, and the
    folder under which it makes its scratch root; `launcher`: a script that runs app.py, between them."""

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    port = free_port()
    environ = {
        **os.environ,
        "TMPDIR": str(temporary),
        "GRADIO_TEMP_DIR": str(tmp_path / "gradio"),
        "SAPIENS2_CHECKPOINT_DIR": str(checkpoints),
        "HF_HUB_OFFLINE": "1",
        "YOLO_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, *launcher, str(ROOT / "app.py"), "--device", "cpu", "--port", str(port)]
    process = subprocess.Popen(
        command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if httpx.get(f"{url}config", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the app did not start"
            time.sleep(0.3)
        yield process, url, temporary
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_servers_own_files_changing_under_it(small_mirror, tmp_path):

    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(small_mirror, checkpoints)
    weights = checkpoints / "facebook/sapiens2-pretrain-0.1b/model.safetensors"
    with app_process(checkpoints, tmp_path) as (process, url, temporary):
        client = Client(url, verbose=False)
        _, _, _, files = client.predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
        before = np.load(files[0])
        size = weights.stat().st_size
        with open(weights, "r+b") as file:  # rewritten in place, then cut short, while the model is loaded
            file.write(os.urandom(size))
            file.truncate(size // 3)
        _, _, _, files = client.predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
        assert process.poll() is None, "the server died when its checkpoint changed"
        assert np.array_equal(np.load(files[0]), before), "the loaded model changed with the file"
        (scratch,) = [path for path in temporary.iterdir() if path.name.startswith("sapiens2-")]
        shutil.rmtree(scratch)  # a temporary-file cleaner passed by
        client.predict(handle_file(str(GOOD_PHOTO)), api_name="/features")
        assert scratch.is_dir()
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output[-2000:]
    assert "terminate called" not in output
    assert not scratch.exists(), "the scratch root was left behind"


def test_ctrl_c_stops_the_server_cleanly(small_mirror, tmp_path):
    with app_process(small_mirror, tmp_path) as (process, url, temporary):
        Client(url, verbose=False).predict(handle_file(str(GOOD_PHOTO)), api_name="/segment")
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output[-2000:]
    assert "terminate called" not in output and "Traceback" not in output
    assert not [path for path in temporary.iterdir() if path.name.startswith("sapiens2-")]


@pytest.fixture
def full_disk(tmp_path) -> Iterator[Path]:
    """A 256 KiB tmpfs, really full once something writes past it (mounting needs root: skipped without)."""
    with small_disk(tmp_path / "small_disk", 256) as folder:
        yield folder


def test_a_full_disk_gets_a_sentence_and_leaves_nothing_partial(server, client, full_disk):
    scratch_root = server.scratch.root
    server.scratch.root = full_disk
    try:
        message = refused(client, handle_file(str(GOOD_PHOTO)), "/depth")
    finally:
        server.scratch.root = scratch_root
    assert (
        message == "The server's disk is full, so the results could not be written. Please try again later."
    )
    leftovers = [path for path in full_disk.rglob("*") if path.is_file()]
    assert leftovers == [], leftovers
    still_serving(client)


# ---- 8. raw routes into the app --------------------------------------------------------------------------


def join_body(size: int) -> bytes:
    """A queue join whose one string argument makes the JSON body `size` bytes long."""
    head, tail = b'{"data": ["', b'"], "fn_index": 0, "session_hash": "big"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def test_request_bodies_other_than_uploads_are_bounded(server):
    body = join_body(9_000_000)
    join = f"{server.url}gradio_api/queue/join"
    headers = {"content-type": "application/json"}
    with PeakMemory() as memory:
        declared = httpx.post(join, content=body, headers=headers, timeout=30)
        chunks = (body[start : start + 65536] for start in range(0, len(body), 65536))
        streamed = httpx.post(join, content=chunks, headers=headers, timeout=30)
    report("9 MB JSON bodies to /queue/join, with and without Content-Length", memory)
    for answer in (declared, streamed):
        assert answer.status_code == 413
        detail = answer.json()["detail"]
        check_sentence(detail)
        assert "larger than this server's limit of 8 MB for a request" in detail
    assert httpx.post(join, content=join_body(1000), headers=headers, timeout=30).status_code == 200
    # a 1080p webcam frame as the page sends it (a base64 PNG in the JSON) is within the limit
    assert httpx.post(join, content=join_body(6_000_000), headers=headers, timeout=30).status_code != 413


class Listener:
    """A local HTTP server on 127.0.0.1 that records every request it gets."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        requests = self.requests = []

        class Record(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                requests.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(png_bytes(64, 64))

            do_HEAD = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Record)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/photo.png"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def trusted_listener(monkeypatch) -> Iterator[Listener]:
    """A Listener whose host Gradio trusts as it trusts the Hub's own (no check of its address)."""
    from gradio import processing_utils

    listener = Listener()
    trusted = [*processing_utils.PUBLIC_HOSTNAME_WHITELIST, "127.0.0.1"]
    monkeypatch.setattr(processing_utils, "PUBLIC_HOSTNAME_WHITELIST", trusted)
    try:
        yield listener
    finally:
        listener.close()


def test_files_given_as_web_addresses_are_never_fetched(server, trusted_listener):
    photo = {"path": trusted_listener.url, "meta": {"_type": "gradio.FileData"}}
    body = {"data": [photo, "0.4b"], "fn_index": 0, "session_hash": "web"}
    answer = httpx.post(f"{server.url}gradio_api/call/segment", json=body, timeout=30)
    if answer.status_code == 200:  # accepted: wait for the answer, by which time Gradio fetched the file
        event_id = answer.json()["event_id"]
        httpx.get(f"{server.url}gradio_api/call/segment/{event_id}", timeout=60)
    assert trusted_listener.requests == []
    assert answer.status_code == 400
    check_sentence(answer.json()["detail"])
    assert "given as a web address" in answer.json()["detail"]


def test_the_file_route_never_fetches_web_addresses(server, trusted_listener):
    for address in (trusted_listener.url, trusted_listener.url.replace("http://", "http:/")):
        answer = httpx.get(f"{server.url}gradio_api/file={address}", timeout=30)
        assert answer.status_code == 403
        check_sentence(answer.json()["detail"])
        assert "does not fetch web addresses" in answer.json()["detail"]
    assert trusted_listener.requests == []


def test_monitoring_is_off_unless_asked_for(server):
    for page in ("monitoring", "monitoring/summary"):
        assert httpx.get(f"{server.url}{page}", timeout=30).status_code == 403


def test_answer_files_in_gradios_cache_are_not_readable_by_others(server, client):
    still_serving(client)
    cache = Path(server.demo.GRADIO_CACHE)
    answers = [path for path in cache.rglob("*") if path.is_file()]
    assert answers and cache.stat().st_mode & 0o077 == 0
    for path in answers:
        assert path.stat().st_mode & 0o077 == 0, path.name
