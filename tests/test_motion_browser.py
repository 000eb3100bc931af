"""The Video tab's motion capture in a real browser (headless Chromium, Playwright, the real app server with
the tiny checkpoints): the animated skeletons play in the page's 3-D viewer over the clip's first frame, seen
from the filming camera, with the motion files among the downloads.

The tiny random checkpoints see no person, so the models are stood in for, as in test_motion.py: the
runtime's `prepare` and `run_batch` answer the synthetic crossing's keypoints and pointmaps (everything after
the models, the server, the page and its viewer are the app's own)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from test_app_browser import CHROMIUM, ERROR_TOASTS, RESULT_TIMEOUT_MS, browser, page  # noqa: F401
from test_motion import StandInRuntime, _scene, _write_video

from sapiens2.runtime.runtime import Runtime

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
]

LOOKS = 60  # pictures of the viewer taken at most while waiting for it to draw, then to move
BACKDROP = 0.1  # the least share of the viewer the clip's first frame (nearly black) covers once drawn
MOVED = 0.0005  # the least share of the viewer that changes between two poses of the skeletons


def _picture(viewer) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(viewer.screenshot())).convert("RGB")).astype(int)


def _first_frame_drawn(picture: np.ndarray) -> bool:
    return (picture.max(axis=-1) < 40).mean() > BACKDROP


def _seen_from_the_camera(picture: np.ndarray) -> bool:
    """Whether the first frame (nearly black) fills the viewer's height with upright sides, within 2 pixels
    (the label and the buttons cover the top rows; the last row is the canvas's edge)."""
    dark = picture.max(axis=-1) < 40
    height, width = dark.shape
    rows = range(int(0.15 * height), height - 2)
    if not all(dark[row].any() for row in rows):
        return False
    lefts = [int(np.argmax(dark[row])) for row in rows]
    rights = [width - 1 - int(np.argmax(dark[row][::-1])) for row in rows]
    return max(np.ptp(lefts), np.ptp(rights)) <= 2


def test_the_video_tab_plays_the_motion(page, tmp_path, monkeypatch):  # noqa: F811
    scene = _scene()
    stand_in = StandInRuntime(scene)
    monkeypatch.setattr(Runtime, "prepare", lambda self, repo_id, progress=None: None)
    monkeypatch.setattr(
        Runtime, "run_batch", lambda self, task, images, **kw: stand_in.run_batch(task, images, **kw)
    )
    clip = tmp_path / "crossing.mp4"
    _write_video(clip, scene.pointmaps)  # 45 frames, 3 seconds
    page.get_by_role("tab", name="Video", exact=True).click()
    page.locator("#video-clip input[type=file]").set_input_files(str(clip))
    page.locator("#video-clip video").first.wait_for(state="attached", timeout=RESULT_TIMEOUT_MS)
    page.get_by_text("Video options").first.click()
    page.get_by_label("Motion capture", exact=False).locator("visible=true").check()
    page.locator("#video-run").click()
    page.locator("#video-downloads").get_by_text("crossing_motion", exact=True).wait_for(
        timeout=RESULT_TIMEOUT_MS
    )
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()
    listed = "".join(page.locator("#video-downloads tr").all_inner_texts()).replace("\n", "")
    for name in ("crossing_motion.glb", "crossing_motion_1.bvh", "crossing_motion_2.bvh"):
        assert name in listed, listed
    viewer = page.locator("#video-motion canvas")
    viewer.wait_for(timeout=RESULT_TIMEOUT_MS)

    # The viewer loads the file, then draws it: the clip's first frame behind the skeletons, once its
    # picture is in, covers much of the viewer. It starts at the filming camera: the first frame faces it
    # square on (its sides upright, where from the viewer's default place above it they slant), as near
    # as the camera, so it fills the viewer's height.
    looks = iter(range(LOOKS))
    first = _picture(viewer)
    while not (_first_frame_drawn(first) and _seen_from_the_camera(first)) and next(looks, None) is not None:
        page.wait_for_timeout(250)
        first = _picture(viewer)
    assert _first_frame_drawn(first), "the viewer never drew the clip's first frame"
    assert first.std(axis=(0, 1)).max() > 20, "the viewer shows the scene, not a blank canvas"
    assert _seen_from_the_camera(first), "the viewer does not start at the filming camera"
    # Then it plays the animation: a later picture differs where the skeletons moved, while the first frame
    # behind them stays put.
    later, changed = first, np.zeros(first.shape[:2], dtype=bool)
    while changed.mean() <= MOVED and next(looks, None) is not None:
        page.wait_for_timeout(250)
        later = _picture(viewer)
        changed = np.abs(first - later).max(axis=-1) > 30
    assert MOVED < changed.mean() < 0.05, f"{changed.mean():.4f} of the viewer changed between the pictures"
    Image.fromarray(first.astype(np.uint8)).save(tmp_path / "first.png")
    Image.fromarray(later.astype(np.uint8)).save(tmp_path / "later.png")
    page.locator("#video-motion").screenshot(path=str(tmp_path / "video-motion.png"))
