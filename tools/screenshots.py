"""Regenerate docs/screenshots/: every main tab of the running app, with a result, in headless Chromium.

The real server runs with the tests' tiny random checkpoints and detector (no download, no GPU), so the
pictures show the page as it is, not real predictions. Each PNG is reduced to a 256-colour palette to keep it
small. Usage: `python tools/screenshots.py [--out docs/screenshots] [--only pose,segment]`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"]  # fmt: skip
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 300_000
PHOTO = ROOT / "assets" / "grace_hopper.jpg"
# tab title, endpoint name (the ids of its photo, run button and first picture)
TASK_TABS = [("Pose", "pose"), ("Body parts", "segment"), ("Normals", "normals"), ("Depth", "depth"),
             ("Matting", "matting"), ("Features", "features")]  # fmt: skip


def save(page, path: Path, full_page: bool = True) -> None:
    """A screenshot of the page as a palette PNG."""
    page.screenshot(path=str(path), full_page=full_page)
    with Image.open(path) as shot:
        small = shot.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"{shown}: {path.stat().st_size // 1024} KB")


def run_task(page, tab: str, name: str) -> None:
    """Open a task's tab, give it the example photo, run it and wait for its first picture."""
    page.get_by_role("tab", name=tab, exact=True).click()
    page.locator(f"#{name}-photo input[type=file]").set_input_files(str(PHOTO))
    page.locator(f"#{name}-photo img").first.wait_for()
    page.locator(f"#{name}-run").click()
    page.locator(f"#{name}-picture img").first.wait_for(timeout=WAIT_MS)
    page.locator(f"#{name}-downloads").get_by_text(PHOTO.stem).first.wait_for(timeout=WAIT_MS)


def run_all(page) -> None:
    page.get_by_role("tab", name="All tasks", exact=True).click()
    page.locator("#all-photo input[type=file]").set_input_files(str(PHOTO))
    page.locator("#all-photo img").first.wait_for()
    page.locator("#all-run").click()
    page.locator("#all-downloads").get_by_text(f"{PHOTO.stem}_composite").first.wait_for(timeout=WAIT_MS)


def run_video(page, folder: Path) -> None:
    from test_video import write_clip

    clip = folder / "walk.mp4"
    write_clip(clip, count=6)
    page.get_by_role("tab", name="Video", exact=True).click()
    page.locator("#video-clip input[type=file]").set_input_files(str(clip))
    page.locator("#video-clip video").first.wait_for(state="attached", timeout=WAIT_MS)
    page.locator("#video-run").click()
    page.get_by_text("6 frames at").wait_for(timeout=WAIT_MS)


def run_live(page) -> None:
    page.get_by_role("tab", name="Live webcam", exact=True).click()
    page.get_by_text("Click to Access Webcam").click()
    page.get_by_role("button", name="capture photo").click()  # starts streaming
    page.locator("#live-rate").get_by_text("frames per second").wait_for(timeout=WAIT_MS)


def shoot(url: str, out: Path, only: set[str], folder: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport=DESKTOP, permissions=["camera"])
        page = context.new_page()
        page.goto(url)
        page.get_by_role("heading", name="Sapiens2 Studio").wait_for()
        for tab, name in TASK_TABS:
            if not only or name in only:
                run_task(page, tab, name)
                save(page, out / f"{name}.png")
        if not only or "all" in only:
            run_all(page)
            save(page, out / "all.png")
        if not only or "video" in only:
            run_video(page, folder)
            save(page, out / "video.png")
        if not only or "live" in only:
            run_live(page)
            save(page, out / "live.png")
            page.get_by_role("button", name="capture photo").click()  # stops streaming
        context.close()
        if not only or "phone" in only:
            phone = {"viewport": PHONE, "device_scale_factor": 1, "is_mobile": True, "has_touch": True}
            context = browser.new_context(**phone)
            page = context.new_page()
            page.goto(url)
            page.get_by_role("heading", name="Sapiens2 Studio").wait_for()
            run_task(page, "Pose", "pose")
            save(page, out / "phone-pose.png", full_page=False)
            context.close()
        browser.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    names = "pose, segment, normals, depth, matting, features, all, video, live, phone"
    parser.add_argument("--only", default="", help=f"comma-separated, any of: {names}")
    args = parser.parse_args(argv)
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
    from app_server import running_app, tiny_detector
    from tiny_models import write_tiny_mirror

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sapiens2-screenshots-") as temporary:
        folder = Path(temporary)
        mirror = write_tiny_mirror(folder / "hub")
        detector = tiny_detector(folder)
        with running_app(mirror, detector, folder / "scratch") as server:
            only = {name.strip() for name in args.only.split(",") if name.strip()}
            shoot(server.url, args.out, only, folder)


if __name__ == "__main__":
    main()
