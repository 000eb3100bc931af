"""Pointmap: per-pixel 3D points at the photo's size, turbo depth picture, the camera they imply, depth as
.npy and 16-bit PNG, a .ply cloud and a .glb mesh."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sapiens2.outputs.exports import (
    depth_document,
    depth_png_scale,
    write_depth,
    write_depth_png,
    write_json,
    write_mesh,
    write_mesh_preview,
    write_point_cloud,
)
from sapiens2.outputs.mesh import step_for_bytes
from sapiens2.outputs.pictures import depth_picture
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.common import forward_inputs, resize_step, row
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import Option
from sapiens2.pipelines.segment import background_masks, helper_resize_step
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import pointmap_to_image, to_hwc
from sapiens2.vision.intrinsics import Intrinsics, fit_intrinsics, points_in_front

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


# Of the per-request output limit, the most the full mesh may take (then it is decimated): a quarter, so that
# a 24 MP photo's mesh, point cloud, maps and the other tasks' files on /all stay within the limit together.
MESH_SHARE = 0.25


def _exporter(points: np.ndarray, rgb: np.ndarray, foreground: np.ndarray, document: dict):
    depth, scale = points[..., 2], document["depth_png"]["metres_per_unit"]
    step = document["mesh"]["grid_step"]

    def export(directory, stem):
        return [
            *write_depth(directory, stem, depth),
            *write_depth_png(directory, stem, depth, scale),
            *write_json(directory, stem, "_depth.json", document),
            *write_point_cloud(directory, stem, points, rgb, foreground),
            *write_mesh(directory, stem, points, rgb, foreground, step),
        ]

    return export


def _camera_sentence(camera: Intrinsics | None) -> str:
    if camera is None:
        return "Too few points to fit the camera from."
    fx, fy, cx, cy = (_pixels(value) for value in (camera.fx, camera.fy, camera.cx, camera.cy))
    residual = f"fit residual {camera.residual:.2f} px"
    return f"The camera they imply: fx {fx}, fy {fy}, cx {cx}, cy {cy} px ({residual})."


def _pixels(value: float) -> str:
    """A pixel value to one decimal, without the minus sign of a value that rounds to zero ("-0.0")."""
    return f"{value:.1f}".replace("-0.0", "0.0") if abs(value) < 0.05 else f"{value:.1f}"


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
    planes = pointmap[0].detach().cpu()  # x, y and z, each contiguous: the checks below read them fastest
    points = np.ascontiguousarray(to_hwc(planes))
    planes = planes.numpy()
    mask = photo.values["mask"]
    foreground = np.ones(image.original_size, dtype=bool) if mask is None else ~mask
    with photo.timings.measure("pictures"):
        picture = depth_picture(planes[2], foreground)
    usable = points_in_front(planes, foreground)  # checked once for the camera and the mesh
    camera = fit_intrinsics(points, usable)
    mesh_budget = MESH_SHARE * context.host.setup.max_output_mb * 1e6
    step = step_for_bytes(usable, mesh_budget)
    notes = []
    if step > 1:
        notes.append(
            f"The mesh download keeps one pixel in {step} along each row and column: at full resolution it "
            f"would take more than {mesh_budget / 1e6:.0f} MB, a quarter of this server's output limit."
        )
    document = depth_document(
        model_id=context.model_name,
        image_size=image.original_size,
        foreground_points=int(foreground.sum()),
        camera=camera,
        depth_scale=depth_png_scale(planes[2]),
        mesh_step=step,
    )
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        pictures=[("Depth", picture)],
        prediction=points,
        exporter=_exporter(points, image.rgb, foreground, document),
        summary=f"{int(foreground.sum()):,} foreground points. {_camera_sentence(camera)}",
        notes=notes,
        viewer=lambda directory, stem: write_mesh_preview(directory, stem, points, image.rgb, foreground),
    )


PIPELINE = Pipeline(
    (resize_step(), helper_resize_step(), Step("forward", _forward, uses_model=True)), _finish
)
