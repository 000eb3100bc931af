"""Pointmap: per-pixel 3D points at the photo's size, turbo depth picture, .npy depth and a .ply cloud."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sapiens2.outputs.exports import write_depth, write_point_cloud, write_point_cloud_preview
from sapiens2.outputs.pictures import depth_picture
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.common import forward_inputs, resize_step, row
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import Option
from sapiens2.pipelines.segment import background_masks, helper_resize_step
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import pointmap_to_image, to_hwc

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


def _forward(context: PipelineContext, photos: Sequence[Photo]) -> None:
    outputs = forward_inputs(context, photos)
    for index, (photo, mask) in enumerate(zip(photos, background_masks(context, photos), strict=True)):
        photo.values["pointmap"], photo.values["mask"] = row(outputs, index), mask


def _finish(context: PipelineContext, photo: Photo) -> TaskResult:
    image, output = photo.image, photo.values["pointmap"]
    pointmap = pointmap_to_image(
        output.pointmaps,
        output.scales,
        image.model_size,
        context.settings(),
        image.original_size,
        smooth=context.options["smooth"],
    )
    points = np.ascontiguousarray(to_hwc(pointmap[0]))
    mask = photo.values["mask"]
    foreground = np.ones(image.original_size, dtype=bool) if mask is None else ~mask
    with photo.timings.measure("pictures"):
        picture = depth_picture(points[..., 2], foreground)
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        pictures=[("Depth", picture)],
        prediction=points,
        exporter=_exporter(points, image.rgb, foreground),
        summary=f"{int(foreground.sum()):,} foreground points.",
        viewer=lambda directory, stem: write_point_cloud_preview(
            directory, stem, points, image.rgb, foreground
        ),
    )


PIPELINE = Pipeline(
    (resize_step(), helper_resize_step(), Step("forward", _forward, uses_model=True)), _finish
)
