"""What the decode deadline costs a normal photo: `load_image` in the process, then in the app's workers.

Decodes each photo (the 600x512 test JPEG, a 12 MP camera-sized JPEG of noise, the same as a PNG) `--runs`
times each way and prints the median of both and their difference: the worker's round trip and the pixels
coming back (a pipe for small images, shared memory for large ones).

    python bench/bench_decode_workers.py [--runs 15]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2.vision.decode_workers import decoding_in_workers  # noqa: E402
from sapiens2.vision.images import load_image  # noqa: E402


def photos() -> dict[str, bytes]:
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (3000, 4000, 3), dtype=np.uint8))
    jpeg, png = io.BytesIO(), io.BytesIO()
    noise.save(jpeg, "JPEG", quality=90)
    noise.save(png, "PNG")
    small = (ROOT / "assets" / "grace_hopper.jpg").read_bytes()
    return {"600x512 JPEG": small, "12 MP JPEG": jpeg.getvalue(), "12 MP PNG": png.getvalue()}


def median_seconds(data: bytes, runs: int) -> float:
    load_image(data)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        load_image(data)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    samples = photos()
    here = {name: median_seconds(data, args.runs) for name, data in samples.items()}
    with decoding_in_workers() as workers:
        time.sleep(5)  # the warm workers start in the background, as they do while the app starts
        there = {name: median_seconds(data, args.runs) for name, data in samples.items()}
    assert workers.abandoned == 0
    for name in samples:
        mine, theirs = here[name] * 1000, there[name] * 1000
        print(f"{name}: {mine:.1f} ms here, {theirs:.1f} ms in a worker ({theirs - mine:+.1f} ms)")


if __name__ == "__main__":
    main()
