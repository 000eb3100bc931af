"""Pointmap: per-pixel 3D points at the photo's size, turbo depth picture, .npy depth and a .ply cloud."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..export import write_depth, write_point_cloud
from ..images import LoadedImage
from ..postprocess import pointmap_to_image, to_hwc
from ..results import TaskResult, Timings
from ..visualize import depth_picture
from .common import forward_photos, model_sizes, photo_results, rows
from .segment import background_masks


def _exporter(points: np.ndarray, rgb: np.ndarray, foreground: np.ndarray):
    def export(directory, stem):
        return write_depth(directory, stem, points[..., 2]) + write_point_cloud(
            directory, stem, points, rgb, foreground
        )

    return export


def run(
    runtime, task, images: Sequence[LoadedImage], repo_id: str, options: dict, progress=None
) -> list[TaskResult]:
    timings = Timings()
    outputs, settings = forward_photos(runtime, repo_id, "pointmap", images, timings, progress)
    masks = background_masks(runtime, task, images, repo_id, options, timings, progress)
    sizes = model_sizes(images)

    def make(index: int, image: LoadedImage) -> TaskResult:
        output = rows(outputs, index)
        pointmap = pointmap_to_image(
            output["pointmaps"], output.get("scales"), sizes[index], settings, image.original_size
        )
        points = np.ascontiguousarray(to_hwc(pointmap[0]))
        mask = masks[index]
        foreground = np.ones(image.original_size, dtype=bool) if mask is None else ~mask
        return TaskResult(
            task=task.name,
            model_id=repo_id,
            pictures=[("Depth", depth_picture(points[..., 2], foreground))],
            prediction=points,
            exporter=_exporter(points, image.rgb, foreground),
            summary=f"{int(foreground.sum())} foreground points.",
        )

    return photo_results(images, timings, make)
