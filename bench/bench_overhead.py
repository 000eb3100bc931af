"""Time around the model per task for one large photo: preprocessing, decoding and pictures, against
transformers' processor.

No model runs: the real task pipelines (`sapiens2.tasks`) run with a stand-in model host whose forward
answers with random outputs of the official shapes (body-part-like smooth logits for segmentation, a
soft-edged matte, Gaussian peaks for pose, prepared once), so each result's own timings give
preprocessing ("model"), decoding and pictures. The reference is transformers' `Sapiens2ImageProcessor`
(preprocessing and its post_process_* on the same outputs; it draws no pictures). Runs alternate between
the two so that load from other processes hits both alike; the script prints medians, the ratio ours /
reference for preprocessing plus decoding, and our median CPU time (all threads), which other processes
disturb less.

    python -m bench.bench_overhead [--height 3000] [--width 4000] [--runs 5] [--persons 2] [--threads N]

Normals and depth run without the body-part background mask here (its cost is the segmentation task's
decoding, measured on its own row); `--with-background` adds it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from transformers import Sapiens2ImageProcessor

from sapiens2.models import modeling as models
from sapiens2.models import presets
from sapiens2.models.config import Sapiens2Config
from sapiens2.models.kinds import ModelKind
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.context import PipelineContext
from sapiens2.runtime.warm_heap import keep_freed_memory
from sapiens2.tasks import draw_result
from sapiens2.tasks.registry import TASKS
from sapiens2.vision.detector import Detections
from sapiens2.vision.images import LoadedImage, load_image
from sapiens2.vision.processing import ProcessorSettings

GREEN = (0, 177, 64)
TASK_NAMES = ("segment", "normals", "depth", "matting", "pose")


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


class RandomOutputs:
    """A model host (`sapiens2.pipelines.context.ModelHost`) whose forwards answer with prepared random
    outputs of the official shapes, and whose detector finds `persons` fixed boxes."""

    def __init__(self, photo_size: tuple[int, int], persons: int) -> None:
        maps = torch.randn(1, 3, 1024, 768)
        # A matte like a person's: opaque or clear regions with soft edges between them.
        alphas = torch.sigmoid(8 * smooth_logits(1, seed=2))
        foregrounds = alphas * torch.rand(1, 3, 1024, 768)
        self.outputs = {
            "pose": models.Sapiens2PoseEstimatorOutput(heatmaps=peaks(persons, 308, seed=1)),
            "seg": models.Sapiens2SemanticSegmenterOutput(logits=smooth_logits(29, seed=0)),
            "normal": models.Sapiens2NormalEstimatorOutput(normals=maps),
            "pointmap": models.Sapiens2PointmapEstimatorOutput(pointmaps=maps, scales=torch.rand(1, 1) + 0.5),
            "matting": models.Sapiens2ImageMattingOutput(alphas=alphas, foregrounds=foregrounds),
        }
        height, width = photo_size
        boxes = [[width * (0.1 + 0.4 * i), height * 0.1, width * 0.35, height * 0.8] for i in range(persons)]
        self.detections = Detections(np.array(boxes, np.float32), np.ones(persons, np.float32))

    def model(self, repo_id: str, progress=None) -> SimpleNamespace:
        _, kind, size = repo_id.split("/")[-1].split("-")
        return SimpleNamespace(kind=kind, config=Sapiens2Config.from_dict(presets.preset_config(size, kind)))

    def config(self, repo_id: str) -> Sapiens2Config:
        return self.model(repo_id).config

    def settings(self, repo_id: str, kind: ModelKind) -> ProcessorSettings:
        return ProcessorSettings.for_kind(kind)

    def forward(self, model: SimpleNamespace, pixel_values: torch.Tensor, **kwargs) -> object:
        return self.outputs[model.kind]

    def detect(self, image: LoadedImage) -> Detections:
        return self.detections


def ours(host: RandomOutputs, photo: LoadedImage, task: str, background: bool) -> Callable[[], TaskResult]:
    entry = TASKS[task]
    options = {"remove_background": background} if entry.helper_option else {}
    repo_id = entry.repo_id("1b" if task == "matting" else "0.4b")

    def run() -> TaskResult:
        context = PipelineContext(host, entry, repo_id, entry.checked_options(options))
        return draw_result(entry.run(context, [photo])[0])

    return run


def reference(host: RandomOutputs, photo: np.ndarray, task: str) -> Callable[[], object]:
    """transformers' preprocessing and post-processing of the same outputs."""
    size = photo.shape[:2]
    plain, padded = Sapiens2ImageProcessor(), Sapiens2ImageProcessor(do_pad=True)
    outputs = host.outputs
    boxes = host.detections.boxes_xywh.tolist()

    def run() -> object:
        if task == "segment":
            plain(photo, return_tensors="pt")
            return plain.post_process_semantic_segmentation(outputs["seg"], [size])
        if task == "normals":
            padded(photo, return_tensors="pt")
            return padded.post_process_normal_estimation(outputs["normal"], [size])
        if task == "depth":
            padded(photo, return_tensors="pt")
            return padded.post_process_pointmap_estimation(outputs["pointmap"], [size])
        if task == "matting":
            plain(photo, return_tensors="pt")
            background = torch.tensor(GREEN, dtype=torch.uint8).view(3, 1, 1)
            return plain.post_process_image_matting(
                outputs["matting"], target_sizes=[size], backgrounds=background
            )
        plain(photo, boxes=[boxes], return_tensors="pt")
        return plain.post_process_pose_estimation(outputs["pose"], [boxes])

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=3000)
    parser.add_argument("--width", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--persons", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--with-background", action="store_true", help="normals and depth masked by body parts"
    )
    parser.add_argument(
        "--warm-heap", action="store_true", help="keep freed memory warm, as SAPIENS2_WARM_HEAP=1 does"
    )
    args = parser.parse_args()
    if args.warm_heap:
        os.environ["SAPIENS2_WARM_HEAP"] = "1"
        keep_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    pixels = np.random.default_rng(0).integers(0, 256, size=(args.height, args.width, 3), dtype=np.uint8)
    photo = load_image(pixels)
    host = RandomOutputs((args.height, args.width), args.persons)
    print(f"{args.width}x{args.height} photo, {torch.get_num_threads()} threads, median of {args.runs} runs, "
          f"{args.persons} persons for pose; ms")  # fmt: skip
    header = ("task", "pre", "decode", "pictures", "ours total", "ours CPU", "reference", "ratio")
    print("".join(f"{name:>11}" for name in header))
    with torch.inference_mode():
        for task in TASK_NAMES:
            mine, theirs = ours(host, photo, task, args.with_background), reference(host, pixels, task)
            mine()  # warm-up
            stages, cpu, wall = [], [], []
            for _ in range(args.runs):
                start = time.process_time()
                timings = mine().timings
                cpu.append(time.process_time() - start)
                stages.append((timings.model, timings.decode, timings.pictures))
                start = time.perf_counter()
                theirs()
                wall.append(time.perf_counter() - start)
            pre, decode, pictures = (1e3 * statistics.median(column) for column in zip(*stages, strict=True))
            reference_ms = 1e3 * statistics.median(wall)
            figures = (
                pre,
                decode,
                pictures,
                pre + decode + pictures,
                1e3 * statistics.median(cpu),
                reference_ms,
            )
            row = "".join(f"{value:>11.0f}" for value in figures)
            print(f"{task:>11}{row}{(pre + decode) / reference_ms:>11.2f}")


if __name__ == "__main__":
    main()
