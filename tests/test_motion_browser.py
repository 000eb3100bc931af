"""The Video tab's motion capture in a real browser (headless Chromium, Playwright, the real app server): the
animated skeletons play in the page's 3-D viewer, with the motion files among the downloads.

The tiny random checkpoints see no person, so the models are stood in for, as in test_motion.py: the
runtime's `run_batch` answers the synthetic crossing's keypoints and pointmaps (everything after the models
is the app's own code)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from test_app_browser import CHROMIUM, ERROR_TOASTS, RESULT_TIMEOUT_MS, browser, page  # noqa: F401
from test_motion import StandInRuntime, _scene, _write_video

from sapiens2.runtime.runtime import Runtime
from sapiens2.vision.limits import VIDEO_FRAMES_ENV

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
]


def test_the_video_tab_plays_the_motion(page, tmp_path, monkeypatch):  # noqa: F811
    scene = _scene()
    stand_in = StandInRuntime(scene)
    monkeypatch.setenv(VIDEO_FRAMES_ENV, "12")  # read by each request: a short run
    monkeypatch.setattr(Runtime, "prepare", lambda self, repo_id, progress=None: None)
    monkeypatch.setattr(
        Runtime, "run_batch", lambda self, task, images, **kw: stand_in.run_batch(task, images, **kw)
    )
    clip = tmp_path / "crossing.mp4"
    _write_video(clip, scene.pointmaps)
    page.get_by_role("tab", name="Video", exact=True).click()
    page.locator("#video-clip input[type=file]").set_input_files(str(clip))
    page.locator("#video-clip video").first.wait_for(state="attached", timeout=RESULT_TIMEOUT_MS)
    page.get_by_text("Video options").first.click()
    page.get_by_label("Motion capture", exact=False).locator("visible=true").check()
    page.locator("#video-run").click()
    viewer = page.locator("#video-motion canvas")
    viewer.wait_for(timeout=2 * RESULT_TIMEOUT_MS)
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()
    page.locator("#video-downloads").get_by_text("crossing_motion", exact=True).wait_for()
    listed = "".join(page.locator("#video-downloads tr").all_inner_texts()).replace("\n", "")
    for name in ("crossing_motion.glb", "crossing_motion_1.bvh", "crossing_motion_2.bvh"):  # 12 frames each
        assert name in listed, listed
    # The viewer loads the file, then plays its animation: two pictures of it a while apart differ where
    # the skeletons moved, while the first frame behind them stays put.
    page.wait_for_timeout(3000)
    pictures = []
    for name in ("first.png", "second.png"):
        viewer.screenshot(path=str(tmp_path / name))
        pictures.append(np.asarray(Image.open(tmp_path / name).convert("RGB")).astype(int))
        page.wait_for_timeout(1200)
    assert pictures[0].std(axis=(0, 1)).max() > 20, "the viewer shows the scene, not a blank canvas"
    changed = np.abs(pictures[0] - pictures[1]).max(axis=-1) > 30
    assert 0.0005 < changed.mean() < 0.5, f"{changed.mean():.4f} of the viewer changed between the pictures"
    page.screenshot(path=str(tmp_path / "video-tab.png"), full_page=True)
