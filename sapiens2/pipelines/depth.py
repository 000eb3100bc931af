"""Pointmap: per-pixel 3D points at the photo's size, turbo depth picture, .npy depth and a .ply cloud."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..export import write_depth, write_point_cloud, write_point_cloud_preview
from ..images import LoadedImage
from ..options import Option
from ..postprocess import pointmap_to_image, to_hwc
from ..results import TaskResult
from ..visualize import depth_picture
from .common import forward_photos, model_sizes, photo_results, row
from .context import PipelineContext
from .segment import background_masks

OPTIONS = (
    Option(
        "smooth",
        "Smooth the depth as the official demo does",
        "checkbox",
        True,
        help="A light Gaussian blur of the predicted points before they are enlarged to the photo; the "
        "picture, the point cloud and the exported .npy and .ply all show the smoothed points.",
    ),
)


def _exporter(points: np.ndarray, rgb: np.ndarray, foreground: np.ndarray):
    def export(directory, stem):
        return write_depth(directory, stem, points[..., 2]) + write_point_cloud(
            directory, stem, points, rgb, foreground
        )

    return export


def run(context: PipelineContext, images: Sequence[LoadedImage]) -> list[TaskResult]:
    outputs, settings = forward_photos(context, images)
    masks = background_masks(context, images)
    sizes = model_sizes(images)

    def make(index: int, image: LoadedImage) -> TaskResult:
        output = row(outputs, index)
        pointmap = pointmap_to_image(
            output.pointmaps,
            output.scales,
            sizes[index],
            settings,
            image.original_size,
            smooth=context.options["smooth"],
        )
        points = np.ascontiguousarray(to_hwc(pointmap[0]))
        mask = masks[index]
        foreground = np.ones(image.original_size, dtype=bool) if mask is None else ~mask
        return TaskResult(
            task=context.task.name,
            model_id=context.repo_id,
            pictures=[("Depth", depth_picture(points[..., 2], foreground))],
            prediction=points,
            exporter=_exporter(points, image.rgb, foreground),
            summary=f"{int(foreground.sum())} foreground points.",
            viewer=lambda directory, stem: write_point_cloud_preview(
                directory, stem, points, image.rgb, foreground
            ),
        )

    return photo_results(context, images, make)
