"""The app in a real browser: headless Debian Chromium driven by Playwright, against a real server."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_server import PHOTOS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"]
# A synthetic camera (a moving test pattern) that needs no permission prompt.
FAKE_CAMERA_ARGS = ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]
RESULT_TIMEOUT_MS = 180_000
ERROR_TOASTS = ".toast-body.error"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
    ),
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS + FAKE_CAMERA_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, permissions=["camera"])
    page = context.new_page()
    page.goto(server.url)
    page.get_by_role("heading", name="Sapiens2 Studio").wait_for()
    yield page
    context.close()


def run_in_tab(page, tab: str, task: str, photo: Path) -> None:
    """Open a tab, upload a photo, press its run button and wait for the result picture."""
    page.get_by_role("tab", name=tab, exact=True).click()
    page.locator(f"#{task}-photo input[type=file]").set_input_files(str(photo))
    page.locator(f"#{task}-photo img").first.wait_for()
    page.locator(f"#{task}-run").click()
    page.locator(f"#{task}-picture img").first.wait_for(timeout=RESULT_TIMEOUT_MS)


@pytest.mark.parametrize(
    "tab, task, photo", [("Pose", "pose", PHOTOS[0]), ("Body parts", "segment", PHOTOS[1])]
)
def test_a_photo_uploaded_in_a_tab_gets_its_result_picture(page, tmp_path, tab, task, photo):
    run_in_tab(page, tab, task, photo)
    picture = page.locator(f"#{task}-picture img").first
    assert picture.evaluate("image => image.complete && image.naturalWidth") > 0
    page.get_by_text("cpu · fp32").first.wait_for()
    page.screenshot(path=str(tmp_path / f"{task}.png"), full_page=True)
    assert (tmp_path / f"{task}.png").stat().st_size > 0
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()


def test_running_without_a_photo_shows_an_error_sentence(page):
    page.locator("#pose-run").click()
    toast = page.locator(ERROR_TOASTS).first
    toast.wait_for(timeout=RESULT_TIMEOUT_MS)
    assert "No image was given" in toast.inner_text()


def test_every_tab_and_the_licence_note_are_shown(page):
    for title in (
        "Pose",
        "Body parts",
        "Normals",
        "Depth",
        "Matting",
        "Features",
        "All tasks",
        "Live webcam",
    ):
        page.get_by_role("tab", name=title, exact=True).wait_for()
    page.get_by_role("tab", name="Live webcam", exact=True).click()
    note = page.locator("#live-note")
    note.wait_for()
    assert "may not be used for surveillance" in note.inner_text()
    assert "track people without their consent" in note.inner_text()


def test_live_webcam_streams_frames_through_pose_and_shows_the_frame_rate(page, tmp_path):
    page.get_by_role("tab", name="Live webcam", exact=True).click()
    page.get_by_text("Click to Access Webcam").click()
    page.get_by_role("button", name="capture photo").click()  # starts streaming
    page.locator("#live-rate").get_by_text("frames per second").wait_for(timeout=RESULT_TIMEOUT_MS)
    assert "facebook/sapiens2-pose-0.4b" in page.locator("#live-rate").inner_text()
    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    page.get_by_role("button", name="capture photo").click()  # stops streaming
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()
