"""Pointmap: per-pixel 3D points at the photo's size, turbo depth picture, the camera they imply, depth as
.npy and 16-bit PNG, a .ply cloud and a .glb mesh."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sapiens2.outputs.exports import (
    DEPTH_JSON,
    DEPTH_NPY,
    DEPTH_PNG,
    MESH_GLB,
    POINTS_PLY,
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
from sapiens2.outputs.results import Export, Prediction, TaskResult
from sapiens2.pipelines.common import ModelInputs, forward_inputs, resize_step, row
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import option
from sapiens2.pipelines.segment import BackgroundOptions, background_masks, helper_resize_step
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import pointmap_to_image, to_hwc
from sapiens2.vision.intrinsics import Intrinsics, fit_intrinsics, points_in_front


@dataclass(frozen=True)
class DepthOptions(BackgroundOptions):
    """Depth's options: the background's, then the smoothing."""

    smooth: bool = option(
        "Smooth the depth as the official demo does",
        "checkbox",
        True,
        help="A light Gaussian blur of the predicted points before they are enlarged to the photo; the "
        "picture, the point cloud and the exported .npy and .ply all show the smoothed points.",
    )


# Of the per-request output limit, the most the full mesh may take (then it is decimated): a quarter, so that
# a 24 MP photo's mesh, point cloud, maps and the other tasks' files on /all stay within the limit together.
MESH_SHARE = 0.25


@dataclass
class DepthPrediction(Prediction):
    """The pointmap (H, W, 3) float32 at the photo's size, x, y, z in metres in the camera's space
    (`pointmap`); True for the person's pixels (`foreground`); the pinhole camera the points imply
    (`intrinsics`, None when too few points); the 16-bit depth PNG's metres per unit (`depth_scale`) and
    the full mesh's grid step (`mesh_step`)."""

    pointmap: np.ndarray
    foreground: np.ndarray
    intrinsics: Intrinsics | None
    depth_scale: float
    mesh_step: int

    @property
    def depth(self) -> np.ndarray:
        """z (H, W), the distance along the camera's axis."""
        return self.pointmap[..., 2]

    def document(self) -> dict:
        """The `_depth.json` document: the camera, the depth PNG's scale, the mesh's grid step."""
        return depth_document(
            model_id=self.model_id,
            image_size=self.foreground.shape,
            foreground_points=int(self.foreground.sum()),
            camera=self.intrinsics,
            depth_scale=self.depth_scale,
            mesh_step=self.mesh_step,
        )


def _camera_sentence(camera: Intrinsics | None) -> str:
    if camera is None:
        return "Too few points to fit the camera from."
    fx, fy, cx, cy = (_pixels(value) for value in (camera.fx, camera.fy, camera.cx, camera.cy))
    residual = f"fit residual {camera.residual:.2f} px"
    return f"The camera they imply: fx {fx}, fy {fy}, cx {cx}, cy {cy} px ({residual})."


def _pixels(value: float) -> str:
    """A pixel value to one decimal, without the minus sign of a value that rounds to zero ("-0.0")."""
    return f"{value:.1f}".replace("-0.0", "0.0") if abs(value) < 0.05 else f"{value:.1f}"


@dataclass
class DepthValues(ModelInputs):
    """What depth's model step leaves: the model's output for the photo (its pointmap and scale, batched by
    one) and the background mask, if asked."""

    pointmap: Any = None
    mask: np.ndarray | None = None


def _forward(context: PipelineContext, photos: Sequence[Photo[DepthValues]]) -> None:
    outputs = forward_inputs(context, photos)
    for index, (photo, mask) in enumerate(zip(photos, background_masks(context, photos), strict=True)):
        photo.values.pointmap, photo.values.mask = row(outputs, index), mask


def _finish(context: PipelineContext[DepthOptions], photo: Photo[DepthValues]) -> TaskResult:
    image, output = photo.image, photo.values.pointmap
    pointmap = pointmap_to_image(
        output.pointmaps,
        output.scales,
        image.model_size,
        context.settings(),
        image.original_size,
        smooth=context.options.smooth,
    )
    planes = pointmap[0].detach().cpu()  # x, y and z, each contiguous: the checks below read them fastest
    points = np.ascontiguousarray(to_hwc(planes))
    planes = planes.numpy()
    mask = photo.values.mask
    foreground = np.ones(image.original_size, dtype=bool) if mask is None else ~mask
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
    scale = depth_png_scale(planes[2])
    prediction = DepthPrediction(image.rgb, context.model_name, points, foreground, camera, scale, step)
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        prediction=prediction,
        options=context.options,
        summary=f"{int(foreground.sum()):,} foreground points. {_camera_sentence(camera)}",
        notes=notes,
    )


def draw(prediction: DepthPrediction, options: DepthOptions) -> np.ndarray:
    """The foreground's depth in turbo colours."""
    return depth_picture(np.ascontiguousarray(prediction.depth), prediction.foreground)


def view(prediction: DepthPrediction, directory: Path, stem: str) -> Path:
    """The mesh a 3-D viewer shows: a preview of at most 200,000 faces."""
    return write_mesh_preview(directory, stem, prediction.pointmap, prediction.image, prediction.foreground)


def _write_mesh(found: DepthPrediction, options: DepthOptions, directory: Path, stem: str) -> list[Path]:
    return write_mesh(directory, stem, found.pointmap, found.image, found.foreground, found.mesh_step)


EXPORTS: tuple[Export[DepthPrediction], ...] = (
    Export(DEPTH_NPY, lambda found, _, *place: write_depth(*place, found.depth)),
    Export(DEPTH_PNG, lambda found, _, *place: write_depth_png(*place, found.depth, found.depth_scale)),
    Export(DEPTH_JSON, lambda found, _, *place: write_json(*place, DEPTH_JSON, found.document())),
    Export(
        POINTS_PLY,
        lambda found, _, *place: write_point_cloud(*place, found.pointmap, found.image, found.foreground),
    ),
    Export(MESH_GLB, _write_mesh),
)


PIPELINE = Pipeline(
    (resize_step(), helper_resize_step(), Step("forward", _forward, uses_model=True)), _finish, DepthValues
)
