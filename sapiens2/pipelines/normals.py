"""Surface normals: unit normals at the photo's size, shown as RGB, background removed by body parts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sapiens2.outputs.exports import NORMALS_NPY, NORMALS_PNG, write_normals, write_normals_png
from sapiens2.outputs.pictures import normals_picture
from sapiens2.outputs.results import Export, Prediction, TaskResult
from sapiens2.pipelines.common import ModelInputs, forward_inputs, resize_step
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.segment import BackgroundOptions, background_masks, helper_resize_step
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import normals_to_image, to_hwc, unit_vectors_


@dataclass
class NormalsValues(ModelInputs):
    """What normals' model step leaves: the model's normals (1, 3, h, w) and the background mask, if asked."""

    normals: torch.Tensor | None = None
    mask: np.ndarray | None = None


def _forward(context: PipelineContext, photos: Sequence[Photo[NormalsValues]]) -> None:
    normals = forward_inputs(context, photos).normals
    for index, (photo, mask) in enumerate(zip(photos, background_masks(context, photos), strict=True)):
        photo.values.normals, photo.values.mask = normals[index : index + 1], mask


@dataclass
class NormalsPrediction(Prediction):
    """Unit normals (H, W, 3) float32 at the photo's size, x right, y down, z away (`normals`); True where
    the body-part model saw background (`background`, None when it was not asked)."""

    normals: np.ndarray
    background: np.ndarray | None = None


def _finish(context: PipelineContext, photo: Photo[NormalsValues]) -> TaskResult:
    image, settings = photo.image, context.settings()
    # The reference normalizes before resizing, so interpolated pixels fall short of unit length;
    # normalizing again keeps its directions and makes every exported normal a unit vector.
    resized = normals_to_image(photo.values.normals, image.model_size, settings, image.original_size)
    unit = unit_vectors_(to_hwc(resized[0]))
    background = photo.values.mask
    shown = unit.shape[0] * unit.shape[1] - (0 if background is None else int(background.sum()))
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        prediction=NormalsPrediction(image.rgb, context.model_name, unit, background),
        options=context.options,
        summary=f"Surface normals of {shown:,} {'pixels' if background is None else 'person pixels'}. "
        + SIXTEEN_BIT_HINT,
    )


def draw(prediction: NormalsPrediction, options: BackgroundOptions) -> np.ndarray:
    """The normals as colours, the background (when removed) left out."""
    return normals_picture(prediction.normals, prediction.background)


EXPORTS: tuple[Export[NormalsPrediction], ...] = (
    Export(NORMALS_NPY, lambda found, _, *place: write_normals(*place, found.normals)),
    Export(NORMALS_PNG, lambda found, _, *place: write_normals_png(*place, found.normals)),
)


# Pillow opens a 16-bit RGB PNG as 8 bits per channel, silently: the download says how to keep its 16 bits.
SIXTEEN_BIT_HINT = (
    "_normals_16bit.png keeps 16 bits per channel (n = value / 65535 x 2 - 1): read it with "
    "cv2.imread(path, cv2.IMREAD_UNCHANGED)[..., ::-1] (OpenCV gives BGR) or imageio, not Pillow (8 bits)."
)


PIPELINE = Pipeline(
    (resize_step(), helper_resize_step(), Step("forward", _forward, uses_model=True)), _finish, NormalsValues
)
