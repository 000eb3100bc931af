"""Live webcam throughput: a recorded clip streamed through the app's "Live webcam" tab in a real browser.

Headless Chromium plays the clip as its camera (a fake capture device reading a .y4m file) on the app's
page, the page streams it to the server as a user's webcam would, and the script watches both the camera
and the result picture from inside the page. Every frame of the clip carries its number as a row of black
and white squares in its top-left corner, read back from the camera and from each result picture, so
each delivered frame is matched to the moment the camera showed it. Prints the delivered frames per
second, the latency per frame (camera to result on the page: median, 90th percentile, worst), the time to
the first result, and how many results could not be matched (pictures that do not show the photo, such
as normals, are counted but have no latency).

Without `--url` it starts the app itself on CPU with tiny random checkpoints (tests/tiny_models.py) and a
detector that finds a few persons; with `--url` it measures an app already running there (for example on
a GPU with the real checkpoints).

    python bench/bench_live.py [--task pose] [--seconds 30] [--fps 15] [--model-input 1024x768]
    python bench/bench_live.py --url http://127.0.0.1:7860/ --task pose --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import cv2  # noqa: E402
import numpy as np  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
PHOTOS = (ROOT / "assets" / "grace_hopper.jpg", ROOT / "assets" / "astronaut.png")
BITS = 10  # frame numbers 0..1023; the clip's frames are numbered modulo this
CELL = 16  # side of one square of the frame number, in pixels
ORIGIN = (12, 12)  # top-left corner of the squares, inside any person box drawn along the border
START_TIMEOUT_MS = 600_000

# In the page: the camera's <video> and the result <img> are read every animation frame. The first time a
# frame number shows in the camera and the first time it shows in the result are recorded, with
# performance.now(). A number is written twice (two rows) and read only when both rows agree, after two
# reference squares (white, black) that set the threshold.
MONITOR = """
([bits, cell, ox, oy]) => {
  const log = {camera: [], result: [], resultChanges: 0, started: performance.now()};
  window.__liveBench = log;
  const canvas = document.createElement("canvas");
  const context = canvas.getContext("2d", {willReadFrequently: true});
  const decode = (width, mirrored) => {
    const level = (column, row) => {
      let x = ox + column * cell + cell / 2 - 3;
      if (mirrored) x = width - x - 6;
      const y = oy + row * cell + cell / 2 - 3;
      const data = context.getImageData(x, y, 6, 6).data;
      let sum = 0;
      for (let i = 0; i < data.length; i += 4) sum += data[i] + data[i + 1] + data[i + 2];
      return sum / (data.length / 4) / 3;
    };
    const white = level(0, 0), black = level(1, 0);
    if (white - black < 40) return null;
    const threshold = (white + black) / 2;
    const number = row => {
      let value = 0;
      for (let bit = 0; bit < bits; bit++) value = value * 2 + (level(bit + 2, row) > threshold ? 1 : 0);
      return value;
    };
    const first = number(0), second = number(1);
    return first === second ? first : null;
  };
  // Gradio's webcam sends mirrored frames by default: the number may be at the top right, reversed.
  const read = (source, width, height) => {
    if (!width || !height) return null;
    canvas.width = width; canvas.height = height;
    context.drawImage(source, 0, 0, width, height);
    const plain = decode(width, false);
    return plain !== null ? plain : decode(width, true);
  };
  let lastCamera = null, lastSource = null, lastResult = null;
  const step = () => {
    const video = [...document.querySelectorAll("video")].find(v => v.offsetParent && v.videoWidth);
    if (video) {
      const id = read(video, video.videoWidth, video.videoHeight);
      if (id !== null && id !== lastCamera) { log.camera.push([id, performance.now()]); lastCamera = id; }
    }
    const label = [...document.querySelectorAll("label, span")].find(
      node => node.offsetParent && node.textContent.trim() === "Result");
    const block = label && label.closest(".block");
    const image = block && block.querySelector("img");
    if (image && image.complete && image.naturalWidth && image.src !== lastSource) {
      lastSource = image.src;
      log.resultChanges += 1;
      const id = read(image, image.naturalWidth, image.naturalHeight);
      log.result.push([id, performance.now()]);
      lastResult = id;
    }
    requestAnimationFrame(step);
  };
  requestAnimationFrame(step);
}
"""


def stamp(frame: np.ndarray, number: int) -> np.ndarray:
    """The frame with two white/black reference squares and `number` in BITS squares, twice (two rows)."""
    x0, y0 = ORIGIN
    bits = [1, 0] + [(number >> (BITS - 1 - bit)) & 1 for bit in range(BITS)]
    for row in range(2):
        for column, bit in enumerate(bits):
            x, y = x0 + column * CELL, y0 + row * CELL
            frame[y : y + CELL, x : x + CELL] = 255 if bit else 0
    return frame


def write_clip(path: Path, seconds: float, fps: int, size: tuple[int, int], source: Path | None) -> int:
    """A numbered .y4m clip (Chromium's fake camera format) of `source` or of the example photos, panning
    slowly; returns its frame count."""
    height, width = size
    if source is not None:
        capture = cv2.VideoCapture(str(source))
        frames = []
        while len(frames) < seconds * fps:
            ok, bgr = capture.read()
            if not ok:
                break
            frames.append(cv2.resize(bgr, (width, height)))
        capture.release()
        if not frames:
            sys.exit(f"{source}: no frames could be read")
    else:
        photos = [cv2.resize(cv2.imread(str(photo)), (width, height)) for photo in PHOTOS]
        count = int(seconds * fps)
        frames = [np.roll(photos[(index // fps) % 2], 2 * index, axis=1) for index in range(count)]
    with open(path, "wb") as clip:
        clip.write(f"YUV4MPEG2 W{width} H{height} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for index, bgr in enumerate(frames):
            yuv = cv2.cvtColor(stamp(bgr.copy(), index % (1 << BITS)), cv2.COLOR_BGR2YUV_I420)
            clip.write(b"FRAME\n" + yuv.tobytes())
    return len(frames)


def start_app(folder: Path, model_input: tuple[int, int], stack: ExitStack) -> str:
    """The app on a free local port with tiny random checkpoints of every task's smallest model."""
    from app_server import running_app
    from tiny_models import repo_task_size, write_few_persons_yolo, write_tiny_checkpoint

    from sapiens2.models.kinds import get_kind
    from sapiens2.tasks.registry import TASKS
    from sapiens2.vision.processing import ProcessorSettings

    checkpoints = folder / "checkpoints"
    for task in TASKS.values():
        for repo_id in task.repo_ids_needed(next(iter(task.repos))):
            kind, size = repo_task_size(repo_id)
            image_size = model_input if kind == "pointmap" else None  # its scale head is sized for it
            write_tiny_checkpoint(checkpoints / repo_id, kind, size=size, image_size=image_size)
            padded = ProcessorSettings.for_kind(get_kind(kind)).do_pad
            settings = {"size": {"height": model_input[0], "width": model_input[1]}, "do_pad": padded}
            (checkpoints / repo_id / "preprocessor_config.json").write_text(json.dumps(settings))
    detector = write_few_persons_yolo(folder / "few_persons_yolo.pt")
    server = stack.enter_context(running_app(checkpoints, detector, folder / "scratch"))
    return server.url


def measure(url: str, clip: Path, task_title: str, seconds: float) -> dict:
    """Stream the clip through the page's live tab for `seconds`; the page's records and the start time."""
    from playwright.sync_api import sync_playwright

    args = [
        "--no-sandbox",
        "--headless",
        "--disable-gpu",
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-video-capture={clip}",
    ]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, permissions=["camera"])
        page = context.new_page()
        page.goto(url)
        page.get_by_role("tab", name="Live webcam", exact=True).click()
        page.get_by_role("radio", name=task_title, exact=True).filter(visible=True).check()
        page.get_by_text("Click to Access Webcam").filter(visible=True).click()
        page.wait_for_function(
            "() => [...document.querySelectorAll('video')].some(v => v.offsetParent && v.videoWidth)"
        )
        page.evaluate(MONITOR, [BITS, CELL, *ORIGIN])
        started = page.evaluate("() => performance.now()")
        capture = page.get_by_role("button", name="capture photo").filter(visible=True)
        capture.click()  # starts streaming
        page.wait_for_function("() => window.__liveBench.result.length > 0", timeout=START_TIMEOUT_MS)
        first = page.evaluate("() => window.__liveBench.result[0][1]")
        time.sleep(seconds)
        records = page.evaluate("() => window.__liveBench")
        capture.click()  # stops streaming
        browser.close()
    return {**records, "streaming": started, "first": first}


def report(records: dict, seconds: float) -> None:
    camera, results = records["camera"], records["result"]
    window = [(number, at) for number, at in results if at > records["first"]]
    latencies = []
    for number, at in window:
        if number is None:
            continue
        shown = [moment for id_, moment in camera if id_ == number and moment <= at]
        if shown:
            latencies.append(at - shown[-1])
    print(f"time to the first result: {(records['first'] - records['streaming']) / 1e3:.2f} s")
    print(f"delivered: {len(window)} frames in {seconds:.0f} s = {len(window) / seconds:.2f} frames/s "
          f"(camera showed {len(camera)} distinct frames in all)")  # fmt: skip
    if latencies:
        latencies.sort()
        ninety = latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))]
        median = statistics.median(latencies)
        print(f"latency per frame, camera to result on the page: median {median:.0f} ms, 90th percentile "
              f"{ninety:.0f} ms, worst {latencies[-1]:.0f} ms ({len(latencies)} matched)")  # fmt: skip
    unmatched = len(window) - len(latencies)
    if unmatched:
        print(f"{unmatched} results could not be matched to a camera frame (their picture hides the number)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an app already running (default: start one with tiny models)")
    parser.add_argument("--task", default="Pose", help="the live tab's task, by its title (default: Pose)")
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="streaming measured after the first result"
    )
    parser.add_argument("--fps", type=int, default=15, help="the clip's frame rate")
    parser.add_argument("--size", default="640x480", help="the clip's frame size, WIDTHxHEIGHT")
    parser.add_argument("--clip", type=Path, help="a video to stream instead of the panning example photos")
    parser.add_argument("--model-input", default="1024x768", help="tiny models' input HEIGHTxWIDTH (own app)")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit("bench_live.py needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)")
    width, height = (int(value) for value in args.size.lower().split("x"))
    model_input = tuple(int(value) for value in args.model_input.lower().split("x"))
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        folder = Path(folder)
        clip = folder / "clip.y4m"
        frames = write_clip(clip, max(10.0, args.seconds / 3), args.fps, (height, width), args.clip)
        url = args.url or start_app(folder, model_input, stack)
        where = args.url or f"own app, tiny checkpoints at {model_input[0]}x{model_input[1]}, CPU"
        print(f"{args.task} on {where}; clip {width}x{height}, {frames} frames at {args.fps}/s, looping")
        records = measure(url, clip, args.task, args.seconds)
    report(records, args.seconds)


if __name__ == "__main__":
    main()
