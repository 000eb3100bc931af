"""Image matting: alpha matte, cut-out on a checkerboard and a composite over a colour or an image."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sapiens2.outputs.exports import ALPHA, CUTOUT, write_alpha, write_picture, write_rgba
from sapiens2.outputs.pictures import alpha_picture, cutout_on_checkerboard
from sapiens2.outputs.results import Export, Prediction, TaskOptions, TaskResult
from sapiens2.pipelines.common import ModelInputs, forward_inputs, resize_step
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import option
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import alpha_to_uint8, composite, matting_to_image, to_hwc
from sapiens2.vision.images import LoadedImage, load_image


@dataclass(frozen=True)
class MattingOptions(TaskOptions):
    """Matting's options: what the person is composited over."""

    background_color: tuple[int, int, int] = option("Background colour", "color", "#00b140")
    background_image: Any = option(
        "Background image (replaces the colour)", "image", None, overrides="background_color"
    )


def _background(options: MattingOptions) -> tuple[int, int, int] | np.ndarray:
    """The uploaded background image when there is one, else the colour."""
    image = options.background_image
    if image is None:
        return options.background_color
    return (image if isinstance(image, LoadedImage) else load_image(image)).rgb


COMPOSITE = "_composite"


@dataclass
class MattingPrediction(Prediction):
    """The alpha matte (H, W) float32 in [0, 1] at the photo's size (`alpha`), and the person over the
    background the options chose, uint8 RGB (`composite`)."""

    alpha: np.ndarray
    composite: np.ndarray

    @property
    def grey(self) -> np.ndarray:
        """The matte as uint8 0-255, as pictures and files show it."""
        return alpha_to_uint8(self.alpha)


@dataclass
class MattingValues(ModelInputs):
    """What matting's model step leaves: the model's foreground (1, 3, h, w) and alpha (1, 1, h, w)."""

    foreground: torch.Tensor | None = None
    alpha: torch.Tensor | None = None


def _forward(context: PipelineContext, photos: Sequence[Photo[MattingValues]]) -> None:
    outputs = forward_inputs(context, photos)
    for index, photo in enumerate(photos):
        part = slice(index, index + 1)
        photo.values.foreground, photo.values.alpha = outputs.foregrounds[part], outputs.alphas[part]


def _finish(context: PipelineContext[MattingOptions], photo: Photo[MattingValues]) -> TaskResult:
    image = photo.image
    foreground, alpha = matting_to_image(
        photo.values.foreground, photo.values.alpha, image.original_size
    )
    blended = to_hwc(composite(foreground, alpha, _background(context.options))[0])
    matte = to_hwc(alpha[0, 0])
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        prediction=MattingPrediction(image.rgb, context.model_name, matte, blended),
        options=context.options,
        summary=f"Foreground: {float(matte.mean()):.0%} of the photo (mean alpha).",
    )


def draw_alpha(prediction: MattingPrediction, options: MattingOptions) -> np.ndarray:
    """The matte, white on black."""
    return alpha_picture(prediction.grey)


def draw_cutout(prediction: MattingPrediction, options: MattingOptions) -> np.ndarray:
    """The photo cut out by the matte, on a checkerboard."""
    return cutout_on_checkerboard(prediction.image, prediction.grey)


def draw_composite(prediction: MattingPrediction, options: MattingOptions) -> np.ndarray:
    """The person over the chosen background."""
    return prediction.composite


EXPORTS: tuple[Export[MattingPrediction], ...] = (
    Export(f"{ALPHA}.png", lambda found, _, *place: write_alpha(*place, ALPHA, found.grey, found.image)),
    Export(f"{CUTOUT}.png", lambda found, _, *place: write_rgba(*place, CUTOUT, found.image, found.grey)),
    Export(f"{COMPOSITE}.png", lambda found, _, *place: write_picture(*place, COMPOSITE, found.composite)),
)


PIPELINE = Pipeline((resize_step(), Step("forward", _forward, uses_model=True)), _finish, MattingValues)
