"""The app in a real browser: headless Debian Chromium driven by Playwright, against a real server."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from app_server import PHOTOS, running_app, tiny_detector
from PIL import Image
from test_part_masks import renamed_checkpoint

from sapiens2.pipelines import depth

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


def test_pose_keypoint_files_can_be_chosen_in_the_tab_and_the_controlnet_picture_is_shown(page):
    page.get_by_role("tab", name="Pose", exact=True).click()
    page.get_by_label("coco17").check()
    page.get_by_label("openpose").check()
    run_in_tab(page, "Pose", "pose", PHOTOS[0])
    controlnet = page.locator("#pose-picture-2 img").first
    controlnet.wait_for(timeout=RESULT_TIMEOUT_MS)
    assert controlnet.evaluate("image => image.complete && image.naturalWidth") > 0
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()


def sphere_before_a_wall(size) -> torch.Tensor:
    """A pointmap (1, 3, H, W): a ball of 0.6 m radius 2.5 m away, before a wall 4 m away, through a camera
    whose focal length is the photo's width."""
    height, width = size
    rows, columns = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    rays = torch.stack([(columns - width / 2) / width, (rows - height / 2) / width, torch.ones_like(rows)])
    centre, radius = torch.tensor([0.0, 0.0, 2.5]).view(3, 1, 1), 0.6
    along, squared = (rays * centre).sum(0), (rays * rays).sum(0)
    discriminant = along**2 - squared * (centre.square().sum() - radius**2)
    ball = (along - discriminant.clamp(min=0).sqrt()) / squared
    depth = torch.where(discriminant > 0, ball, torch.full_like(ball, 4.0))
    return (rays * depth)[None].float()


def test_the_depth_tab_shows_the_mesh_of_a_12_megapixel_photo(page, tmp_path, monkeypatch):
    # The tiny checkpoint's random weights predict noise: the model still runs, and a known scene takes the
    # place of its points, so that the viewer has a shape to show.
    monkeypatch.setattr(depth, "pointmap_to_image", lambda *args, **kwargs: sphere_before_a_wall(args[4]))
    photo = tmp_path / "twelve_megapixels.jpg"
    Image.open(PHOTOS[1]).convert("RGB").resize((4000, 3000)).save(photo, quality=90)
    page.get_by_role("tab", name="Depth", exact=True).click()
    page.get_by_label("Remove background (body-part model)").locator("visible=true").uncheck()
    run_in_tab(page, "Depth", "depth", photo)
    viewer = page.locator("#depth-viewer canvas")
    viewer.wait_for(timeout=RESULT_TIMEOUT_MS)
    page.wait_for_timeout(3000)  # the viewer loads the file and draws its first frames
    viewer.screenshot(path=str(tmp_path / "mesh.png"))
    page.screenshot(path=str(tmp_path / "depth-tab.png"), full_page=True)
    shown = np.asarray(Image.open(tmp_path / "mesh.png").convert("RGB")).astype(int)
    assert shown.std(axis=(0, 1)).max() > 20, "the viewer shows a coloured shape, not a blank canvas"
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()
    page.locator("#depth-downloads").get_by_text("twelve_megapixels_mesh", exact=True).wait_for()
    listed = "".join(page.locator("#depth-downloads tr").all_inner_texts()).replace("\n", "")
    for suffix in ("_mesh.glb", "_depth.json", "_depth_16bit.png", "_points.ply"):
        assert f"twelve_megapixels{suffix}" in listed, listed


def test_body_parts_are_chosen_in_the_tab_and_their_mask_and_cutout_are_shown(page, tmp_path):
    page.get_by_role("tab", name="Body parts", exact=True).click()
    parts = page.locator("#option-parts")
    parts.locator(".token", has_text="whole person").locator(".token-remove").click()
    parts.locator("input").first.fill("Hair")
    page.get_by_role("option", name="Hair", exact=True).click()
    parts.locator("input").first.fill("face")
    page.get_by_role("option", name="face", exact=True).click()
    page.keyboard.press("Escape")
    page.get_by_label("number input for Feather the mask's edge, pixels").fill("4")
    run_in_tab(page, "Body parts", "segment", PHOTOS[1])
    for picture in ("#segment-picture-3", "#segment-picture-4"):
        image = page.locator(f"{picture} img").first
        image.wait_for(timeout=RESULT_TIMEOUT_MS)
        assert image.evaluate("image => image.complete && image.naturalWidth") > 0, picture
    page.get_by_text("Mask of face, Hair:").wait_for()
    page.locator("#segment-downloads").get_by_text("astronaut_parts_cutout").wait_for()
    page.screenshot(path=str(tmp_path / "segment_parts.png"), full_page=True)
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()


def test_a_local_fine_tuned_body_part_model_lists_its_own_classes(browser, tiny_mirror, tmp_path):
    folder = renamed_checkpoint(tiny_mirror, tmp_path / "renamed")
    local = {"segment": {"renamed": str(folder)}}
    (tmp_path / "detector").mkdir()
    detector = tiny_detector(tmp_path / "detector")
    with running_app(tiny_mirror, detector, tmp_path / "scratch", local=local) as app:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.goto(app.url)
        page.get_by_role("tab", name="Body parts", exact=True).click()
        page.locator("input[aria-label='Model size']:visible").click()
        page.get_by_role("option", name="renamed", exact=True).click()
        page.get_by_text("A local fine-tuned model.").wait_for()
        page.locator("#option-parts input").first.click()
        page.get_by_role("option", name="part_28", exact=True).wait_for()
        assert page.get_by_role("option", name="Face_Neck", exact=True).count() == 0
        assert page.get_by_role("option", name="whole person", exact=True).count() == 1
        page.screenshot(path=str(tmp_path / "segment_local.png"), full_page=True)
        context.close()


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
    assert "no tracking of people without their consent" in note.inner_text()
    licence = page.get_by_text("may not be used for surveillance").locator("visible=true")
    assert licence.count() == 1 and "track people without their consent" in licence.inner_text()


def test_live_webcam_streams_frames_through_pose_and_shows_the_frame_rate(page, tmp_path):
    page.get_by_role("tab", name="Live webcam", exact=True).click()
    page.get_by_text("Click to Access Webcam").click()
    page.get_by_role("button", name="capture photo").click()  # starts streaming
    page.locator("#live-rate").get_by_text("frames per second").wait_for(timeout=RESULT_TIMEOUT_MS)
    assert "facebook/sapiens2-pose-0.4b" in page.locator("#live-rate").inner_text()
    page.wait_for_timeout(1000)  # more frames: the line stays readable while the stream runs
    opacity = page.locator("#live-rate .prose").first.evaluate(
        "node => { let seen = 1; for (let n = node; n; n = n.parentElement) "
        "seen *= +getComputedStyle(n).opacity; for (const n of node.querySelectorAll('*')) "
        "seen = Math.min(seen, +getComputedStyle(n).opacity); return seen; }"
    )
    assert opacity == 1, "the frame rate is not greyed out while the stream runs"
    page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    page.get_by_role("button", name="capture photo").click()  # stops streaming
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()


def test_all_tasks_reads_at_1440_pixels_wide(browser, server):
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.goto(server.url)
    page.get_by_role("tab", name="All tasks", exact=True).click()
    page.locator("#all-photo input[type=file]").set_input_files(str(PHOTOS[0]))
    page.locator("#all-photo img").first.wait_for()
    page.locator("#all-run").click()
    for task in ("pose", "segment", "normals", "depth", "matting"):
        picture = page.locator(f"#all-{task} img").first
        picture.wait_for(timeout=RESULT_TIMEOUT_MS)
        assert picture.bounding_box()["width"] >= 250, task
    size = "node => parseFloat(getComputedStyle(node).fontSize)"
    body = page.get_by_text("One photo through pose", exact=False).evaluate(size)
    for title in ("Pose", "Body parts", "Normals", "Depth", "Matting"):
        caption = page.locator("#component-0").page.get_by_role("heading", name=title, exact=True).last
        assert caption.evaluate(size) >= body, f"{title}: captions read at body-text size or larger"
    downloads = page.locator("#all-downloads")
    downloads.get_by_text("grace_hopper_composite").wait_for()
    rows = downloads.locator("tr")
    assert rows.count() == 17  # the zip of them all; pose: JSON and ControlNet picture; 14 of the others
    listed = downloads.evaluate("node => [node.scrollHeight, node.clientHeight]")
    assert listed[0] <= listed[1] + 1, "every download is in view, none behind a scroll bar"
    for index in range(rows.count()):
        assert rows.nth(index).is_visible()
    context.close()


def test_all_tasks_tiles_show_their_own_progress_and_each_picture_when_its_task_is_done(
    page, server, tmp_path, monkeypatch
):
    """While depth's task runs (held back here until the page is read), the tasks before it show their
    pictures, depth's tile its own stage and the matting tile that it waits; no tile shows another's."""
    depth_ran, go_on = threading.Event(), threading.Event()
    run = server.runtime.run

    def held_at_depth(task, *args, **kwargs):
        result = run(task, *args, **kwargs)
        if task == "depth":
            depth_ran.set()
            go_on.wait(RESULT_TIMEOUT_MS / 1000)
        return result

    monkeypatch.setattr(server.runtime, "run", held_at_depth)
    page.get_by_role("tab", name="All tasks", exact=True).click()
    page.locator("#all-photo input[type=file]").set_input_files(str(PHOTOS[0]))
    page.locator("#all-photo img").first.wait_for()
    page.locator("#all-run").click()
    try:
        assert depth_ran.wait(RESULT_TIMEOUT_MS / 1000)
        for task in ("pose", "segment", "normals"):
            page.locator(f"#all-{task} img").first.wait_for(timeout=RESULT_TIMEOUT_MS)
        label = "[data-testid=block-label]"
        page.locator(f"#all-depth {label}").get_by_text("%").wait_for()
        depth, matting = (page.locator(f"#all-{task} {label}").inner_text() for task in ("depth", "matting"))
        assert depth != matting and "waiting" in matting.lower() and "%" in depth, (depth, matting)
        assert page.locator("#all-depth img, #all-matting img").count() == 0
        for task in ("pose", "segment", "normals"):
            shown = page.locator(f"#all-{task}").inner_text()
            assert "Segmentation" not in shown and "running" not in shown, (task, shown)
        page.screenshot(path=str(tmp_path / "all-mid-run.png"), full_page=True)
    finally:
        go_on.set()
    page.locator("#all-downloads").get_by_text("grace_hopper_composite").first.wait_for(
        timeout=RESULT_TIMEOUT_MS
    )
    for task in ("pose", "segment", "normals", "depth", "matting"):
        page.locator(f"#all-{task} img").first.wait_for()
        assert page.locator(f"#all-{task} [data-testid=block-label]").locator("visible=true").count() == 0
    page.screenshot(path=str(tmp_path / "all-done.png"), full_page=True)
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()


def test_the_first_run_error_keeps_its_instructions_on_the_page(page, tmp_path, monkeypatch):
    monkeypatch.setenv("SAPIENS2_CHECKPOINT_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    page.locator("#pose-photo input[type=file]").set_input_files(str(PHOTOS[1]))
    page.locator("#pose-photo img").first.wait_for()
    page.get_by_label("Model size").first.click()
    page.get_by_role("option", name="1b").click()
    page.locator("#pose-run").click()
    toast = page.locator(ERROR_TOASTS).first
    toast.wait_for(timeout=RESULT_TIMEOUT_MS)
    text = " ".join(toast.inner_text().split())
    repo = "facebook/sapiens2-pose-1b"
    assert f"hf download {repo} --include config.json" in text
    assert "--checkpoint-dir checkpoints (or SAPIENS2_CHECKPOINT_DIR=checkpoints)" in text
    assert text.endswith("and HF_HUB_OFFLINE=1.")
    assert str(tmp_path) not in text


def test_downloads_have_no_remove_buttons_and_unchecked_boxes_are_outlined(page):
    run_in_tab(page, "Pose", "pose", PHOTOS[1])
    downloads = page.locator("#pose-downloads")
    downloads.locator("[aria-label$='_pose.json']").first.wait_for(timeout=RESULT_TIMEOUT_MS)
    assert downloads.locator("[aria-label$='_controlnet.png']").count() == 1  # a list of several files
    assert downloads.get_by_role("button", name="Remove this file").locator("visible=true").count() == 0
    flip = page.get_by_label("Flip test", exact=False).first
    assert not flip.is_checked()
    border = flip.evaluate(
        "box => [getComputedStyle(box).borderTopWidth, getComputedStyle(box).borderTopColor]"
    )
    width, colour = float(border[0].removesuffix("px")), border[1]
    channels = [int(value) for value in colour[colour.index("(") + 1 : colour.index(")")].split(",")[:3]]
    # Before: 1px of neutral-100 (243, 244, 246) on a near-white panel; now 2px of neutral-400.
    assert width >= 2 and max(channels) <= 180, border


def test_all_tasks_tiles_have_one_caption_each_and_the_live_tab_shows_the_licence_once(page):
    page.get_by_role("tab", name="All tasks", exact=True).click()
    for title in ("Pose", "Body parts", "Normals", "Depth", "Matting"):
        tile = page.locator("#all-" + {"Body parts": "segment"}.get(title, title.lower()))
        assert page.get_by_role("heading", name=title, exact=True).locator("visible=true").count() == 1
        assert tile.get_by_text(title, exact=True).locator("visible=true").count() == 0  # no second caption
        assert tile.locator("[data-testid=block-label]").locator("visible=true").count() == 0
    page.get_by_role("tab", name="Live webcam", exact=True).click()
    page.locator("#live-note").wait_for()
    assert page.get_by_role("link", name="Sapiens2 licence").locator("visible=true").count() == 1


def test_an_mp4v_clip_the_browser_cannot_preview_raises_no_error_and_runs(page, tmp_path):
    """Chromium cannot play MPEG-4 Part 2 (mp4v, OpenCV's default): Gradio's clip preview used to raise a red
    "Video not playable" toast although the clip runs fine."""
    from test_video import write_clip

    clip = tmp_path / "walk.mp4"
    write_clip(clip, count=3)
    page.get_by_role("tab", name="Video", exact=True).click()
    page.locator("#video-clip input[type=file]").set_input_files(str(clip))
    page.locator("#video-clip video").first.wait_for(state="attached", timeout=RESULT_TIMEOUT_MS)
    page.wait_for_timeout(2000)  # the preview tries to load the clip
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()
    page.locator("#video-run").click()
    page.get_by_text("3 frames at").wait_for(timeout=RESULT_TIMEOUT_MS)
    assert page.locator(ERROR_TOASTS).count() == 0, page.locator(ERROR_TOASTS).all_inner_texts()


PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}


def test_on_a_phone_every_tab_is_in_sight_and_the_result_comes_into_view(browser, server, tmp_path):
    context = browser.new_context(**PHONE)
    page = context.new_page()
    page.goto(server.url)
    page.get_by_role("heading", name="Sapiens2 Studio").wait_for()
    tabs = page.get_by_role("tab")
    # The heading can be drawn before the tab strip: wait for its last tab, then count.
    page.get_by_role("tab", name="Live webcam", exact=True).wait_for(state="attached")
    assert tabs.count() == 9 and all(tabs.nth(index).is_visible() for index in range(9))
    assert page.get_by_role("button", name="More tabs").count() == 0, "no tab hidden behind '…'"
    page.screenshot(path=str(tmp_path / "phone-tabs.png"))
    page.get_by_role("tab", name="Normals", exact=True).click()
    page.locator("#normals-photo input[type=file]").set_input_files(str(PHOTOS[1]))
    page.locator("#normals-photo img").first.wait_for()
    page.locator("#normals-run").click()
    page.locator("#normals-picture img").first.wait_for(timeout=RESULT_TIMEOUT_MS)
    page.wait_for_function(
        "() => { const top = document.querySelector('#normals-picture').getBoundingClientRect().top;"
        " return top >= 0 && top <= window.innerHeight / 4; }",
        timeout=RESULT_TIMEOUT_MS,
    )
    page.screenshot(path=str(tmp_path / "phone-result.png"))
    rows = page.locator("#normals-downloads td.filename")
    rows.first.wait_for()
    for index in range(rows.count()):
        name = rows.nth(index).get_attribute("aria-label")
        stem = rows.nth(index).locator(".stem")
        assert stem.evaluate("node => node.scrollWidth <= node.clientWidth + 1"), f"{name} is cut short"
        cell, text = rows.nth(index).bounding_box(), stem.bounding_box()
        bottom = cell["y"] + cell["height"] + 1
        assert text["y"] >= cell["y"] - 1 and text["y"] + text["height"] <= bottom, f"{name} is cut"
        assert rows.nth(index).evaluate("node => node.scrollHeight <= node.clientHeight + 1"), name
        assert rows.nth(index).inner_text().replace(" ", "").replace("\n", "") == name
    context.close()


def test_a_full_mask_is_tinted_on_the_page_not_white_on_white(page, tmp_path):
    run_in_tab(page, "Body parts", "segment", PHOTOS[0])
    page.get_by_text("of the photo.").wait_for()
    shown = page.locator("#segment-picture-3 img").first
    shown.wait_for()
    shown.scroll_into_view_if_needed()
    shot = tmp_path / "mask.png"
    shown.screenshot(path=str(shot))
    source = shown.get_attribute("src")
    with Image.open(Path(source.split("file=", 1)[1])) as mask:
        grey = np.asarray(mask.convert("L"))
    height, width = grey.shape
    assert (grey[height // 4 : -height // 4, width // 4 : -width // 4] == 255).all(), "a full mask here"
    with Image.open(shot) as seen:  # the middle of the element: the picture, whatever its letterboxing
        pixels = np.asarray(seen.convert("RGB")).astype(int)
    rows, columns = pixels.shape[:2]
    inside = pixels[rows // 3 : -rows // 3, columns // 3 : -columns // 3].reshape(-1, 3)
    assert (inside.min(axis=1) < 235).mean() > 0.95, "full mask pixels are not white on the page"
    assert (inside[:, 2] - inside[:, 0] > 40).mean() > 0.95, "they are tinted (indigo)"


def test_pose_draws_one_progress_bar_while_it_runs(page, server, monkeypatch):
    ran, go_on = threading.Event(), threading.Event()
    run = server.runtime.run

    def held(task, *args, **kwargs):
        result = run(task, *args, **kwargs)
        ran.set()
        go_on.wait(RESULT_TIMEOUT_MS / 1000)
        return result

    monkeypatch.setattr(server.runtime, "run", held)
    page.locator("#pose-photo input[type=file]").set_input_files(str(PHOTOS[0]))
    page.locator("#pose-photo img").first.wait_for()
    page.locator("#pose-run").click()
    try:
        assert ran.wait(RESULT_TIMEOUT_MS / 1000)
        page.locator(".progress-text").first.wait_for()
        assert page.locator(".progress-text").locator("visible=true").count() == 1
        assert page.locator(".eta-bar").locator("visible=true").count() <= 1
    finally:
        go_on.set()
    page.locator("#pose-picture img").first.wait_for(timeout=RESULT_TIMEOUT_MS)


def test_the_colour_picker_is_off_while_a_background_picture_wins(page, tmp_path):
    page.get_by_role("tab", name="Matting", exact=True).click()
    colour = page.get_by_role("button", name="Background colour")
    assert colour.is_enabled()
    label = page.get_by_text("Background image (replaces the colour)")
    field = label.locator("xpath=ancestor::*[contains(@class, 'block')][1]")
    field.locator("input[type=file]").set_input_files(str(PHOTOS[1]))
    page.wait_for_function(
        "() => document.querySelector('button[aria-label=\"Background colour\"]').disabled", timeout=60_000
    )
    page.screenshot(path=str(tmp_path / "matting-background.png"))
