"""The Video tab on a CPU says, before a clip runs, how many of its frames fit a request's device time at
the speed measured here, and offers the command line for longer clips; its header promises no more."""

import math
import threading
from contextlib import contextmanager

import pytest
from gradio_client import handle_file

from sapiens2.serving import handlers
from sapiens2.serving.video_budget import FrameSpeeds, HoldTimer, budget_note, frames_that_fit, video_header
from sapiens2.settings import Settings
from sapiens2.tasks import TASKS
from sapiens2.vision.limits import Limits

DEFAULT_REQUEST_SECONDS = Settings().max_device_seconds
REQUEST_SECONDS_ENV = "SAPIENS2_MAX_DEVICE_SECONDS"


def page_text(server, elem_id: str) -> str:
    """The value the page is first served for the component `elem_id` (the config a browser reads)."""
    config = server.client().config
    props = [component.get("props", {}) for component in config["components"]]
    [value] = [prop["value"] for prop in props if prop.get("elem_id") == elem_id]
    return value


def test_frames_that_fit_the_budget():
    assert frames_that_fit(120, 4.0, 300) == 30
    assert frames_that_fit(120, 0.39, 300) == 300
    assert frames_that_fit(10, 3.0, 300) == 3


def test_the_last_clip_sets_the_speed_and_an_empty_run_changes_nothing():
    speeds = FrameSpeeds()
    assert speeds.seconds_per_frame("m") is None
    speeds.record("m", 12.0, 4)
    speeds.record("m", 5.0, 0)
    assert speeds.seconds_per_frame("m") == 3.0
    speeds.record("m", 2.0, 4)
    assert speeds.seconds_per_frame("m") == 0.5


def test_the_timer_counts_only_time_inside_the_hold():
    held = threading.Event()

    @contextmanager
    def hold():
        held.set()
        yield

    timer = HoldTimer(hold)
    with timer.hold():
        pass
    assert held.is_set() and 0.0 <= timer.seconds < 60.0


def test_a_gpu_header_keeps_the_frame_limit_and_a_cpu_one_names_the_budget():
    assert "the first 300 frames are processed" in video_header(False, 300, 120)
    cpu = video_header(True, 300, 120)
    assert "first 300 frames are processed" not in cpu and "120 s" in cpu


def test_the_note_says_how_many_frames_fit_and_how_to_run_more():
    speeds = FrameSpeeds()
    speeds.record("facebook/sapiens2-pose-0.4b", 40.0, 10)
    note = budget_note("Pose", "facebook/sapiens2-pose-0.4b", speeds, 120, 300, "python -m sapiens2 pose x")
    assert "About 30 frames" in note and "`python -m sapiens2 pose x`" in note


def test_a_cpu_visitor_reads_the_budget_before_a_clip_and_the_frames_that_fit_after(
    server, tmp_path, monkeypatch
):
    from test_video import write_clip

    assert server.runtime.device.type == "cpu"
    header = page_text(server, "video-header")
    most = Limits.of().video_frames
    assert f"the first {most} frames are processed" not in header
    assert f"{DEFAULT_REQUEST_SECONDS} s" in header
    first = TASKS[next(iter(TASKS))]
    note = page_text(server, "video-budget")
    assert f"python -m sapiens2 {first.name} clip.mp4 --size {first.default_size}" in note
    assert "has not run on a clip here yet" in note

    clip = tmp_path / "walk.mp4"
    write_clip(clip, count=3)
    server.client().predict(handle_file(str(clip)), task="segment", api_name="/video")
    model = TASKS["segment"].repo_id(None)
    measured = server.demo.frame_speeds.seconds_per_frame(model)
    assert measured is not None and measured > 0
    # A budget that holds a known share of the frames: the note counts them from the speed measured.
    seconds = max(1, math.ceil(measured * 2.5))
    monkeypatch.setenv(REQUEST_SECONDS_ENV, str(seconds))
    note = handlers.video_budget_note(server.runtime, server.demo.frame_speeds, "segment", None)
    fit = frames_that_fit(seconds, measured, most)
    assert fit < most and f"About {fit} frames of a clip fit" in note and f"{seconds} s per request" in note
    assert "python -m sapiens2 segment clip.mp4" in note


@pytest.mark.parametrize("task", ["pose", "matting"])
def test_every_task_and_size_gets_its_own_note(server, task):
    note = handlers.video_budget_note(server.runtime, server.demo.frame_speeds, task, None)
    assert TASKS[task].repo_id(None) in note and f"python -m sapiens2 {task} clip.mp4" in note
