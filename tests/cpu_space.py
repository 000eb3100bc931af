"""The app as a CPU Space runs it: its own process inside a memory cgroup with a hard limit, driven tab by tab
through the real server over HTTP, with the cgroup's own record of the peak and of any out-of-memory kill.

Needs a writable cgroup v1 memory hierarchy (root in a container or a VM): `memory_cgroup` skips otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from app_server import ASSETS, Client, first_stream_answer, free_port
from bad_videos import write_video
from gradio_client import handle_file
from PIL import Image

CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
APP = Path(__file__).resolve().parents[1] / "app.py"
PHOTO_ENDPOINTS = ("/pose", "/segment", "/normals", "/depth", "/matting", "/features")


@contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A fresh cgroup v1 memory group limited to `limit_bytes` (swap included, when the kernel counts it),
    removed afterwards; the test is skipped where none can be made."""
    group = CGROUP_V1_MEMORY / f"sapiens2-space-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as error:
        with suppress(OSError):
            group.rmdir()
        pytest.skip(f"no writable cgroup v1 memory hierarchy here to set a memory limit in ({error})")
    with suppress(OSError):  # absent when the kernel does not account swap
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
    try:
        yield group
    finally:
        deadline = time.monotonic() + 30
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.2)
        with suppress(OSError):
            group.rmdir()


def peak_bytes(group: Path) -> int:
    """The most memory the group has held at once since it was made (pages of its files' cache included)."""
    return int((group / "memory.max_usage_in_bytes").read_text())


def oom_kills(group: Path) -> int:
    """Processes of the group the kernel killed for memory (0 when this kernel does not count them)."""
    for line in (group / "memory.oom_control").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    return 0


@dataclass
class SpaceRun:
    """What a run of the app in a memory cgroup measured."""

    first_use_seconds: dict[str, float] = field(default_factory=dict)
    answers: dict[str, list] = field(default_factory=dict)
    peak_bytes: int = 0
    oom_kills: int = 0
    log: str = ""


class CgroupApp:
    """`python app.py` on a free port, put in `group` before it runs its first line (so its decoders and every
    other child are in it too), offline, reading checkpoints from `mirror`."""

    def __init__(self, group: Path, mirror: Path, detector: str, log_path: Path, extra_env: dict[str, str]):
        self.port = free_port()
        self.log_path = log_path
        environment = dict(
            os.environ,
            SAPIENS2_CHECKPOINT_DIR=str(mirror),
            HF_HUB_OFFLINE="1",
            YOLO_OFFLINE="1",
            GRADIO_ANALYTICS_ENABLED="False",
            **extra_env,
        )
        environment.pop("SAPIENS2_CACHE_GB", None)  # the default budget is what is checked
        # Importing ultralytics in this test process set OMP_NUM_THREADS=1 (it does when the variable is
        # unset); a Space's `python app.py` imports torch first and runs its forwards on every core.
        if environment.get("OMP_NUM_THREADS") == "1":
            environment.pop("OMP_NUM_THREADS")
        procs = str(group / "cgroup.procs")

        def enter_group() -> None:
            with open(procs, "w") as file:
                file.write(str(os.getpid()))

        command = [sys.executable, str(APP), "--detector", detector, "--port", str(self.port)]
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                command,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=enter_group,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{self.port}/"
        self.client = self._connect()

    def _connect(self, timeout: float = 300.0) -> Client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the app stopped at start-up:\n{self.log()}")
            try:
                return Client(self.url, verbose=False, download_files=True)
            except Exception:  # not listening yet
                time.sleep(0.5)
        raise AssertionError(f"the app did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            self.process.wait(30)

    def live_frames(self, frame: bytes, count: int) -> list[dict]:
        """`count` webcam frames sent as the page sends them (each a join of the private stream event by its
        fn_index, over raw HTTP), with the stream's answer to each."""
        config = httpx.get(f"{self.url}config", timeout=30).json()
        index = next(
            dependency["id"]
            for dependency in config["dependencies"]
            if any(target[1] == "stream" for target in dependency["targets"])
        )
        payload = {"url": f"data:image/jpeg;base64,{base64.b64encode(frame).decode()}"}
        answers = []
        for _ in range(count):
            session = uuid.uuid4().hex
            body = {"data": [payload, "pose", []], "fn_index": index, "session_hash": session}
            httpx.post(f"{self.url}gradio_api/queue/join", json=body, timeout=30).raise_for_status()
            answers.append(first_stream_answer(self.url, session, timeout=1800))
        return answers


def twelve_megapixel_photo(folder: Path) -> Path:
    """A 4000x3000 JPEG: a test photo scaled up, with noise so that it compresses as a real one does."""
    base = Image.open(ASSETS / "grace_hopper.jpg").convert("RGB").resize((4000, 3000), Image.BILINEAR)
    pixels = np.asarray(base, dtype=np.int16) + np.random.default_rng(0).integers(-8, 9, (3000, 4000, 3))
    path = folder / "twelve_mp.jpg"
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
    return path


def drive_every_tab(
    app: CgroupApp, group: Path, folder: Path, video_frames: int, live_frames: int
) -> SpaceRun:
    """Every photo tab in turn, All tasks at 12 MP, a short video and a webcam stream, each timed at its
    first use; then the cgroup's peak and out-of-memory kills."""
    run = SpaceRun()
    photo = handle_file(str(ASSETS / "grace_hopper.jpg"))

    def timed(name: str, call) -> None:
        start = time.perf_counter()
        run.answers[name] = list(call())
        run.first_use_seconds[name] = time.perf_counter() - start
        seconds, peak = run.first_use_seconds[name], peak_bytes(group) / 1e9
        print(f"{name}: {seconds:.1f} s, peak {peak:.2f} GB", flush=True)

    for endpoint in PHOTO_ENDPOINTS:
        timed(endpoint, lambda endpoint=endpoint: app.client.predict(photo, api_name=endpoint))
    big = handle_file(str(twelve_megapixel_photo(folder)))
    timed("/all (12 MP)", lambda: app.client.predict(big, api_name="/all"))
    clip = handle_file(str(write_video(folder / "walk.mp4", video_frames, (640, 480), 10.0)))
    timed("/video", lambda: app.client.predict(clip, api_name="/video"))
    frame = (ASSETS / "grace_hopper.jpg").read_bytes()
    timed("webcam", lambda: app.live_frames(frame, live_frames))
    run.peak_bytes = peak_bytes(group)
    run.oom_kills = oom_kills(group)
    run.log = app.log()
    return run


def write_full_size_mirror(root: Path, repo_ids: list[str]) -> Path:
    """`<root>/<repo id>/` with a checkpoint at the official widths and random weights (bf16 on disk) for each
    repo id, built by the package from its presets; a repo already written is kept. Returns `root`."""
    import torch
    from safetensors.torch import save_file
    from tiny_models import randomize_constants, repo_task_size

    from sapiens2.models import presets
    from sapiens2.models.config import Sapiens2Config
    from sapiens2.models.modeling import build_model

    for repo_id in repo_ids:
        folder = root / repo_id
        if (folder / "model.safetensors").is_file():
            continue
        kind, size = repo_task_size(repo_id)
        config = presets.preset_config(size, kind)
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # built in bf16: the 1b model takes 3 GB, not 6
        try:
            model = build_model(Sapiens2Config.from_dict(config))
            randomize_constants(model, torch.Generator().manual_seed(0))
        finally:
            torch.set_default_dtype(default)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, folder / "part")
        (folder / "part").rename(folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(config))
        del model
    return root
