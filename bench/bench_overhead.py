"""Pre- plus post-processing time per task for one large photo: this package against transformers.

No model runs: each task gets random outputs of the official shapes (body-part-like smooth logits for
segmentation, Gaussian peaks for pose). Runs alternate between the two implementations so that load from
other processes hits both alike; the script prints the median wall time of each, the ratio ours /
reference, and our median CPU time (all threads), which other processes disturb less.

    python -m bench.bench_overhead [--height 3000] [--width 4000] [--runs 5] [--persons 2] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Sapiens2ImageProcessor

from sapiens2.kinds import NORMAL, SEG
from sapiens2.pose import decode_pose
from sapiens2.postprocess import (
    composite,
    matting_to_image,
    normals_to_image,
    pointmap_to_image,
    segmentation_labels,
)
from sapiens2.processing import ProcessorSettings, crop_persons, preprocess

GREEN = (0, 177, 64)


def smooth_logits(classes: int, seed: int) -> torch.Tensor:
    """(1, classes, 1024, 768) logits with large regions, like a body-part segmentation."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.randn(1, classes, 8, 6, generator=generator) * 4
    return F.interpolate(coarse, size=(1024, 768), mode="bicubic") + 0.05 * torch.randn(
        1, classes, 1024, 768, generator=generator
    )


def peaks(persons: int, keypoints: int, seed: int) -> torch.Tensor:
    """(persons, keypoints, 256, 192) heatmaps with one Gaussian peak each."""
    generator = torch.Generator().manual_seed(seed)
    centers = torch.rand(persons, keypoints, 2, 1, 1, generator=generator) * torch.tensor(
        [180.0, 240.0]
    ).view(2, 1, 1)
    ys, xs = torch.arange(256).view(-1, 1), torch.arange(192).view(1, -1)
    return torch.exp(-((xs - centers[:, :, 0]) ** 2 + (ys - centers[:, :, 1]) ** 2) / 8)


def tasks(photo: np.ndarray, persons: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Per task: (ours, reference), each doing preprocessing and post-processing of random outputs."""
    size = photo.shape[:2]
    plain, padded = ProcessorSettings.for_kind(SEG), ProcessorSettings.for_kind(NORMAL)
    reference, reference_padded = Sapiens2ImageProcessor(), Sapiens2ImageProcessor(do_pad=True)
    logits = smooth_logits(29, seed=0)
    maps = torch.randn(1, 3, 1024, 768)
    scales = torch.rand(1, 1) + 0.5
    alphas = torch.rand(1, 1, 1024, 768)
    foregrounds = alphas * torch.rand(1, 3, 1024, 768)
    height, width = size
    boxes = [[width * (0.1 + 0.4 * i), height * 0.1, width * 0.35, height * 0.8] for i in range(persons)]
    heatmaps = peaks(persons, 308, seed=1)

    def pixels(processor: Sapiens2ImageProcessor, **kwargs) -> torch.Tensor:
        return processor(photo, return_tensors="pt", **kwargs)["pixel_values"]

    def matting_ours() -> object:
        preprocess(photo, plain)
        return composite(*matting_to_image(foregrounds, alphas, size), GREEN)

    def matting_reference() -> object:
        pixels(reference)
        background = torch.tensor(GREEN, dtype=torch.uint8).view(3, 1, 1)
        outputs = SimpleNamespace(foregrounds=foregrounds, alphas=alphas)
        return reference.post_process_image_matting(outputs, target_sizes=[size], backgrounds=background)

    return {
        "seg": (
            lambda: (preprocess(photo, plain), segmentation_labels(logits, size)),
            lambda: (
                pixels(reference),
                reference.post_process_semantic_segmentation(SimpleNamespace(logits=logits), [size]),
            ),
        ),
        "normal": (
            lambda: (preprocess(photo, padded), normals_to_image(maps, size, padded)),
            lambda: (
                pixels(reference_padded),
                reference_padded.post_process_normal_estimation(SimpleNamespace(normals=maps), [size]),
            ),
        ),
        "pointmap": (
            lambda: (preprocess(photo, padded), pointmap_to_image(maps, scales, size, padded)),
            lambda: (
                pixels(reference_padded),
                reference_padded.post_process_pointmap_estimation(
                    SimpleNamespace(pointmaps=maps, scales=scales), [size]
                ),
            ),
        ),
        "matting": (matting_ours, matting_reference),
        f"pose ({persons} persons)": (
            lambda: (crop_persons(photo, boxes, plain), decode_pose(heatmaps, boxes)),
            lambda: (
                pixels(reference, boxes=[boxes]),
                reference.post_process_pose_estimation(SimpleNamespace(heatmaps=heatmaps), [boxes]),
            ),
        ),
    }


def seconds(function: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of one call."""
    start, start_cpu = time.perf_counter(), time.process_time()
    function()
    return time.perf_counter() - start, time.process_time() - start_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--width", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--persons", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    photo = np.random.default_rng(0).integers(0, 256, size=(args.height, args.width, 3), dtype=np.uint8)
    print(f"{args.width}x{args.height} photo, {torch.get_num_threads()} threads, median of {args.runs} runs")
    print(f"{'task':<18}{'ours ms':>10}{'reference ms':>15}{'ratio':>8}{'ours CPU ms':>14}")
    with torch.inference_mode():
        for name, (ours, reference) in tasks(photo, args.persons).items():
            ours()  # warm-up
            runs = [(seconds(ours), seconds(reference)) for _ in range(args.runs)]
            mine = statistics.median(wall for (wall, _), _ in runs)
            mine_cpu = statistics.median(cpu for (_, cpu), _ in runs)
            theirs = statistics.median(wall for _, (wall, _) in runs)
            row = f"{name:<18}{mine * 1000:>10.0f}{theirs * 1000:>15.0f}{mine / theirs:>8.2f}"
            print(f"{row}{mine_cpu * 1000:>14.0f}")


if __name__ == "__main__":
    main()
