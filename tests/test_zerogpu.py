"""The app on a ZeroGPU Space, simulated on the CPU with the real `spaces` package (tests/zerogpu_space.py).

Everything spaces does runs as it does on a Space: CUDA emulated in the web process, the start-up models
packed at launch, one worker forked per GPU call (or reused while the GPU stays idle), arguments and results
pickled through its queues, the start-up models' blocks compiled ahead of time by spaces' helpers in a long
start-up call (AOTInductor on the CPU here, with gcc). What stands in for the parts that need ZeroGPU's
hardware: the device API (tests/zerogpu_api.py, on 127.0.0.1) and spaces' two GPU functions, `init` and
`move`. Judged by outcomes (answers, processes, log lines, calls to the device API), never by timings.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from app_server import PHOTOS, Client, free_port
from bad_videos import write_video
from gradio_client import handle_file
from zerogpu_api import DeviceApi, serve

from sapiens2.serving.zerogpu import default_models

pytest.importorskip("spaces")

LAUNCHER = Path(__file__).resolve().parent / "zerogpu_space.py"
ENDPOINTS = ("/pose", "/segment", "/normals", "/depth", "/matting", "/features")
STARTUP_LINE = "models loaded at start-up"
COMPILED_LINE = "compiled ahead of time"


def decoder_helper(process: psutil.Process) -> bool:
    command = " ".join(process.cmdline())
    return "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command


class Space:
    """The simulated Space: its server process, its log and the device API it talks to."""

    def __init__(
        self,
        root: Path,
        mirror: Path,
        detector: str,
        idle: bool,
        compile_ahead: bool = True,
        crash_compile: bool = False,
    ):
        self.api = DeviceApi(idle=idle)
        self.http, api_url = serve(self.api)
        self.log_path = root / "server.log"
        self.port = free_port()
        environment = dict(
            os.environ,
            SPACES_ZERO_GPU="true",
            SPACES_ZERO_DEVICE_API_URL=api_url,
            ZEROGPU_OFFLOAD_DIR=str(root / "offload"),
            SAPIENS2_CHECKPOINT_DIR=str(mirror),
            SAPIENS2_MAX_VIDEO_FRAMES="400",
            HF_HUB_OFFLINE="1",
            YOLO_OFFLINE="1",
            GRADIO_ANALYTICS_ENABLED="False",
            SAPIENS2_ZEROGPU_AOT="1" if compile_ahead else "0",
            ZEROGPU_SPACE_CRASH_COMPILE="1" if crash_compile else "0",
        )
        command = [sys.executable, str(LAUNCHER), "--detector", detector, "--port", str(self.port)]
        with open(self.log_path, "w") as log:
            # A session of its own: closing it stops the whole group, the forked GPU workers and the image
            # decoders' forkserver included (a forked worker left running keeps the forkserver alive too).
            self.process = subprocess.Popen(
                command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        # Compiling the blocks at start-up takes minutes on a busy CPU (seconds to a minute on a GPU).
        self.client = self._connect(timeout=1200.0 if compile_ahead else 300.0)
        self.startup_pids = list(self.api.pids)  # the worker of the start-up compile, when there is one

    def _connect(self, timeout: float = 300.0) -> Client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the Space stopped at start-up:\n{self.log()}")
            try:
                return Client(f"http://127.0.0.1:{self.port}/", verbose=False, download_files=True)
            except Exception:  # not listening yet
                time.sleep(0.5)
        raise AssertionError(f"the Space did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call_pids(self) -> set[int]:
        """The workers the requests' GPU calls ran in."""
        return set(self.api.pids[len(self.startup_pids) :])

    def loads_after_startup(self) -> list[str]:
        _, _, after = self.log().partition(STARTUP_LINE)
        return [line for line in after.splitlines() if "sapiens2.models: loaded" in line]

    def workers(self) -> list[psutil.Process]:
        """The server's forked GPU workers alive now: its child processes but the image decoders' own
        (multiprocessing's forkserver, whose children decode, and its resource tracker)."""
        children = psutil.Process(self.process.pid).children()
        others = set(self.startup_pids)
        return [c for c in children if c.is_running() and not decoder_helper(c) and c.pid not in others]

    def close(self) -> None:
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)  # whatever of the group is left: forked workers, decoders
        self.process.wait(30)
        self.http.shutdown()


def clip(path: Path, frames: int) -> str:
    return str(write_video(path, frames, (96, 72), 10.0))


@pytest.fixture(scope="module")
def space(tmp_path_factory, small_mirror, few_persons_yolo):
    running = Space(tmp_path_factory.mktemp("zerogpu"), small_mirror, few_persons_yolo, idle=True)
    yield running
    running.close()


def test_every_endpoint_answers_and_the_start_up_models_are_never_loaded_again(space, tmp_path):
    startup = [line for line in space.log().splitlines() if "sapiens2.models: loaded" in line]
    assert sorted(line.split("loaded ")[1].split(" ")[0] for line in startup) == sorted(default_models())
    for endpoint in ENDPOINTS:
        outputs = space.client.predict(handle_file(str(PHOTOS[0])), api_name=endpoint)
        assert Path(outputs[0]).is_file(), endpoint
    shown = space.client.predict(handle_file(str(PHOTOS[1])), api_name="/all")
    assert all(Path(picture).is_file() for picture in shown[:5])
    walk = handle_file(clip(tmp_path / "walk.mp4", 6))
    video, summary, _ = space.client.predict(walk, api_name="/video")
    assert Path(video).is_file() and summary.startswith("6 frames")
    for _ in range(3):
        space.client.predict(handle_file(str(PHOTOS[0])), api_name="/pose")
    assert space.loads_after_startup() == []
    # One worker, forked once and reused for every call, and no other process left behind.
    assert len(space.call_pids()) == 1 and len(space.workers()) == 1
    assert not any(space.api.releases)


def test_the_start_up_compiles_the_blocks_ahead_of_time_and_every_call_runs_them(space):
    log = space.log()
    assert "compilation failed" not in log and "failed, running eager" not in log
    compiled = [line for line in log.splitlines() if COMPILED_LINE in line]
    assert len(compiled) == 1 and " 6 models " in compiled[0], compiled
    assert space.api.durations[0] == 1500 and len(space.startup_pids) == 1  # one long start-up call
    space.client.predict(handle_file(str(PHOTOS[0])), api_name="/normals")
    (worker,) = space.call_pids()
    assert f"compiled blocks loaded in process {worker}" in space.log()


def test_a_failure_in_the_worker_is_a_sentence_and_the_worker_serves_the_next_call(space):
    with pytest.raises(Exception, match="sapiens2-pose-1b"):  # not in the mirror: it fails in the worker
        space.client.predict(handle_file(str(PHOTOS[0])), "1b", api_name="/pose")
    answer = space.client.predict(handle_file(str(PHOTOS[0])), api_name="/pose")
    assert any(isinstance(output, str) and output.endswith("found.") for output in answer)
    assert len(space.workers()) == 1 and len(space.call_pids()) == 1
    assert not any(space.api.releases)  # the worker never failed: errors come back as data


def test_durations_follow_the_work(space, tmp_path):
    asked = len(space.api.durations)
    space.client.predict(handle_file(str(PHOTOS[0])), api_name="/features")
    space.client.predict(handle_file(clip(tmp_path / "short.mp4", 8)), "pose", api_name="/video")
    durations = space.api.durations[asked:]
    assert len(durations) == 3  # one call for the photo, one per batch of four frames
    assert all(15 <= seconds <= 120 for seconds in durations)


def test_a_cancelled_video_stops_within_a_batch_and_the_next_request_is_served(space, tmp_path):
    long_clip = handle_file(clip(tmp_path / "long.mp4", 400))
    job = space.client.submit(long_clip, "segment", api_name="/video")
    texts: set[str] = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = job.status()
        texts |= {unit.desc or "" for unit in (status.progress_data or [])}
        if any(text.startswith(("4 of", "8 of")) for text in texts):
            break
        time.sleep(0.05)
    assert any("running the model" in text for text in texts), texts  # said inside the worker
    calls_at_cancel = len(space.api.durations)
    job.cancel()
    answer = space.client.predict(handle_file(str(PHOTOS[0])), api_name="/segment")
    assert Path(answer[0]).is_file()
    # At most the batch running when the cancel came, then the photo: the video went no further.
    assert len(space.api.durations) - calls_at_cancel <= 2
    assert len(space.workers()) == 1


def test_a_fresh_worker_on_every_call_serves_every_endpoint(tmp_path, small_mirror, few_persons_yolo):
    # The start-up compile's worker dies of a segmentation fault (as a compiled program can on a GPU): the
    # Space starts eager, said once, and no compile's cost is paid twice in this module.
    fresh = Space(tmp_path, small_mirror, few_persons_yolo, idle=False, crash_compile=True)
    try:
        log = fresh.log()
        assert "ahead-of-time compilation failed, the models run eager" in log and COMPILED_LINE not in log
        assert len(fresh.startup_pids) == 1  # the crashed worker
        for endpoint in ("/pose", "/depth", "/all"):
            assert Path(fresh.client.predict(handle_file(str(PHOTOS[0])), api_name=endpoint)[0]).is_file()
        assert len(set(fresh.api.pids)) == len(fresh.api.durations) >= 7  # /all: five tasks, one call each
        assert fresh.loads_after_startup() == []  # each worker gets the packed models, never loads them
        deadline = time.monotonic() + 30
        while len(fresh.workers()) > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(fresh.workers()) <= 1
    finally:
        fresh.close()
