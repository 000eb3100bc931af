"""Image matting: alpha matte, cut-out on a checkerboard and a composite over a colour or an image."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sapiens2.outputs.exports import write_matting, write_picture
from sapiens2.outputs.pictures import alpha_picture, cutout_on_checkerboard
from sapiens2.outputs.results import TaskResult
from sapiens2.pipelines.common import forward_inputs, resize_step
from sapiens2.pipelines.context import PipelineContext
from sapiens2.pipelines.options import Option
from sapiens2.pipelines.steps import Photo, Pipeline, Step
from sapiens2.vision.dense import alpha_to_uint8, composite, matting_to_image, to_hwc
from sapiens2.vision.images import LoadedImage, load_image

OPTIONS = (
    Option("background_color", "Background colour", "color", "#00b140"),
    Option(
        "background_image",
        "Background image (replaces the colour)",
        "image",
        None,
        overrides="background_color",
    ),
)


def _background(options: Mapping[str, Any]) -> tuple[int, int, int] | np.ndarray:
    """The uploaded background image when there is one, else the colour."""
    image = options["background_image"]
    if image is None:
        return options["background_color"]
    return (image if isinstance(image, LoadedImage) else load_image(image)).rgb


def _exporter(rgb: np.ndarray, alpha: np.ndarray, blended: np.ndarray):
    def export(directory, stem):
        return write_matting(directory, stem, rgb, alpha) + write_picture(
            directory, stem, "_composite", blended
        )

    return export


def _forward(context: PipelineContext, photos: Sequence[Photo]) -> None:
    outputs = forward_inputs(context, photos)
    for index, photo in enumerate(photos):
        part = slice(index, index + 1)
        photo.values["foreground"], photo.values["alpha"] = outputs.foregrounds[part], outputs.alphas[part]


def _finish(context: PipelineContext, photo: Photo) -> TaskResult:
    image = photo.image
    foreground, alpha = matting_to_image(
        photo.values["foreground"], photo.values["alpha"], image.original_size
    )
    blended = to_hwc(composite(foreground, alpha, _background(context.options))[0])
    matte = to_hwc(alpha[0, 0])
    with photo.timings.measure("pictures"):
        grey = alpha_to_uint8(matte)  # the pictures' and the files' matte, converted once
        pictures = [
            ("Alpha", alpha_picture(grey)),
            ("Cut-out", cutout_on_checkerboard(image.rgb, grey)),
            ("Composite", blended),
        ]
    return TaskResult(
        task=context.task.name,
        model_id=context.model_name,
        pictures=pictures,
        prediction=matte,
        exporter=_exporter(image.rgb, grey, blended),
        summary=f"Foreground: {float(matte.mean()):.0%} of the photo (mean alpha).",
    )


PIPELINE = Pipeline((resize_step(), Step("forward", _forward, uses_model=True)), _finish)
