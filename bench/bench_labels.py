"""Body-part labels at the photo's size on the CPU (`segmentation_labels`) against the plain way (every class
resized, then the arg-max: `resize_maps(...).argmax(1)`), side by side, alternating, for smooth logits (a real
model's: the fast path) and noisy ones (an untrained or tiny model's: the banded path), with the pixels where
the two differ (near-ties of the last bit, where the plain resize's own order of operations decides).

    python -m bench.bench_labels [--runs 3] [--size 3000x4000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sapiens2.vision.dense import resize_maps, segmentation_labels  # noqa: E402

CLASSES = 29


def logits_of(kind: str, height: int, width: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if kind == "noisy":
        return torch.randn(1, CLASSES, height, width, generator=generator)
    coarse = torch.randn(1, CLASSES, height // 32, width // 32, generator=generator) * 4
    return F.interpolate(coarse, size=(height, width), mode="bicubic", align_corners=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="3000x4000", help="the photo, HEIGHTxWIDTH")
    args = parser.parse_args()
    size = tuple(int(side) for side in args.size.split("x"))
    print(f"labels of {CLASSES} classes at {size[1]}x{size[0]}, CPU ({torch.get_num_threads()} threads), "
          f"median of {args.runs}")  # fmt: skip
    print(f"{'logits':22s} {'plain s':>8s} {'ours s':>7s} {'ratio':>6s} {'pixels differing':>17s}")
    for kind, (height, width) in (("smooth", (1024, 768)), ("noisy", (1024, 768)), ("noisy", (256, 192))):
        logits = logits_of(kind, height, width)
        times: dict[str, list[float]] = {"plain": [], "ours": []}
        for _ in range(args.runs):
            start = time.perf_counter()
            plain = resize_maps(logits, size).argmax(1)
            times["plain"].append(time.perf_counter() - start)
            start = time.perf_counter()
            ours = segmentation_labels(logits, size)
            times["ours"].append(time.perf_counter() - start)
        before, after = (statistics.median(values) for values in times.values())
        label, differing = f"{kind} {height}x{width}", int((plain != ours).sum())
        print(f"{label:22s} {before:8.2f} {after:7.2f} {after / before:6.2f} {differing:17d}")


if __name__ == "__main__":
    main()
