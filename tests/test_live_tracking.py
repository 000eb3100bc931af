"""The live webcam follows its persons like a video does: ids kept from frame to frame and the detector run
on one frame in LIVE_DETECT_EVERY, through the handler the stream event calls (the real runtime, tiny
checkpoints and the real yolo11n; frames sent as the page sends them, base64 JPEG data URLs)."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from test_reliability_live import frame_payload
from test_video import CountingDetector, write_clip

from sapiens2.runtime.runtime import Runtime
from sapiens2.serving import handlers
from sapiens2.serving.device_slot import DeviceSlot
from sapiens2.serving.live_streams import StreamWatch

FRAMES = 11


def _jpeg(rgb) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


@pytest.fixture
def frames(tmp_path):
    return [frame_payload(_jpeg(rgb)) for rgb in write_clip(tmp_path / "walk.mp4", FRAMES)]


def test_the_live_stream_follows_its_persons_and_runs_the_detector_one_frame_in_n(
    small_mirror, few_persons_yolo, frames, monkeypatch
):
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(small_mirror))
    detector = CountingDetector(few_persons_yolo)
    runtime = Runtime(device="cpu", dtype="fp32", detector=detector)
    on_frame = handlers.live_handler(runtime, DeviceSlot(), StreamWatch("live", 4))
    state = None
    for number, payload in enumerate(frames):
        picture, line, state = on_frame(payload, "pose", state)
        rate = "frames per second" if number else "first frame, measuring the frame rate"
        assert picture.shape[2] == 3 and rate in line
    assert isinstance(state, handlers.LiveStream) and state.follower.frames == FRAMES
    # Frames 0, 5 and 10 (more only where too few keypoints were confident to draw a box from: not with
    # these fixed checkpoints and frames).
    assert detector.calls == 3
    assert state.follower.detected == detector.calls
    first = state.follower
    _, _, state = on_frame(frames[0], "segment", state)  # another task: no follower, a fresh state
    assert state.follower is None and state.task == "segment"
    _, _, state = on_frame(frames[0], "pose", state)
    assert state.follower is not first and state.follower.frames == 1
