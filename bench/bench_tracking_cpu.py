"""Pose tracking in videos: what tracking, smoothing and running the detector every N frames cost and save.

Writes a tiny random pose checkpoint (tests/tiny_models.py) run at 256x192 (or --model-input), a real
ultralytics yolo11n built from its yaml with fixed biases (2 to 4 persons per frame) and a synthetic clip,
then times `process_video` (the function behind `sapiens2 pose clip.mp4` and /video) with each setting,
and a live-webcam-like loop (`Runtime.run` on one frame at a time, as the live tab does) without and with a
PoseTracker. The keypoint threshold is 0 so that the random model's keypoints always give a box between
detections (a real model's confident keypoints do the same). Prints the median of the runs.

    python bench/bench_tracking_cpu.py [--frames 30] [--runs 3] [--model-input 256x192]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")

import numpy as np  # noqa: E402
from test_video import read_video, write_clip  # noqa: E402
from tiny_models import write_few_persons_yolo, write_tiny_checkpoint  # noqa: E402

from sapiens2.batch.video import VideoJob, process_video  # noqa: E402
from sapiens2.pipelines.pose_tracking import PoseTracker  # noqa: E402
from sapiens2.runtime.runtime import Runtime  # noqa: E402
from sapiens2.tasks.registry import get_task  # noqa: E402
from sapiens2.vision.detector import YoloPersonDetector  # noqa: E402

REPO = "facebook/sapiens2-pose-0.4b"
SETTINGS = {
    "no tracking, detector every frame (before)": {"track": False, "smoothing": False, "detect_every": 1},
    "tracking + smoothing, detector every frame": {"detect_every": 1},
    "tracking + smoothing, detector every 5 frames (CPU default)": {"detect_every": 5},
    "tracking + smoothing, detector every 10 frames": {"detect_every": 10},
}


class TimedDetector:
    """The detector, with the calls and seconds it took."""

    def __init__(self, weights: str):
        self.detector, self.calls, self.seconds = YoloPersonDetector(weights), 0, 0.0

    def detect(self, image_rgb: np.ndarray):
        start = time.perf_counter()
        try:
            return self.detector.detect(image_rgb)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - start


def live_rate(runtime: Runtime, frames: list[np.ndarray], values: dict | None) -> float:
    """Frames per second of pose on one frame at a time; with `values`, through a PoseTracker."""
    options, video_options = get_task("pose").coerce_video_options({"threshold": 0.0, **(values or {})})
    tracker = PoseTracker({**options, **video_options}) if values is not None else None
    start = time.perf_counter()
    for frame in frames:
        given = tracker.given() if tracker else None
        result = runtime.run("pose", frame, given=given, threshold=0.0)
        if tracker:
            tracker.follow(frame, result, 1 / 15)
    return len(frames) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model-input", default="256x192", help="the pose model's input, HEIGHTxWIDTH")
    args = parser.parse_args()
    height, width = (int(side) for side in args.model_input.split("x"))
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        write_tiny_checkpoint(scratch / REPO, "pose")
        settings = {"size": {"height": height, "width": width}, "do_pad": False}
        (scratch / REPO / "preprocessor_config.json").write_text(json.dumps(settings))
        os.environ["SAPIENS2_CHECKPOINT_DIR"] = str(scratch)
        clip = scratch / "clip.mp4"
        write_clip(clip, args.frames)
        detector = TimedDetector(write_few_persons_yolo(scratch / "few_persons_yolo.pt"))
        runtime = Runtime(device="cpu", dtype="fp32", detector=detector, batch_size=4)
        process_video(runtime, VideoJob("pose", clip, scratch / "warm", max_frames=4, video_format="mp4"))
        print(f"{args.frames} frames of 256x192, model input {args.model_input}, median of {args.runs} runs")
        print("| setting | frames/s | detector runs | detector ms per frame | speed-up |")
        print("| --- | ---: | ---: | ---: | ---: |")
        # Settings take turns, run after run, so that a change in the machine's load hits them alike.
        rates = {label: [] for label in SETTINGS}
        calls = {label: [] for label in SETTINGS}
        seconds = {label: [] for label in SETTINGS}
        for _ in range(args.runs):
            for label, values in SETTINGS.items():
                detector.calls, detector.seconds = 0, 0.0
                options = {"threshold": 0.0, **values}
                job = VideoJob("pose", clip, scratch / "out", options=options, video_format="mp4")
                rates[label].append(process_video(runtime, job).frames_per_second)
                calls[label].append(detector.calls)
                seconds[label].append(detector.seconds)
        first = statistics.median(next(iter(rates.values())))
        for label in SETTINGS:
            rate = statistics.median(rates[label])
            per_frame = 1000 * statistics.median(seconds[label]) / args.frames
            runs = f"{statistics.median(calls[label]):.0f} of {args.frames}"
            print(f"| {label} | {rate:.2f} | {runs} | {per_frame:.0f} | {rate / first:.2f}x |")
        frames = read_video(clip)[0]
        live = {"plain (before)": None, "PoseTracker, detector every 5": {"detect_every": 5}}
        print("\n| live-like loop, one frame at a time | frames/s |\n| --- | ---: |")
        live_rates = {label: [] for label in live}
        for _ in range(args.runs):
            for label, values in live.items():
                live_rates[label].append(live_rate(runtime, frames, values))
        for label, found in live_rates.items():
            print(f"| {label} | {statistics.median(found):.2f} |")


if __name__ == "__main__":
    main()
