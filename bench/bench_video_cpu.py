"""Video throughput: frames per second of process_video for pose and segmentation with tiny checkpoints.

Writes tiny random pose and body-part checkpoints (tests/tiny_models.py), a detector that finds 2 to 4
persons per frame and a synthetic clip of the example photos, then times process_video (decode thread,
batched model, overlay drawing, MP4 writing; the model is loaded before the clock starts). Each task runs
at the official 1024x768 model input and at 256x192, as the tests do. Prints the median of the runs.

    python bench/bench_video_cpu.py [--frames 24] [--batch-size 4] [--runs 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")

import torch  # noqa: E402
from test_video import write_clip  # noqa: E402
from tiny_models import write_few_persons_yolo, write_tiny_checkpoint  # noqa: E402

from sapiens2.batch.video import VideoJob, process_video  # noqa: E402
from sapiens2.runtime.runtime import Runtime  # noqa: E402

REPOS = {"pose": "facebook/sapiens2-pose-0.4b", "segment": "facebook/sapiens2-seg-0.4b"}
INPUT_SIZES = ((1024, 768), (256, 192))


def write_checkpoints(root: Path, size: tuple[int, int]) -> Path:
    """<root>/<repo id>/ for the tiny pose and body-part models, run at `size` (height, width)."""
    for repo_id in REPOS.values():
        write_tiny_checkpoint(root / repo_id, repo_id.split("-")[1])
        settings = {"size": {"height": size[0], "width": size[1]}, "do_pad": False}
        (root / repo_id / "preprocessor_config.json").write_text(json.dumps(settings))
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        clip = scratch / "clip.mp4"
        write_clip(clip, args.frames)
        detector = write_few_persons_yolo(scratch / "few_persons_yolo.pt")
        print(f"{args.frames} frames of 256x192, batch {args.batch_size}, {args.device}, torch threads "
              f"{torch.get_num_threads()}, median of {args.runs} runs")  # fmt: skip
        print("| model input | task | frames/s | ms per frame | persons per frame |")
        print("| --- | --- | ---: | ---: | ---: |")
        for size in INPUT_SIZES:
            os.environ["SAPIENS2_CHECKPOINT_DIR"] = str(
                write_checkpoints(scratch / f"{size[0]}x{size[1]}", size)
            )
            runtime = Runtime(device=args.device, detector=detector, batch_size=args.batch_size)
            for task in REPOS:
                process_video(runtime, VideoJob(task, clip, scratch / "warm", max_frames=args.batch_size))
                job = VideoJob(task, clip, scratch / "out")
                results = [process_video(runtime, job) for _ in range(args.runs)]
                rate = statistics.median(result.frames_per_second for result in results)
                found = results[0].persons
                persons = float("nan") if found is None else found / results[0].frames
                label = f"{size[0]}x{size[1]}"
                print(f"| {label} | {task} | {rate:.2f} | {1000 / rate:.0f} | {persons:.1f} |")
        print(f"torch threads after the detector ran: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
