"""Person crops (pose's top-down input, `crop_persons`) on the CPU: sampled by gathering every tap (as
before) against banded matrix products (now, for crops at half scale or more), side by side, alternating,
with their largest difference. Crops shrunk more than that gather in both, and are timed for reference.

    python -m bench.bench_crops [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sapiens2.models.kinds import POSE  # noqa: E402
from sapiens2.vision import processing  # noqa: E402

CASES = {
    # name: (photo height, width), person box (x, y, w, h)
    "webcam 640x480, one person 320x384 (enlarged)": ((480, 640), (160.0, 48.0, 320.0, 384.0)),
    "720p, a person 200x420 past the bottom edge (enlarged)": ((720, 1280), (500.0, 400.0, 200.0, 420.0)),
    "1080p, a person 500x900 (scale 0.91)": ((1080, 1920), (700.0, 100.0, 500.0, 900.0)),
    "12 MP, a person 1000x1640 (scale 0.50)": ((3000, 4000), (1000.0, 200.0, 1000.0, 1640.0)),
    "12 MP, a person 1200x2600 (scale 0.31, both gather)": ((3000, 4000), (1000.0, 200.0, 1200.0, 2600.0)),
}


def gathered(photo: np.ndarray, box: tuple, settings: processing.ProcessorSettings) -> torch.Tensor:
    """The crop sampled by gathering every tap, whatever its scale (the way before)."""
    original = processing._banded_crop
    processing._banded_crop = processing._gathered_crop
    try:
        return processing.crop_persons(photo, [box], settings)
    finally:
        processing._banded_crop = original


def now(photo: np.ndarray, box: tuple, settings: processing.ProcessorSettings) -> torch.Tensor:
    return processing.crop_persons(photo, [box], settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    settings = processing.ProcessorSettings.for_kind(POSE, (1024, 768))
    rng = np.random.default_rng(0)
    print(f"crop_persons to 1024x768, CPU ({torch.get_num_threads()} threads), median of {args.runs}")
    print(f"{'case':52s} {'before ms':>10s} {'now ms':>8s} {'ratio':>6s} {'max diff':>9s}")
    for name, (shape, box) in CASES.items():
        photo = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        times: dict = {gathered: [], now: []}
        outputs = {}
        for _ in range(args.runs + 1):  # the first of each is a warm-up
            for way in times:
                start = time.perf_counter()
                outputs[way] = way(photo, box, settings)
                times[way].append(time.perf_counter() - start)
        before, after = (1e3 * statistics.median(values[1:]) for values in times.values())
        difference = float((outputs[gathered] - outputs[now]).abs().max())
        print(f"{name:52s} {before:10.1f} {after:8.1f} {after / before:6.2f} {difference:9.2g}")


if __name__ == "__main__":
    main()
